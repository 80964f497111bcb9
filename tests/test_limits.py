"""[limits]: at most N jobs of a type at once across every supervisor sharing the database,
on-demand jobs counted, with real supervisors (subprocesses) claiming at the same moments."""

import asyncio
import json
import threading

import psycopg
import pytest

from fairsched.cli.supervisor_cmds import render_ps
from fairsched.config import ConfigError, load_config
from fairsched.store.aqueue import AsyncStore
from fairsched.store.queue import Queue
from tests.supervisor_harness import wait_until
from tests.test_cli_queue import WORKERS_TOML, fairsched
from tests.test_cli_queue import queue as cli_queue
from tests.test_metrics import free_port, scrape_until
from tests.test_queue_supervisors import wait_all_finished

LIMITED = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:interval"
processes = 2
slots = 2

[limits]
pdf = 2
"""


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:  # at a tie an end comes first: -1 sorts before 1
        running += step
        most = max(most, running)
    return most


def test_three_supervisors_never_run_more_than_the_limit(supervisors, db):
    port = free_port()
    sups = [supervisors(LIMITED, supervisor=f'metrics = "127.0.0.1:{port}"').start()]
    sups += [supervisors(LIMITED).start() for _ in range(2)]  # 12 slots for pdf, limit 2
    with psycopg.connect(db, autocommit=True) as conn:
        ids = Queue(conn).enqueue_many([{"type": "pdf", "payload": {"seconds": 0.02}}] * 200)
    answers = []

    def on_demand(sup):
        done = sup.cli("submit", "pdf", "--on-demand", "--payload", '{"seconds": 0.02}')
        answers.append((done.returncode, done.stdout))

    callers = [threading.Thread(target=on_demand, args=(sup,)) for sup in sups]
    for caller in callers:
        caller.start()
    # Mid-run, the metrics show the limit and the jobs running against it, never above.
    pdf = (("type", "pdf"),)
    scrape_until(port, lambda m: m.get(("fairsched_limit", pdf)) == 2
                 and m.get(("fairsched_limit_running", pdf)) in (1, 2),
                 "the limit's gauges with jobs running")
    wait_all_finished(db, 200, timeout=60, sups=sups)
    for caller in callers:
        caller.join(60)
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT id, status, attempts, result FROM fairsched_jobs"
                            " ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ids
    assert {(r[1], r[2]) for r in rows} == {("succeeded", 1)}  # each ran once
    assert [code for code, _ in answers] == [0, 0, 0], answers
    spans = [(r[3]["start"], r[3]["end"]) for r in rows]
    spans += [(a["start"], a["end"]) for a in (json.loads(out) for _, out in answers)]
    assert len(spans) == 203
    assert most_at_once(spans) == 2

    def holds() -> int:
        with psycopg.connect(db) as conn:
            return conn.execute("SELECT count(*) FROM fairsched_limit_holds").fetchone()[0]

    # The on-demand jobs' places are given back once they end (the answer may come first).
    wait_until(lambda: holds() == 0, what="the on-demand jobs' places given back")


@pytest.mark.parametrize(("text", "problem"), [
    ("[limits]\nxls = 2\n", "[limits] key 'xls' names no type a [[worker]] group here runs"),
    ("[limits]\npdf = 0\n", "[limits] key 'pdf' must be >= 1, got 0"),
    ('[limits]\npdf = "two"\n', "[limits] key 'pdf' must be an integer, got string 'two'"),
    ("[scoring]\nusage_half_life = 0\n", "[scoring] key 'usage_half_life' must be > 0, got 0.0"),
    ("[scoring]\ntenant_weight = -1\n", "[scoring] key 'tenant_weight' must be >= 0, got -1.0"),
])
def test_limits_and_usage_settings_are_checked_in_one_line(tmp_path, text, problem):
    path = tmp_path / "workers.toml"
    path.write_text('[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "h:f"\n' + text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: {problem}"


def test_limits_and_usage_settings_are_read(tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text('[scoring]\nusage_half_life = 3600\n'
                    '[[worker]]\nname = "pdf"\ntypes = ["pdf"]\nhandler = "h:f"\n'
                    "[limits]\npdf = 3\n")
    config = load_config(path)
    assert config.limits == {"pdf": 3}
    assert config.usage_half_life == 3600.0


def test_jobs_counts_shows_each_limit_with_its_running_jobs(db, tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text(WORKERS_TOML + "\n[limits]\npdf = 3\n")
    with cli_queue(db) as q:
        for _ in range(2):
            q.conn.execute("UPDATE fairsched_jobs SET status = 'running' WHERE id = %s",
                           (q.enqueue("pdf"),))
        q.enqueue("pdf")
        (sup,) = q.conn.execute("INSERT INTO fairsched_supervisors (host, pid, lease)"
                                " VALUES ('h', 1, 15) RETURNING id").fetchone()
        q.conn.execute("INSERT INTO fairsched_limit_holds (type, supervisor) VALUES ('pdf', %s)",
                       (sup,))
    table = fairsched("jobs", "--counts", "--config", str(path), url=db)
    assert (table.returncode, table.stderr) == (0, ""), table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.endswith("OLDEST WAIT  LIMIT")
    cells = {row.split()[0]: row.split() for row in rows}
    assert cells["pdf"][-1] == "3/3"  # two queued jobs running, one on-demand job holding
    assert cells["ocr"][-1] == "-"  # no limit
    (pdf,) = json.loads(fairsched("jobs", "--counts", "--type", "pdf", "--json", "--config",
                                  str(path), url=db).stdout)
    assert (pdf["running"], pdf["on_demand_held"], pdf["limit"]) == (2, 1, 3)


def test_ps_shows_each_limit_and_whether_it_is_full():
    sup = {"pid": 1, "uptime": 1.0, "database": "embedded", "core": "c",
           "limits": {"pdf": {"limit": 2, "running": 2, "running_here": 1, "at_limit": True},
                      "xls": {"limit": 5, "running": None, "running_here": 0,
                              "at_limit": False}}}
    head = render_ps({"supervisor": sup, "slots": []}).splitlines()[0]
    assert "limit pdf 2/2 full" in head and "limit xls ?/5" in head, head


def test_ten_claimers_at_once_never_claim_past_the_limit(db):
    """Ten supervisors' connections claim the same moment, each for every pending job: two
    win in all, the rest are told the type is at its limit; with one done, one more."""
    with psycopg.connect(db, autocommit=True) as conn:
        ids = Queue(conn).enqueue_many([{"type": "pdf"}] * 50)

    async def go():
        stores = [await AsyncStore.connect(db) for _ in range(10)]
        try:
            start = asyncio.Event()

            async def claim(store, mine):
                await start.wait()
                return await store.claim_within(mine, {}, {"pdf": 2})

            tasks = [asyncio.create_task(claim(s, ids[k::10] + ids[:5]))
                     for k, s in enumerate(stores)]
            await asyncio.sleep(0)
            start.set()
            answers = await asyncio.gather(*tasks)
            won = [j for jobs, _ in answers for j in jobs]
            assert len(won) == 2, won
            assert all(set(refused.values()) <= {"pdf"} for _, refused in answers)
            owner, done = next((s, jobs[0]) for s, (jobs, _) in zip(stores, answers, strict=True)
                               if jobs)
            await owner.complete([(done.id, done.claim, None)])
            again, refused = await stores[0].claim_within(ids, {}, {"pdf": 2})
            # One running, one succeeded: of the 48 pending, one has the place left, the others
            # are refused for the limit.
            assert len(again) == 1 and len(refused) == 47
        finally:
            for s in stores:
                await s.close()

    asyncio.run(go())


def test_a_dead_supervisors_holds_go_with_its_row(db):
    async def go():
        store = await AsyncStore.connect(db)
        try:
            assert await store.hold("pdf", 1) is not None
            assert await store.hold("pdf", 1) is None  # the one place is taken
        finally:
            await store.close(deregister=False)
        with psycopg.connect(db, autocommit=True) as conn:
            # What the rescue of a supervisor found dead does to its row.
            conn.execute("DELETE FROM fairsched_supervisors")
            assert conn.execute("SELECT count(*) FROM fairsched_limit_holds").fetchone() == (0,)

    asyncio.run(go())
