"""Recycling leaking workers: max_jobs, max_rss (after a job, once its jobs are done) and
rss_limit (killed at once), with real processes and the real database."""

import psycopg
import pytest

from fairsched.store.queue import Queue

MB = 1 << 20

LEAK = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:leak"
"""

ECHO = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"
"""


def rows(url: str, ids: list[int]) -> dict[int, dict]:
    with psycopg.connect(url, autocommit=True) as conn:
        return Queue(conn).get_jobs(ids)


async def enqueue_all(a, count: int, payload) -> list[int]:
    return [await a.enqueue("pdf", payload) for _ in range(count)]


async def all_finished(a, ids: list[int], timeout: float = 60) -> dict[int, dict]:
    """The jobs' rows once every one has finished (watched at each job's end)."""
    def finished():
        found = rows(a.database_url, ids)
        if all(r["status"] in ("succeeded", "failed", "cancelled") for r in found.values()):
            return found
        return None

    return await a.until(finished, timeout, what=lambda: f"{len(ids)} jobs finished")


def test_max_rss_replaces_a_leaking_process_before_it_grows_past_one_more_job(actor):
    async def scenario(a):
        ids = await enqueue_all(a, 50, {"mb": 30})
        done = await all_finished(a, ids)
        assert {r["status"] for r in done.values()} == {"succeeded"}
        assert {r["attempts"] for r in done.values()} == {1}
        # Measured by each job at its end: never above max_rss plus what one job adds.
        seen = max(r["result"]["rss"] for r in done.values())
        assert seen <= 100 * MB + 30 * MB + 8 * MB, seen / MB
        pids = {r["result"]["pid"] for r in done.values()}
        assert len(pids) >= 10, pids  # some 3 jobs a process
        recycled = [line for line in a.reports.lines if "is recycled (max_rss: RSS" in line]
        assert len(recycled) >= len(pids) - 1, recycled
        assert all("above 100MB" in line for line in recycled), recycled
        assert ("worker_recycled", "pdf", "max_rss") in a.reports.calls
        assert a.proc("pdf-1").restarts >= len(pids) - 1
        assert a.sup.counters()["failed"] == 0 and a.sup.counters()["retried"] == 0

    actor(LEAK + 'max_rss = "100MB"\n', scenario)


def test_rss_limit_kills_at_once_and_the_job_is_tried_again_with_the_limit_named(actor):
    async def scenario(a):
        # A job retried lands on a process's third job (and is killed again) about one time
        # in three, so each is given attempts enough never to run out; the group's own 3 are
        # for the on-demand job below.
        ids = [await a.enqueue("pdf", {"mb": 30, "seconds": 0.1}, max_attempts=12)
               for _ in range(12)]
        done = await all_finished(a, ids)
        assert {r["status"] for r in done.values()} == {"succeeded"}, done
        retried = [r for r in done.values() if r["attempts"] > 1]
        assert retried, "no job was killed under the limit"
        for r in retried:
            assert "RSS" in r["last_error"] and "above rss_limit 100MB" in r["last_error"], r
        killed = [line for line in a.reports.lines if "above its rss_limit of 100MB" in line]
        assert killed, a.reports.lines[-20:]
        assert ("worker_recycled", "pdf", "rss_limit") in a.reports.calls
        worker = a.proc("pdf-1")
        assert worker.crash_times == type(worker.crash_times)()  # no crash counted
        # An on-demand job that alone takes more than the limit fails every attempt, said so.
        answer = await a.on_demand("pdf", {"mb": 150, "seconds": 5}).outcome()
        assert answer["event"] == "error", answer
        assert "above rss_limit 100MB" in answer["error"], answer

    actor(LEAK + 'rss_limit = "100MB"\nmax_attempts = 3\n', scenario)


def test_max_jobs_spreads_the_recycles_and_runs_every_job_once(actor):
    async def scenario(a):
        ids = await enqueue_all(a, 100, {"n": 1})
        done = await all_finished(a, ids)
        assert {r["status"] for r in done.values()} == {"succeeded"}
        assert {r["attempts"] for r in done.values()} == {1}
        by_pid: dict[int, int] = {}
        for r in done.values():
            by_pid[r["result"]["pid"]] = by_pid.get(r["result"]["pid"], 0) + 1
        assert len(by_pid) >= 100 // 6, by_pid
        assert max(by_pid.values()) <= 6, by_pid  # 5, drawn within +-1
        # Drawn per process: the processes of the group do not all recycle after as many jobs.
        assert len(set(by_pid.values())) > 1, by_pid
        recycled = [line for line in a.reports.lines if "is recycled (max_jobs: ran" in line]
        assert len(recycled) >= len(by_pid) - 2, recycled
        slots = a.ps()["slots"]
        assert all(s["max_jobs"] in (4, 5, 6) and s["jobs_done"] <= s["max_jobs"]
                   for s in slots), slots

    actor(ECHO + "processes = 2\nmax_jobs = 5\n", scenario)


def test_recycling_through_workers_toml_and_ps(supervisors):
    sup = supervisors(ECHO + 'max_jobs = 2\nmax_rss = "2GB"\nrss_limit = "3GB"\n').start()
    ids = [sup.enqueue("pdf", payload={"n": n}) for n in range(6)]
    done = sup.wait_for(lambda ps: ps["supervisor"]["counters"]["succeeded"] == 6,
                        what="six jobs succeeded")
    (row,) = done["slots"]
    assert (row["max_rss"], row["rss_limit"]) == (2 << 30, 3 << 30), row
    assert row["max_jobs"] in (1, 2, 3) and row["restarts"] >= 2, row
    assert "is recycled (max_jobs: ran" in sup.output()
    human = sup.cli("ps")
    assert human.returncode == 0, human.stderr
    assert "/2G" in human.stdout.splitlines()[2], human.stdout
    pids = {r["result"]["pid"] for r in rows(sup.env["FAIRSCHED_DATABASE_URL"], ids).values()}
    assert len(pids) >= 2, pids


def test_a_bad_size_is_a_configuration_error_naming_the_key(tmp_path):
    from fairsched.config import ConfigError, load_config

    config = tmp_path / "workers.toml"
    config.write_text(ECHO + 'max_rss = "lots"\n')
    with pytest.raises(ConfigError, match="key 'max_rss' must be a size such as \"50MB\""):
        load_config(config)
