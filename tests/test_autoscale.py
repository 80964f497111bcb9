"""Autoscaling: `processes = "MIN..MAX"` and `idle_timeout` in workers.toml; a group grows
under a backlog of queued jobs or on-demand requests, shrinks back one idle process at a time,
never takes a busy one, and does not flap under a steady load at its boundary."""

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import time
from itertools import pairwise

import psycopg
import pytest

from fairsched.config import load_config
from fairsched.errors import ConfigError
from fairsched.store.queue import Queue
from fairsched.supervisor.states import ProcessState

HEAD = """
[supervisor]
state_dir = "state"

[[worker]]
name = "pdf"
types = ["pdf"]
handler = "handlers:render_pdf"
"""


def load(tmp_path, keys: str):
    path = tmp_path / "workers.toml"
    path.write_text(textwrap.dedent(HEAD) + textwrap.dedent(keys))
    return load_config(path).workers[0]


def test_a_range_of_processes_and_its_idle_timeout_are_read(tmp_path):
    pdf = load(tmp_path, 'processes = "2..8"\nidle_timeout = 30\n')
    assert (pdf.processes, pdf.max_processes, pdf.idle_timeout) == (2, 8, 30.0)
    assert pdf.autoscaled and pdf.process_range == (2, 8)
    pdf = load(tmp_path, 'processes = " 1 .. 1 "\n')  # MIN = MAX: a range all the same
    assert pdf.process_range == (1, 1) and pdf.idle_timeout == 60.0  # the default
    fixed = load(tmp_path, "processes = 3\n")
    assert not fixed.autoscaled and fixed.process_range == (3, 3)


@pytest.mark.parametrize("keys, message", [
    ('processes = "1-8"', "key 'processes' must be an integer or a range such as \"1..8\" "
                          "(MIN..MAX), got '1-8'"),
    ('processes = "..4"', "key 'processes' must be an integer or a range such as \"1..8\""),
    ('processes = "0..4"', "key 'processes' must start at 1 or more (MIN..MAX: MIN processes "
                           "always run), got '0..4'"),
    ('processes = "5..2"', "key 'processes' must not end below its start (MIN..MAX, "
                           "MIN <= MAX), got '5..2'"),
    ('processes = "1..1001"', "key 'processes' must end at 1000 at most, got '1..1001'"),
    ('processes = "1.5..4"', "key 'processes' must be an integer or a range"),
    ('processes = "1..4"\nidle_timeout = 0', "key 'idle_timeout' must be > 0, got 0.0"),
    ('processes = "1..4"\nidle_timeout = "1m"', "key 'idle_timeout' must be a number"),
    ("processes = 2\nidle_timeout = 5", "key 'idle_timeout' applies only to an autoscaled "
                                        "group: set processes to a range such as \"1..8\" or "
                                        "remove it"),
    ("idle_timeout = 5", "key 'idle_timeout' applies only to an autoscaled group"),
])
def test_a_bad_range_or_idle_timeout_is_one_line_naming_the_key(tmp_path, keys, message):
    with pytest.raises(ConfigError) as failed:
        load(tmp_path, keys + "\n")
    assert f"[[worker]] 'pdf' {message}" in str(failed.value)
    assert "\n" not in str(failed.value)


def autoscaled(low: int, high: int, idle_timeout: float, handler: str = "slow") -> str:
    return f"""
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:{handler}"
processes = "{low}..{high}"
idle_timeout = {idle_timeout}
"""


def running(a, group: str = "pdf") -> list[str]:
    return [p.name for p in a.procs if p.group == group and p.state is ProcessState.RUNNING]


def test_a_backlog_of_queued_jobs_grows_the_group_to_max_and_idleness_shrinks_it_back(actor):
    async def scenario(a):
        assert [p.name for p in a.procs] == ["pdf-1"]
        assert a.ps()["supervisor"]["groups"]["pdf"] == {
            "processes": 1, "min": 1, "max": 4, "autoscaled": True}
        began = time.monotonic()
        for _ in range(16):
            await a.enqueue("pdf", {"seconds": 1})
        await a.until(lambda: len(running(a)) == 4, timeout=5,
                      what="4 processes running within 5 s of the backlog")
        assert time.monotonic() - began < 5
        assert sorted(running(a)) == ["pdf-1", "pdf-2", "pdf-3", "pdf-4"]
        assert a.ps()["supervisor"]["groups"]["pdf"]["processes"] == 4
        assert [c[:2] for c in a.reports.scaled("pdf")] == [(2, "up"), (3, "up"), (4, "up")]
        await a.until(lambda: len(a.reports.finished("succeeded")) == 16, timeout=30,
                      what="the 16 jobs done")
        await a.until(lambda: len(a.procs) == 1, timeout=10, what="the group back to one process")
        # Not before idle_timeout (1 s) without work; one process at a time.
        assert [c[:2] for c in a.reports.scaled("pdf")][3:] == [(3, "down"), (2, "down"),
                                                                (1, "down")]
        idle = [float(m[1]) for line in a.reports.lines
                if (m := re.search(r"shrinks to \d process(?:es)? .*idle for ([0-9.]+) s", line))]
        assert len(idle) == 3 and min(idle) >= 1.0, idle
        left = a.procs[0]
        stopped = {line.split()[1] for line in a.reports.lines
                   if re.fullmatch(r"worker pdf-\d stopped: .* \(its group shrank\)", line)}
        assert stopped == {"pdf-1", "pdf-2", "pdf-3", "pdf-4"} - {left.name}, stopped
        assert a.ps()["supervisor"]["groups"]["pdf"]["processes"] == 1
        assert {s["worker"] for s in a.ps()["slots"]} == {left.name}  # the exited are gone
        assert not [c for c in a.reports.calls if c[0] == "worker_restarted"]
        assert left.state is ProcessState.RUNNING

    actor(autoscaled(1, 4, 1), scenario)


def test_on_demand_requests_waiting_grow_the_group(actor):
    async def scenario(a):
        callers = [a.on_demand("pdf", {"seconds": 4}) for _ in range(3)]
        await a.until(lambda: len(running(a)) == 3, timeout=5,
                      what="3 processes running for the 3 requests")
        answers = [await caller.outcome() for caller in callers]
        assert [answer["event"] for answer in answers] == ["result"] * 3, answers
        # Each ran on a process of its own, none of them restarted.
        assert len({answer["result"]["pid"] for answer in answers}) == 3
        assert all(answer["result"]["attempt"] == 1 for answer in answers)
        assert [c[:2] for c in a.reports.scaled("pdf")][:2] == [(2, "up"), (3, "up")]

    actor(autoscaled(1, 3, 30), scenario)


def test_a_shrinking_group_never_takes_a_busy_process(actor):
    async def scenario(a):
        # pdf-1 takes the short job; the long one waits, and pdf-2 starts for it.
        short = await a.enqueue("pdf", {"seconds": 2}, priority=10)
        long = await a.enqueue("pdf", {"seconds": 4})
        await a.until(lambda: any(s["job_id"] == long and s["worker"] == "pdf-2"
                                  for s in a.ps()["slots"]), what="the long job on pdf-2")
        pid = a.proc("pdf-2").life.pid
        # pdf-1, idle for idle_timeout, is stopped; pdf-2, the highest numbered, runs on.
        await a.logged(r"group pdf shrinks to 1 process \(1\.\.2\): pdf-1 idle")
        await a.until(lambda: [p.name for p in a.procs] == ["pdf-2"], what="pdf-1 gone")
        assert a.proc("pdf-2").life.pid == pid and (await a.job(short))["status"] == "succeeded"
        await a.until(lambda: a.reports.finished("succeeded") == [
            ("job_finished", "pdf", "succeeded")] * 2, what="the long job done")
        row = await a.job(long)
        assert (row["status"], row["attempts"]) == ("succeeded", 1), row
        assert a.proc("pdf-2").life.pid == pid  # at MIN now: it stays
        assert [c[:2] for c in a.reports.scaled("pdf")] == [(2, "up"), (1, "down")]

    actor(autoscaled(1, 2, 1), scenario)


def test_a_steady_load_at_the_boundary_changes_the_group_at_most_once_per_idle_timeout(actor):
    """Jobs of 0.25 s arrive one every 0.2 s: a little faster than one process runs them. The
    group grows once, to two, and neither overshoots nor flaps. The rules: after a change in
    one direction none in the other comes within idle_timeout (a growth needs every slot busy,
    a shrink a process idle for idle_timeout; and a growth waits idle_timeout after a shrink);
    a growth needs a job to have waited 0.5 s, counted once the newest process has been at
    work for a second (the backlog it drains calls for no other)."""
    idle_timeout = 2.0

    async def scenario(a):
        began = time.monotonic()
        jobs = 0
        while time.monotonic() - began < 6:
            await a.enqueue("pdf", {"seconds": 0.25})
            jobs += 1
            await asyncio.sleep(max(0.0, began + jobs * 0.2 - time.monotonic()))  # the load
        await a.until(lambda: len(a.reports.finished("succeeded")) == jobs, timeout=30,
                      what=f"the {jobs} jobs done")
        changes = a.reports.scaled("pdf")
        assert changes and changes[0][:2] == (2, "up"), changes
        times = [at for _, _, at in changes]
        assert all(later - earlier >= idle_timeout for earlier, later in pairwise(times)), changes
        assert len(changes) <= 6 / idle_timeout + 1, changes

    actor(autoscaled(1, 3, idle_timeout), scenario)


def test_after_a_shrink_the_group_grows_again_only_idle_timeout_later(actor):
    """The hold that keeps a group from flapping: jobs waiting right after a shrink get a new
    process idle_timeout after it, not half a second after they came."""
    async def scenario(a):
        first = [a.on_demand("pdf", {"seconds": 1.5}) for _ in range(2)]
        for caller in first:
            assert (await caller.outcome())["event"] == "result"
        await a.until(lambda: len(a.reports.scaled("pdf")) == 2, what="the group shrunk")
        then = [a.on_demand("pdf", {"seconds": 2.5}) for _ in range(2)]
        await a.until(lambda: len(a.reports.scaled("pdf")) == 3, what="the group grown again")
        (_, up, grew), (_, down, shrank), (_, again, regrew) = a.reports.scaled("pdf")
        assert (up, down, again) == ("up", "down", "up")
        assert regrew - shrank >= 1.0, regrew - shrank
        assert [(await caller.outcome())["event"] for caller in then] == ["result"] * 2

    actor(autoscaled(1, 2, 1), scenario)


def test_supervise_and_ps_show_the_group_growing_within_its_range(supervisors):
    sup = supervisors(autoscaled(1, 3, 1)).start()
    groups = sup.ps()["supervisor"]["groups"]
    assert groups["pdf"] == {"processes": 1, "min": 1, "max": 3, "autoscaled": True}
    # The backlog comes at once (six commands in a row would trickle in on a loaded machine,
    # each job ending before the next came), and lasts past the growth.
    with psycopg.connect(sup.env["FAIRSCHED_DATABASE_URL"], autocommit=True) as conn:
        Queue(conn).enqueue_many([{"type": "pdf", "payload": {"seconds": 6}}] * 6)
    sup.wait_for(lambda ps: ps["supervisor"]["groups"]["pdf"]["processes"] == 3
                 and len({s["worker"] for s in ps["slots"] if s["state"] == "busy"}) == 3,
                 what="3 processes busy", timeout=20)
    shown = sup.cli("ps", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["supervisor"]["groups"]["pdf"]["processes"] == 3
    assert {s["worker"] for s in data["slots"]} == {"pdf-1", "pdf-2", "pdf-3"}
    table = sup.cli("ps")
    assert "pdf 3 of 1..3 processes" in table.stdout, table.stdout
    sup.wait_output(r"group pdf grows to 3 processes \(1\.\.3\)")


def test_the_backlog_count_takes_the_jobs_waiting_long_enough_up_to_each_cap(db):
    """What a full autoscaled group learns of the queue: per type, the pending jobs eligible
    for `wait` seconds or more, counted up to the cap asked."""
    from fairsched.store.aqueue import AsyncStore
    from tests.test_store_fetch import add_jobs

    add_jobs(db, [("pdf", 0, 5.0)] * 6 + [("pdf", 3, 0.1)] * 2 + [("pdf", 0, -30.0)]
             + [("xls", 9, 2.0)] * 2 + [("doc", 0, 0.0)])
    with psycopg.connect(db, autocommit=True) as conn:  # one of them runs: not waiting
        conn.execute("UPDATE fairsched_jobs SET status = 'running'"
                     " WHERE id = (SELECT min(id) FROM fairsched_jobs WHERE type = 'xls')")

    async def count(caps, wait):
        store = await AsyncStore.connect(db)
        try:
            return await store.backlog(caps, wait)
        finally:
            await store.close()

    # The two fresh pdf jobs and the delayed one have not waited 0.5 s; the doc job neither.
    assert asyncio.run(count({"pdf": 100, "xls": 100, "doc": 4}, 0.5)) == {
        "pdf": 6, "xls": 1, "doc": 0}
    assert asyncio.run(count({"pdf": 4, "xls": 1}, 0.0)) == {"pdf": 4, "xls": 1}
    assert asyncio.run(count({}, 0.5)) == {}


def test_the_ps_table_shows_each_autoscaled_group_and_its_range():
    from fairsched.cli.supervisor_cmds import render_ps

    data = {"supervisor": {"pid": 7923, "uptime": 5, "database": "external", "core": "c",
                           "groups": {"pdf": {"processes": 3, "min": 1, "max": 8,
                                              "autoscaled": True},
                                      "xls": {"processes": 2, "min": 2, "max": 2,
                                              "autoscaled": False}}},
            "slots": []}
    first = render_ps(data).splitlines()[0]
    assert first.endswith("on-demand waiting 0  pdf 3 of 1..8 processes"), first
    assert "xls" not in first  # a fixed group's count is its rows


def test_supervise_refuses_a_bad_range_with_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text(textwrap.dedent(HEAD) + 'processes = "4..2"\n')
    refused = subprocess.run([sys.executable, "-m", "fairsched", "supervise", "--config",
                              str(path)], capture_output=True, text=True, timeout=60)
    assert (refused.returncode, refused.stderr) == (
        2, f"fairsched: {path}: [[worker]] 'pdf' key 'processes' must not end below "
           f"its start (MIN..MAX, MIN <= MAX), got '4..2'\n")
    assert not (tmp_path / "state").exists()  # nothing started


def test_a_reload_makes_a_group_autoscaled_and_keeps_a_grown_group_within_its_new_range(actor):
    async def scenario(a):
        # A fixed group of one made autoscaled by a reload: its process runs on, and a backlog
        # grows it as any autoscaled group.
        a.rewrite(autoscaled(1, 3, 30))
        change = a.sup.reload()
        assert change.changed == {"pdf": ("max_processes", "idle_timeout")}, change.changed
        assert "group pdf: resized (max_processes, idle_timeout)" in change.lines()
        first = a.proc("pdf-1").life
        callers = [a.on_demand("pdf", {"seconds": 3}) for _ in range(3)]
        await a.until(lambda: len(running(a)) == 3, timeout=5, what="grown to 3")
        assert a.proc("pdf-1").life is first  # not replaced: only its group's size changed
        # A narrower range keeps what the load gave it, within the range: 3 to at most 2.
        a.rewrite(autoscaled(1, 2, 30))
        a.sup.reload()
        await a.until(lambda: a.ps()["supervisor"]["groups"]["pdf"]["processes"] == 2,
                      what="the group down to its new max")
        answers = [await caller.outcome() for caller in callers]
        assert [answer["event"] for answer in answers] == ["result"] * 3, answers
        assert a.sup.autoscaler.groups["pdf"].high == 2

    actor(autoscaled(1, 1, 30).replace('processes = "1..1"\nidle_timeout = 30\n', ""),
          scenario)


def test_a_reload_that_changes_a_grown_groups_handler_replaces_every_process_it_has(actor):
    async def scenario(a):
        callers = [a.on_demand("pdf", {"seconds": 2}) for _ in range(3)]
        await a.until(lambda: len(running(a)) == 3, timeout=5, what="grown to 3")
        (a.dir / "version_two.py").write_text(
            "import os\n\ndef run(job):\n    return {'version': 2, 'pid': os.getpid()}\n")
        a.rewrite(autoscaled(1, 3, 30, handler="slow").replace("sup_handlers:slow",
                                                                 "version_two:run"))
        since = a.sup.workers._next_generation
        a.sup.reload()
        for caller in callers:  # the jobs running ran to their end on the old code
            assert (await caller.outcome())["event"] == "result"
        # Every process the load had grown is replaced, not only the group's MIN.
        await a.until(lambda: len(running(a)) == 3 and all(
            p.life.generation >= since for p in a.procs), timeout=20,
            what="the three processes replaced")
        names = [p.name for p in a.procs]
        assert sorted(names) == ["pdf-1", "pdf-2", "pdf-3"], names  # each name once
        answer = await a.on_demand("pdf", {}).outcome()
        assert answer["result"]["version"] == 2, answer

    actor(autoscaled(1, 3, 30), scenario)
