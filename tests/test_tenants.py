"""Fair shares between tenants, end to end through the actor (tests/actor_harness.py): one
tenant's flood delays another's jobs by about a job's duration, not by the flood."""

import asyncio

import psycopg
import pytest

from fairsched.store.queue import Queue

TWO_SLOTS = """
[[worker]]
name = "pdf"
types = ["pdf"]
processes = 2
handler = "sup_handlers:slow"
"""


def test_a_tenants_few_jobs_do_not_wait_behind_anothers_flood(actor):
    async def scenario(a):
        def enqueue(tenant: str, n: int) -> list[int]:
            with psycopg.connect(a.database_url, autocommit=True) as conn:
                return Queue(conn).enqueue_many(
                    [{"type": "pdf", "payload": {"seconds": 0.1}, "tenant": tenant}] * n)

        flood = await asyncio.to_thread(enqueue, "a", 300)
        few = await asyncio.to_thread(enqueue, "b", 4)

        def done():
            rows = [a_job for a_job in map(read, few)]
            return rows if all(r["status"] == "succeeded" for r in rows) else None

        def read(job_id):
            with psycopg.connect(a.database_url, autocommit=True) as conn:
                return Queue(conn).get_job(job_id)

        rows = await a.until(lambda: done(), timeout=30, what="tenant b's four jobs succeeded")
        waits = [(r["finished_at"] - r["created_at"]).total_seconds() for r in rows]
        # First in, first out, they would wait for the 300 jobs before them: 15 s on two slots.
        assert max(waits) < 2.0, waits
        with psycopg.connect(a.database_url, autocommit=True) as conn:
            (left,) = conn.execute("SELECT count(*) FROM fairsched_jobs WHERE id = ANY(%s)"
                                   " AND status = 'pending'", (flood,)).fetchone()
        assert left > 200  # the flood is far from done: b did not just come after it

    actor(TWO_SLOTS, scenario)


def test_the_planner_shares_the_usage_each_fetch_read_decayed_since():
    from fairsched.store.rows import Candidate
    from fairsched.supervisor.waiting import WaitingJobs

    waiting = WaitingJobs({"pdf": 0})
    waiting.add_fetched([Candidate(1, "pdf", 0, 0.0, tenant="a", usage=30.0),
                         Candidate(2, "pdf", 0, 0.0, tenant=None, usage=10.0)], set())
    assert waiting.tenant_ids == {"a": 0, "": 1}
    assert list(waiting.tenant_shares(600.0)) == pytest.approx([0.75, 0.25], rel=1e-6)
    # Read one half-life earlier than the default tenant's: it weighs half as much now.
    waiting.usage_at[0] -= 600.0
    assert list(waiting.tenant_shares(600.0)) == pytest.approx([0.6, 0.4], rel=1e-6)
