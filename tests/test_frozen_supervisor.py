"""A supervisor frozen (SIGSTOP: a swapping host, say) past its lease while another runs on
the same database: whatever reaches it when it wakes, no job runs twice at once, and no job
it has lost is started or recorded by it."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg

from fairsched.store.queue import Queue
from tests.pg_proxy import CLAIM, PgProxy
from tests.supervisor_harness import wait_until

SPAN = """
[[worker]]
name = "span"
types = ["span"]
handler = "sup_handlers:span"
"""
SHORT_LEASE = "lease = 2\nheartbeat_interval = 0.5\n"


def job_row(url: str, job: int) -> tuple:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT status, attempts, claimed_by FROM fairsched_jobs"
                            " WHERE id = %s", (job,)).fetchone()


def starts(log: Path, job: int) -> list[str]:
    """The pids of the runs of `job` the span handler logged, in order."""
    if not log.exists():
        return []
    return [ln.split()[2] for ln in log.read_text().splitlines()
            if ln.split()[:2] == ["start", str(job)]]


def test_a_claim_answered_while_its_supervisor_was_frozen_past_its_lease_is_not_started(
        supervisors, db, tmp_path):
    log = tmp_path / "spans.log"
    proxy = PgProxy(db)
    frozen = supervisors(SPAN, supervisor=SHORT_LEASE)
    try:
        frozen.env["FAIRSCHED_DATABASE_URL"] = proxy.url_through
        frozen.start()
        frozen_id = frozen.ps()["supervisor"]["id"]
        proxy.hold_answer_to(CLAIM)
        with psycopg.connect(db, autocommit=True) as conn:
            job = Queue(conn).enqueue("span", {"log": str(log), "seconds": 3})
        wait_until(lambda: proxy.answer_held and job_row(db, job)[0] == "running",
                   interval=0.01, what="the claim committed, its answer on its way")
        frozen.signal(signal.SIGSTOP)
        try:
            other = supervisors(SPAN, supervisor=SHORT_LEASE).start()
            other_id = other.ps()["supervisor"]["id"]
            wait_until(lambda: job_row(db, job)[2] == other_id, timeout=30,
                       what=lambda: f"job {job} taken over by the other supervisor: "
                                    f"{job_row(db, job)}")
            proxy.pass_answer()  # written: the old claim's answer is there when it wakes
        finally:
            frozen.signal(signal.SIGCONT)
        wait_until(lambda: job_row(db, job)[0] == "succeeded", timeout=30,
                   what=lambda: f"job {job} succeeded, not {job_row(db, job)}:\n"
                                f"{frozen.output()[-3000:]}")
        frozen.wait_output("lease had expired")
        # The woken supervisor is done with the old claim: either it read the answer and
        # handed the job back (the table refusing: taken over), or it gave up on the answer,
        # and the reconnection that followed looked for rows the claim had won (_reconcile)
        # before it said the connection was restored.
        frozen.wait_output(rf"job {job} was already taken over|database connection restored")
        assert starts(log, job) == [str(other.slots("span")[0]["pid"])], (
            log.read_text(), frozen.output()[-3000:])
        assert f"job {job} started" not in frozen.output(), frozen.output()[-3000:]
        assert job_row(db, job)[0] == "succeeded" and frozen_id != other_id
        assert frozen.proc.poll() is None
    finally:
        frozen.close()
        proxy.close()
