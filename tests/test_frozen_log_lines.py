"""What a supervisor frozen (SIGSTOP: a swapping host, say) past its lease says when it wakes,
while another supervisor on the same database took its jobs over: its log tells what really
happened to those jobs."""

from __future__ import annotations

import re
import signal

import psycopg

from fairsched.store.queue import Queue
from tests.conftest import heartbeat_at, server_now
from tests.supervisor_harness import wait_until

SPAN = """
[[worker]]
name = "span"
types = ["span"]
handler = "sup_handlers:span"
processes = 2
"""
LEASE = "lease = 4\n"


def holders(url: str, jobs: list[int]) -> set:
    """Who runs `jobs`: the supervisor ids of their rows that are running."""
    with psycopg.connect(url) as conn:
        return {row[0] for row in conn.execute(
            "SELECT claimed_by FROM fairsched_jobs WHERE id = ANY(%s) AND status = 'running'",
            (jobs,))}


def frozen_while_taken_over(supervisors, db, tmp_path):
    """Two jobs running on one supervisor, frozen until the other runs them both, then woken:
    (the woken supervisor, the jobs)."""
    frozen = supervisors(SPAN, supervisor=LEASE).start()
    frozen_id = frozen.ps()["supervisor"]["id"]
    other = supervisors(SPAN, supervisor=LEASE).start()
    other_id = other.ps()["supervisor"]["id"]
    other.signal(signal.SIGSTOP)  # the jobs go to the first one
    try:
        with psycopg.connect(db, autocommit=True) as conn:
            jobs = [Queue(conn).enqueue("span", {"log": str(tmp_path / "spans.log"),
                                                 "seconds": 15}) for _ in range(2)]
        wait_until(lambda: holders(db, jobs) == {frozen_id}, what="both jobs claimed")
        for job in jobs:  # and started: a claim's answer may still be on its way
            frozen.wait_output(rf"job {job} started")
    finally:
        other.signal(signal.SIGCONT)
    # A heartbeat that renews the lease with both jobs running here: the lease remembers
    # them as those that ran while it ran out.
    since = server_now(db)
    wait_until(lambda: heartbeat_at(db, frozen_id) > since,
               what="a heartbeat with both jobs running")
    frozen.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: holders(db, jobs) == {other_id}, timeout=30,
                   what=lambda: f"both jobs taken over: {holders(db, jobs)}")
    finally:
        frozen.signal(signal.SIGCONT)
    frozen.wait_output("lease had expired")
    return frozen, jobs


def test_a_supervisor_woken_past_its_lease_says_which_of_its_jobs_ran_meanwhile(
        supervisors, db, tmp_path):
    frozen, jobs = frozen_while_taken_over(supervisors, db, tmp_path)
    # Said once its heartbeat, after waking, finds its row gone: wait for that line.
    frozen.wait_output(re.escape(
        f"this supervisor's lease had expired while 2 of its queued jobs ran here "
        f"({jobs[0]}, {jobs[1]}; ended here since): registered again"))
    out = frozen.output()
    assert "while no job of the queue ran here" not in out, out
    # Its first line on waking says why the lease was not renewed: it did not run.
    assert re.search(r"could not renew the 4 s lease \(this supervisor stalled: its timer came "
                     r"\d+ s late; stopped, or starved of CPU\?\)", out), out


def test_a_job_handed_back_after_another_supervisor_took_it_over_is_not_said_returned(
        supervisors, db, tmp_path):
    frozen, jobs = frozen_while_taken_over(supervisors, db, tmp_path)
    for job in jobs:
        frozen.wait_output(rf"job {job} was already taken over by another supervisor \(this "
                           rf"supervisor's lease had expired\): not returned to the queue")
    out = frozen.output()
    assert not any(f"job {job} returned to the queue" in out for job in jobs), out
