"""A job that will not stop: `[[worker]] on_timeout` says whether one past its timeout is tried
again, and `cancel_grace` how long one cancelled by `fairsched cancel` may run on before its
worker is stopped; the jobs beside it go back to the queue unspent."""

from __future__ import annotations

import re

import psycopg
import pytest

from tests.supervisor_harness import wait_until

SLOW = """
[[worker]]
name = "slow"
types = ["slow"]
handler = "sup_handlers:slow"
retry_backoff = 0.05
"""  # settings may follow

STUBBORN = {"seconds": 60, "ignore_cancel": True}


def job(url: str, job_id: int) -> dict:
    with psycopg.connect(url) as conn:
        status, attempts, last_error, result = conn.execute(
            "SELECT status, attempts, last_error, result FROM fairsched_jobs WHERE id = %s",
            (job_id,)).fetchone()
    return {"status": status, "attempts": attempts, "last_error": last_error, "result": result}


def ended(url: str, job_id: int, sup, timeout: float = 30) -> dict:
    """The job once it is finished (succeeded, failed or cancelled)."""
    def finished():
        assert sup.proc.poll() is None, sup.output()[-3000:]
        row = job(url, job_id)
        return row if row["status"] in ("succeeded", "failed", "cancelled") else None

    return wait_until(finished, timeout, lambda: f"job {job_id} to end: {job(url, job_id)}\n"
                                                 f"{sup.output()[-3000:]}")


def test_a_cancel_the_handler_ignores_stops_its_worker_after_cancel_grace(supervisors, db):
    # The handler never asks job.cancelled(): it ran to its end, 60 s, whatever the cancel.
    # The job beside it on the same worker goes back to the queue unspent (one attempt in
    # all, of one allowed) and succeeds on the worker that replaces it.
    sup = supervisors(SLOW + "slots = 2\ncancel_grace = 1\nmax_attempts = 1\n").start()
    stubborn = sup.enqueue("slow", payload=STUBBORN)
    sup.wait_for(lambda ps: any(s["job_id"] == stubborn for s in ps["slots"]),
                 what="the stubborn job running")
    beside = sup.enqueue("slow", payload={"seconds": 4})
    ps = sup.wait_for(lambda ps: {s["job_id"] for s in ps["slots"]} == {stubborn, beside},
                      what="both jobs running on the one worker")
    pid = ps["slots"][0]["pid"]
    cancelled = sup.cli("cancel", str(stubborn))
    assert cancelled.returncode == 0, cancelled.stderr

    assert ended(db, stubborn, sup, timeout=20)["status"] == "cancelled"
    row = ended(db, beside, sup)
    assert (row["status"], row["attempts"]) == ("succeeded", 1), (row, sup.output()[-3000:])
    assert row["result"]["pid"] != pid  # it ran again, whole, on the new worker
    out = sup.output()
    assert (f"job {stubborn} on worker slow-1 did not stop within 1 s of its cancel "
            "(cancel_grace); stopping the worker") in out
    assert f"job {beside} returned to the queue (restart)" in out
    assert re.search(r"worker slow-1 .* after its job did not stop when cancelled; restarting",
                     out), out[-3000:]
    assert "crashed" not in out and "fatal" not in out


def test_a_cancel_the_handler_heeds_leaves_its_worker_alone(supervisors, db):
    sup = supervisors(SLOW + "cancel_grace = 1\n").start()
    polite = sup.enqueue("slow", payload={"seconds": 60})
    ps = sup.wait_for(lambda ps: ps["slots"][0]["job_id"] == polite, what="the job running")
    assert sup.cli("cancel", str(polite)).returncode == 0
    assert ended(db, polite, sup)["status"] == "cancelled"
    # Past the grace: its timer went with the job, and the worker is the one it was.
    sup.wait_output(rf"job {polite} cancelled")
    later = sup.enqueue("slow", payload={"seconds": 1.5})
    assert ended(db, later, sup)["result"]["pid"] == ps["slots"][0]["pid"]
    assert "stopping the worker" not in sup.output()


@pytest.mark.parametrize("on_timeout, attempts", [("retry", 2), ("fail", 1)])
def test_on_timeout_says_whether_a_timed_out_job_is_tried_again(supervisors, db, on_timeout,
                                                                attempts):
    sup = supervisors(SLOW + f'timeout = 1\non_timeout = "{on_timeout}"\nmax_attempts = 2\n'
                      ).start()
    hung = sup.enqueue("slow", payload=STUBBORN)
    row = ended(db, hung, sup, timeout=40)
    assert (row["status"], row["attempts"]) == ("failed", attempts), (row, sup.output()[-3000:])
    if on_timeout == "fail":
        assert row["last_error"] == 'timed out after 1 s (on_timeout = "fail": not tried again)'
        assert f"job {hung} failed for good" in sup.output()
    else:
        assert row["last_error"] == "timed out after 1 s"


def test_on_timeout_fail_ends_an_on_demand_job_after_one_attempt(supervisors):
    sup = supervisors(SLOW + 'timeout = 1\non_timeout = "fail"\nmax_attempts = 3\n').start()
    result = sup.cli("submit", "slow", "--on-demand", "--payload",
                     '{"seconds": 60, "ignore_cancel": true}')
    assert result.returncode == 1, result.stderr
    assert 'timed out after 1 s (on_timeout = "fail": not tried again)' in result.stderr
    assert len(re.findall(r"job od-1 started", sup.output())) == 1, sup.output()[-3000:]
