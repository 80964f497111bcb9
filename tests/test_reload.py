"""A reload of workers.toml (`fairsched reload`, SIGHUP), driven in process
(tests/actor_harness.py): a bad file or a setting that takes a restart changes nothing; groups
added start, removed ones stop once their jobs end, changed ones are replaced one process at a
time and run their new code; [scoring] counts from the next cycle. And the whole of it under a
run of queued jobs: each ends exactly once."""

import asyncio
import os
import re
import sys

import psycopg
import pytest

from fairsched.config import load_config
from fairsched.errors import ConfigError
from fairsched.supervisor.actor import ReloadRefused
from fairsched.supervisor.reload import config_change
from fairsched.supervisor.states import ProcessState
from tests.test_actor import lambda_row

PDF = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
"""

SLOW = """
[[worker]]
name = "slow"
types = ["slow"]
handler = "sup_handlers:slow"
"""

VERSION = """
import os

def run(job):
    return {{"version": {version}, "pid": os.getpid()}}
"""


def taking_work(ps: dict) -> dict[str, set[str]]:
    """The workers taking work now (a slot free or busy, not on its way out), by type."""
    by_type: dict[str, set[str]] = {}
    for s in ps["slots"]:
        if s["state"] in ("free", "busy"):
            for t in s["types"]:
                by_type.setdefault(t, set()).add(s["worker"])
    return by_type


def rows(ps: dict) -> list[tuple]:
    return [(s["worker"], s["pid"], s["types"], s["state"]) for s in ps["slots"]]


def test_a_bad_file_changes_nothing_and_names_the_key(actor):
    async def scenario(a):
        before = a.ps()
        a.rewrite(PDF + "slots = 0\n")
        with pytest.raises(ConfigError, match=r"workers\.toml: \[\[worker\]\] 'pdf' key "
                                              r"'slots' must be >= 1, got 0"):
            a.sup.reload()
        a.rewrite(PDF + "[[worker]]\nname = \"new\"\ntypes = [\"new\"]\n")  # no handler
        with pytest.raises(ConfigError, match="'new' needs exactly one of 'handler' or"):
            a.sup.reload()
        assert rows(a.ps()) == rows(before)
        assert [p.spec.slots for p in a.procs] == [1]
        assert "new" not in a.sup.planner.type_ids
        answer = await a.on_demand("pdf", {"n": 1}).outcome()
        assert answer["event"] == "result", answer

    actor(PDF, scenario)


@pytest.mark.parametrize("setting", ['state_dir = "elsewhere"', 'lease = 30'])
def test_a_setting_that_takes_a_restart_is_refused(actor, setting):
    async def scenario(a):
        key = setting.split(" = ")[0]
        a.rewrite(PDF + '[[worker]]\nname = "more"\ntypes = ["more"]\n'
                        'handler = "sup_handlers:echo"\n')
        # The setting in place of the one the harness writes (or after it).
        text = a.config_path.read_text()
        a.config_path.write_text(re.sub(rf"(?m)^{key} = .*$", setting, text) if key in text
                                 else text.replace("[supervisor]\n", f"[supervisor]\n{setting}\n"))
        with pytest.raises(ConfigError, match=rf"\[supervisor\] key '{key}' changed: that "
                                              r"takes a restart of the supervisor"):
            a.sup.reload()
        assert [p.name for p in a.procs] == ["pdf-1"]  # the group added with it is not
        assert a.sup.config.supervisor.lease == 15

    actor(PDF, scenario)


def test_the_database_setting_is_refused_as_a_function_of_the_two_files(tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text('[supervisor]\ndatabase = "postgresql://a/x"\n' + PDF)
    old = load_config(path)
    path.write_text('[supervisor]\ndatabase = "postgresql://b/x"\nshutdown_timeout = 3\n' + PDF)
    with pytest.raises(ConfigError, match=r"workers\.toml: \[supervisor\] key 'database' "
                                          r"changed: that takes a restart"):
        config_change(old, load_config(path))
    path.write_text('[supervisor]\ndatabase = "postgresql://a/x"\nshutdown_timeout = 3\n'
                    + PDF + "processes = 2\n" + SLOW + '[scoring]\nage_weight = 8\n')
    change = config_change(old, load_config(path))
    assert change.lines() == [
        "group slow: added (1 process, types slow)",
        "group pdf: resized (processes)",
        "scoring changed (age_weight): from the next cycle",
        "supervisor settings changed (shutdown_timeout)"]


def test_a_group_added_starts_and_runs_its_jobs(actor):
    async def scenario(a):
        job_id = await a.enqueue("slow", {"seconds": 0.1})  # no group runs it yet
        a.rewrite(PDF + SLOW)
        change = a.sup.reload()
        assert change.lines() == ["group slow: added (1 process, types slow)",
                                  "unchanged: 1 group (pdf)"]
        await a.logged(r"reloaded workers\.toml: group slow: added")
        assert a.sup.planner.type_ids == {"pdf": 0, "slow": 1}  # appended: never renumbered
        answer = await a.on_demand("slow", {"seconds": 0.1}).outcome()
        assert answer["event"] == "result", answer
        assert answer["result"]["pid"] == a.proc("slow-1").life.pid
        await a.until(lambda: ("job_finished", "slow", "succeeded") in a.reports.calls
                      and len(a.reports.finished("succeeded")) == 2, what="both slow jobs done")

        row = await a.until(lambda_row(a, job_id), what="its row updated")
        assert row["status"] == "succeeded" and row["attempts"] == 1, row

    actor(PDF, scenario)


def test_a_group_removed_finishes_its_running_job_and_its_callers_are_told(actor):
    async def scenario(a):
        running = a.on_demand("slow", {"seconds": 1})
        await a.until(lambda: a.sup.jobs.running, what="the slow job running")
        waiting = a.on_demand("slow", {"seconds": 1})  # no slot free: it waits
        pid = a.proc("slow-1").life.pid
        a.rewrite(PDF)
        assert a.sup.reload().lines() == [
            "group slow: removed (its processes stop once their jobs end)",
            "unchanged: 1 group (pdf)"]
        told = await waiting.outcome()
        assert told["event"] == "error"
        assert "no worker group runs 'slow' jobs any more" in told["error"], told
        assert [s["state"] for s in a.ps()["slots"] if s["worker"] == "slow-1"] == ["stopping"]
        done = await running.outcome()  # the running one finishes where it runs
        assert done["event"] == "result", done
        assert done["result"]["pid"] == pid and done["result"]["attempt"] == 1
        await a.logged(r"worker slow-1 stopped: .* \(removed from workers\.toml\)")
        assert [p.name for p in a.procs] == ["pdf-1"]
        assert "slow" not in a.sup.planner.free_by_type()
        refused = a.on_demand("slow", {})
        assert refused.request is None  # an unknown type now, as one never configured

    actor(SLOW + PDF, scenario)


def test_a_changed_handler_runs_its_new_code_after_a_roll_of_one_at_a_time(actor):
    async def scenario(a):
        (a.dir / "version_two.py").write_text(VERSION.format(version=2))
        first = await a.on_demand("v", "x").outcome()
        assert first["result"]["payload"] == "x"  # echo's
        old_pids = {p.life.pid for p in a.procs}
        seen = []
        a.reports.watchers.append(lambda: seen.append(len(taking_work(a.ps()).get("v", ()))))
        a.rewrite(GROUP_V.format(handler="version_two:run"))
        assert a.sup.reload().lines() == [
            "group v: changed, its processes replaced one at a time (handler)"]

        def replaced():
            return all(p.state is ProcessState.RUNNING and p.life.pid not in old_pids
                       and p.life.slot_ids for p in a.procs)

        await a.until(replaced, what="both processes replaced")
        await a.logged(r"worker v-2 replaced \(pid \d+\)")
        assert min(seen) == 1, seen  # never both out at once
        # And both back: read now (the last sample may be of a report logged before the
        # replacement's slot was free again).
        assert len(taking_work(a.ps())["v"]) == 2, a.ps()["slots"]
        for _ in range(3):
            answer = await a.on_demand("v").outcome()
            assert answer["result"]["version"] == 2, answer

    actor(GROUP_V.format(handler="sup_handlers:echo"), scenario)


GROUP_V = """
[[worker]]
name = "v"
types = ["v"]
handler = "{handler}"
processes = 2
"""


def test_the_same_handler_changed_on_disk_is_imported_afresh(actor):
    async def scenario(a):
        (a.dir / "version_one.py").write_text(VERSION.format(version=1))
        a.rewrite(GROUP_V.format(handler="version_one:run"))
        assert a.sup.reload().changed == {"v": ("handler",)}
        await a.logged(r"worker v-2 replaced")
        assert (await a.on_demand("v").outcome())["result"]["version"] == 1
        (a.dir / "version_one.py").write_text(VERSION.format(version=2))
        a.rewrite(GROUP_V.format(handler="version_one:run") + 'env = {RELOADED = "1"}\n')
        assert a.sup.reload().changed == {"v": ("env",)}
        await a.until(lambda: sum("worker v-2 replaced" in m for m in a.reports.lines) == 2,
                      what="v-2 replaced a second time")
        assert (await a.on_demand("v").outcome())["result"]["version"] == 2

    actor(GROUP_V.format(handler="sup_handlers:echo"), scenario)


def test_scoring_changes_apply_at_the_next_cycle(actor):
    async def scenario(a):
        assert a.sup.planner.weights.age == 16.0
        a.rewrite(PDF, scoring="age_weight = 2\non_demand_bonus = 10\n")
        assert a.sup.reload().scoring == ("age_weight", "on_demand_bonus")
        assert a.sup.planner.weights.age == 2.0 and a.sup.planner.weights.on_demand == 10.0
        assert a.sup.queue.priority_per_second == 1024 / 2  # the fetch's order too
        answer = await a.on_demand("pdf", {"n": 2}).outcome()
        assert answer["event"] == "result"

    actor(PDF, scenario)


def test_a_reload_while_shutting_down_is_refused(actor):
    async def scenario(a):
        a.sup.request_shutdown(None)
        with pytest.raises(ReloadRefused, match="shutting down"):
            a.sup.reload()

    actor(PDF, scenario)


FLEET = """
[[worker]]
name = "a"
types = ["a"]
handler = "sup_handlers:record"
processes = 2

[[worker]]
name = "b"
types = ["b"]
handler = "sup_handlers:record"
processes = 2
"""

GONE = """
[[worker]]
name = "gone"
types = ["gone"]
handler = "sup_handlers:slow"
"""

NEW = """
[[worker]]
name = "new"
types = ["new"]
handler = "sup_handlers:echo"
"""

RECORD_TWO = """
import os

def run(job):
    with open(job.payload["log"], "a") as f:
        f.write(f"{job.id} {job.attempt} {os.getpid()} two\\n")
    return {"id": job.id, "two": True}
"""

# Where this interpreter imports from (fairsched, psutil): a command's "python" is the base
# interpreter, a virtualenv's symlink resolved.
ROOT = os.pathsep.join(p for p in sys.path if p)
QUEUED = 1000


def test_a_reload_during_a_run_ends_every_job_once_and_keeps_capacity(actor):
    """Adds a group, removes one and changes a third's handler while 1,000 queued jobs run:
    each ends once (attempt 1), no on-demand caller hangs, and no type ever has more than one
    process fewer taking work than it had (sampled from ps at every report of the actor)."""
    async def scenario(a):
        runs = a.dir / "runs.log"
        (a.dir / "record_two.py").write_text(RECORD_TWO)
        lowest: dict[str, int] = {}

        def sample():
            for t, workers in taking_work(a.ps()).items():
                lowest[t] = min(lowest.get(t, len(workers)), len(workers))
            for t in ("a", "b"):
                if t not in taking_work(a.ps()):
                    lowest[t] = 0

        a.reports.watchers.append(sample)

        def enqueue_all() -> list[int]:
            from fairsched.store.queue import Queue

            with psycopg.connect(a.database_url, autocommit=True) as conn:
                return Queue(conn).enqueue_many(
                    [{"type": "ab"[i % 2], "payload": {"log": str(runs), "seconds": 0.01}}
                     for i in range(QUEUED)])

        gone_running = a.on_demand("gone", {"seconds": 1})
        await a.until(lambda: a.sup.jobs.running, what="the gone job running")
        gone_waiting = a.on_demand("gone", {"seconds": 1})
        ids = await asyncio.to_thread(enqueue_all)
        await a.until(lambda: len(a.reports.finished("succeeded")) >= 40,
                      what="the run under way")
        a.rewrite(FLEET.replace('"b"]\nhandler = "sup_handlers:record"',
                                '"b"]\nhandler = "record_two:run"') + NEW)
        change = a.sup.reload()
        done_before = len(a.reports.finished("succeeded"))
        assert done_before < QUEUED / 2, done_before  # the reload comes in the middle of it
        assert change.lines() == [
            "group new: added (1 process, types new)",
            "group gone: removed (its processes stop once their jobs end)",
            "group b: changed, its processes replaced one at a time (handler)",
            "unchanged: 1 group (a)"]
        callers = [a.on_demand("b", {"log": str(runs)}) for _ in range(4)]
        callers.append(a.on_demand("new", {"n": 1}))
        told = await gone_waiting.outcome()
        assert "no worker group runs 'gone' jobs any more" in told["error"], told
        for caller in callers:
            answer = await caller.outcome()
            assert answer["event"] == "result", answer
        assert (await gone_running.outcome())["event"] == "result"

        def all_ended():
            with psycopg.connect(a.database_url, autocommit=True) as conn:
                rows = conn.execute("SELECT status, attempts, count(*) FROM fairsched_jobs "
                                    "WHERE id = ANY(%s) GROUP BY 1, 2", (ids,)).fetchall()
            return rows if sum(n for status, _, n in rows
                               if status not in ("pending", "running")) == QUEUED else None

        rows = await a.until(all_ended, timeout=60, what="every queued job ended")
        assert rows == [("succeeded", 1, QUEUED)], rows
        lines = [line.split() for line in runs.read_text().splitlines()]
        queued_runs = [int(f[0]) for f in lines if f[0].isdigit()]
        assert sorted(queued_runs) == sorted(ids)  # each ran once, none twice
        assert any(f[-1] == "two" for f in lines)  # b's new handler ran
        await a.logged(r"worker gone-1 stopped: .* \(removed from workers\.toml\)")
        assert lowest["a"] == 2, lowest  # untouched
        assert lowest["b"] == 1, lowest  # one process out at a time, never both
        assert sorted(p.name for p in a.procs) == ["a-1", "a-2", "b-1", "b-2", "new-1"]
        assert a.sup.counters()["returned"] == 0
        print(f"reload after {done_before} of {QUEUED} jobs; fewest taking work: {lowest}")

    actor(FLEET + GONE, scenario)


def test_a_handler_group_turned_command_is_no_longer_forked_from_its_template(actor):
    async def scenario(a):
        assert a.sup.workers.templates.templates.keys() == {"v"}
        a.rewrite(GROUP_V.replace('handler = "{handler}"', f'command = [{sys.executable!r}, '
                                  '"-m", "fairsched.worker"]\nenv = {{FAIRSCHED_HANDLER = '
                                  f'"sup_handlers:measure", PYTHONPATH = {ROOT!r}}}}}')
                  .format())
        assert a.sup.reload().changed == {"v": ("handler", "command", "env")}
        await a.until(lambda: sum("replaced (pid" in m for m in a.reports.lines) == 2,
                      what="both processes replaced")
        assert a.sup.workers.templates.templates == {}
        answer = await a.on_demand("v", "ab").outcome()
        assert answer["result"] == {"length": 2, "characters": ["a", "b"]}, answer

    actor(GROUP_V.format(handler="sup_handlers:echo"), scenario)


def test_a_replacement_that_cannot_start_stops_the_roll_and_the_others_run_on(actor):
    async def scenario(a):
        a.rewrite(GROUP_V.format(handler="no_such_module:run") + "max_restarts = 0\n")
        a.sup.reload()
        await a.logged(r"reload of group v stopped: its new process v-1 is fatal \(could not "
                       r"start: cannot import handler .*\); v-2 keep running as they were")
        assert a.proc("v-2").state is ProcessState.RUNNING
        answer = await a.on_demand("v", "still").outcome()
        assert answer["result"]["payload"] == "still"  # echo's, the code v-2 had
        assert answer["result"]["pid"] == a.proc("v-2").life.pid

    actor(GROUP_V.format(handler="sup_handlers:echo"), scenario)


def test_a_removed_group_job_still_running_at_shutdown_timeout_goes_back_unspent(actor):
    async def scenario(a):
        job_id = await a.enqueue("slow", {"seconds": 30})
        await a.until(lambda: a.sup.jobs.running, what="the slow job running")
        a.rewrite(PDF)
        a.sup.reload()
        await a.logged(r"worker slow-1 takes no more work: it stops once its running jobs "
                       r"have ended \(at most 1 s: shutdown_timeout\)")
        await a.logged(rf"worker slow-1 still runs job {job_id} at the end of shutdown_timeout "
                       r"\(1 s\); stopping it, its jobs go back unspent")
        await a.logged(r"worker slow-1 stopped: .* \(removed from workers\.toml\)")
        await a.logged(rf"job {job_id} returned to the queue \(restart\)")
        row = await a.job(job_id)
        assert row["status"] == "pending" and row["attempts"] == 0, row

    actor(PDF + SLOW, scenario, shutdown_timeout=1)


def test_two_reloads_in_a_row_replace_each_process_with_the_latest_settings(actor):
    async def scenario(a):
        (a.dir / "version_two.py").write_text(VERSION.format(version=2))
        (a.dir / "version_three.py").write_text(VERSION.format(version=3))
        a.rewrite(GROUP_V.format(handler="version_two:run"))
        a.sup.reload()
        a.rewrite(GROUP_V.format(handler="version_three:run"))
        since = a.sup.workers._next_generation  # a process started from here on runs three
        a.sup.reload()
        await a.until(lambda: all(p.state is ProcessState.RUNNING and p.life.slot_ids
                                  and p.life.generation >= since for p in a.procs),
                      what="every process replaced since the second reload")
        assert all(s["retiring"] is None for s in a.ps()["slots"])
        for _ in range(4):
            assert (await a.on_demand("v").outcome())["result"]["version"] == 3

    actor(GROUP_V.format(handler="sup_handlers:echo"), scenario)


def test_a_scoring_change_orders_the_next_cycle(actor):
    async def scenario(a):
        blocker = await a.enqueue("slow", {"seconds": 1})
        await a.until(lambda: a.sup.jobs.running, what="the blocker running")
        older = await a.enqueue("slow", {"seconds": 0.01}, priority=0)
        newer = await a.enqueue("slow", {"seconds": 0.01}, priority=5)
        a.rewrite(SLOW, scoring="priority_weight = 0\n")  # age alone: the older job first
        assert a.sup.reload().scoring == ("priority_weight",)
        await a.logged(rf"job {newer} succeeded")
        started = [int(m[1]) for line in a.reports.lines
                   if (m := re.match(r"job (\d+) started", line))]
        assert started == [blocker, older, newer], started

    actor(SLOW, scenario)
