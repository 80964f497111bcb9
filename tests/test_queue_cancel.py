"""fairsched cancel of a queued job as it starts, and crossing its end: real supervisors,
workers and PostgreSQL."""

import asyncio
import contextlib
import re
import signal

import psycopg

from fairsched.store.queue import Queue
from tests.actor_harness import run_actor
from tests.pg_proxy import CLAIM, PgProxy
from tests.supervisor_harness import wait_until

SLOW = """
[[worker]]
name = "slow"
types = ["slow"]
handler = "sup_handlers:slow"
"""

LATE = """
[[worker]]
name = "late"
types = ["late"]
handler = "sup_handlers:fail_later"
"""

# Heartbeats far apart: a cancel the heartbeat passes on would come 20 s late.
RARE_HEARTBEATS = "lease = 60\nheartbeat_interval = 20\n"
# The one heartbeat of these tests is the first: a cancel it passed on would come 30 s late.
ONE_HEARTBEAT = "lease = 90\nheartbeat_interval = 30\n"


def job_row(url, job):
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT status, attempts, claims FROM fairsched_jobs WHERE id = %s",
                            (job,)).fetchone()


def test_a_cancel_that_comes_before_the_claims_answer_stops_the_job_before_it_starts(
        db, short_tmp):
    # In process (tests/actor_harness.py), where the cancel is seen to reach the supervisor:
    # the claim on its way is marked cancelled in its waiting jobs.
    started = short_tmp / "started"
    proxy = PgProxy(db)

    def cancel(job: int) -> str:
        with psycopg.connect(db, autocommit=True) as conn:
            return Queue(conn).cancel_job(job)

    async def scenario(a):
        proxy.hold_answer_to(CLAIM)  # the claim's answer is slow to come
        job = await a.enqueue("slow", {"seconds": 60, "started": str(started)})
        await asyncio.to_thread(
            wait_until, lambda: proxy.answer_held and job_row(db, job)[0] == "running",
            what="the claim committed, its answer on its way")
        await asyncio.to_thread(cancel, job)
        claims = a.sup.planner.waiting.cache
        await a.until(lambda: (job, True) in claims.claiming_list(),
                      what="the cancel heard while the claim's answer is on its way")
        proxy.pass_answer()
        await asyncio.to_thread(
            wait_until, lambda: job_row(db, job)[0] == "cancelled", 5,
            lambda: f"job {job} cancelled, not {job_row(db, job)}")
        # Never handed to its worker: the handler did not start, the attempt is unspent.
        assert job_row(db, job) == ("cancelled", 0, 1)
        assert not started.exists()
        await a.logged(rf"job {job} cancelled before it started")
        assert a.ps()["slots"][0]["state"] == "free"
        assert a.reports.finished() == []

    try:
        run_actor(proxy.url_through, SLOW, scenario, supervisor=RARE_HEARTBEATS)
    finally:
        proxy.close()


@contextlib.contextmanager
def cancel_unheard(supervisors, db: str, workers: str, job_type: str, payload: dict):
    """A supervisor (of `workers`) running one `job_type` job, cancelled with `fairsched
    cancel` while the supervisor's notification connection is down and kept down: the cancel
    reaches the job table, not the supervisor. Yields (supervisor, proxy, job id)."""
    proxy = PgProxy(db)
    sup = supervisors(workers, supervisor=ONE_HEARTBEAT)
    try:
        sup.env["FAIRSCHED_DATABASE_URL"] = proxy.url_through
        sup.start()
        with psycopg.connect(db, autocommit=True) as conn:
            job = Queue(conn).enqueue(job_type, payload)
        sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == job, what="the job running")
        proxy.refuse(b"fairsched notifications")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE application_name LIKE 'fairsched notifications%%'")
        wait_until(lambda: proxy.refused, what="the notification connection trying again")
        cancel = sup.cli("cancel", str(job))
        assert cancel.returncode == 0, cancel.stderr
        yield sup, proxy, job
    finally:
        sup.close()
        proxy.close()


def test_a_cancel_sent_while_the_notification_connection_was_down_reaches_the_job_once_it_is_back(
        supervisors, db):
    with cancel_unheard(supervisors, db, SLOW, "slow", {"seconds": 60}) as (sup, proxy, job):
        proxy.refuse(None)
        wait_until(lambda: job_row(db, job)[0] == "cancelled", timeout=10,
                   what=lambda: f"job {job} cancelled, not {job_row(db, job)}:\n"
                                f"{sup.output()[-3000:]}")
        sup.wait_output(rf"job {job} cancelled: type slow")


def test_a_cancel_that_crosses_a_shutdown_is_said_as_the_table_ends_the_job(supervisors, db):
    # The supervisor is stopped before the cancel reaches it: the job it hands back ends
    # cancelled, as asked, and its log line says so, not "returned".
    with cancel_unheard(supervisors, db, SLOW, "slow", {"seconds": 60}) as (sup, _, job):
        sup.signal(signal.SIGTERM)
        assert sup.wait_exit(30) == 0, sup.output()[-3000:]
        out = sup.output()
        assert job_row(db, job)[0] == "cancelled", out[-3000:]
        assert re.search(rf"job {job} cancelled: type slow, worker slow-1, slot 0, attempt 1, "
                         rf"[0-9.]+ s \(its cancel reached the job table as it was being "
                         rf"returned to the queue \(shutdown\)\)", out), out[-3000:]
        assert f"job {job} returned to the queue" not in out, out[-3000:]


def test_a_cancel_that_crosses_a_failure_is_said_as_the_table_ends_the_job(supervisors, db,
                                                                           tmp_path):
    gate = tmp_path / "fail now"
    with cancel_unheard(supervisors, db, LATE, "late", {"open": str(gate)}) as (sup, _, job):
        # The handler fails on its own, once the cancel is in the table: its retry would
        # have come, but the cancel wins.
        gate.touch()
        sup.wait_output(rf"job {job} failed: type late, .*: RuntimeError: failed late; retry in")
        sup.wait_output(rf"job {job} ended cancelled, as asked: its cancel reached the job "
                        rf"table before its failed attempt was recorded")
        assert job_row(db, job)[:2] == ("cancelled", 1)
