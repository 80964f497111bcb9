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


@pytest.mark.parametrize("b_full", [True, False])
def test_a_tenant_whose_cached_jobs_ran_out_makes_its_type_looked_at_again(b_full):
    """Property 2 between fetches: the cached jobs of a type are its best only while every
    tenant the fetch found more of than it read still has some cached."""
    from fairsched import core
    from fairsched.store.rows import Candidate
    from fairsched.supervisor.waiting import WaitingJobs

    waiting = WaitingJobs({"pdf": 0})
    rows = [Candidate(1, "pdf", 0, 0.0, tenant="a", usage=50.0),
            Candidate(2, "pdf", 0, 0.0, tenant="a", usage=50.0),
            Candidate(3, "pdf", 0, 1.0, tenant="b", usage=0.0)]
    if b_full:  # b had as many as the fetch reads of one tenant: it may have more
        rows.append(Candidate(4, "pdf", 0, 1.0, tenant="b", usage=0.0))
    waiting.add_fetched(rows, set(), {"pdf": 2})
    pool = core.SlotPool()
    pool.add_slot(1, 1, [0])
    pool.add_slot(2, 1, [0])
    _, _, ids, _ = waiting.plan(pool, 10.0, core.Weights(), 0.0, True, "greedy")
    # b has used nothing: its jobs go first, though a's are older.
    assert list(ids)[:1] == [3]
    assert waiting.has_queued("pdf") is (not b_full)
    waiting.forget("pdf")  # what the next fetch does first
    assert not waiting.has_queued("pdf")
    waiting.add_fetched(rows[:2], set(), {"pdf": 2})
    assert waiting.has_queued("pdf")
