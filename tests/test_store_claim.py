"""Optimistic claims and fenced outcomes: complete, fail, cancel_finish, release."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json

import psycopg
import pytest

from fairsched.store.aqueue import DEFAULT_MAX_ATTEMPTS, AsyncStore, _keyed_by_id
from fairsched.store.queue import Queue
from fairsched.store.rows import encode_result
from fairsched.store.statements import (
    CANCEL_FINISH_SQL,
    CLAIM_SQL,
    COMPLETE_SQL,
    FAIL_SQL,
    RELEASE_SQL,
)


def run_async(test):
    """Run an async test body in its own event loop."""
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return wrapper


@contextlib.asynccontextmanager
async def stores(url: str, n: int = 1, **kwargs):
    opened = []
    try:
        for _ in range(n):
            opened.append(await AsyncStore.connect(url, **kwargs))
        yield opened
    finally:
        for store in opened:
            await store.close()


def enqueue(url: str, *jobs: dict) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return Queue(conn).enqueue_many(jobs)


def job(url: str, job_id: int) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        return Queue(conn).get_job(job_id)


def sql(url: str, statement: str, params=()) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


@run_async
async def test_each_job_is_won_by_exactly_one_of_two_racing_supervisors(db):
    ids = enqueue(db, *[{"type": "pdf"}] * 300)
    async with stores(db, 2) as (a, b):
        won_a, won_b = [], []
        # Overlapping batches in opposite orders, sent at the same time on two connections.
        for start in range(0, 300, 60):
            batch = ids[start:start + 60]
            got_a, got_b = await asyncio.gather(a.claim(batch, {"pdf": 2}),
                                                b.claim(batch[::-1], {"pdf": 2}))
            won_a += [j.id for j in got_a]
            won_b += [j.id for j in got_b]
    assert not set(won_a) & set(won_b)
    assert sorted(won_a + won_b) == ids
    assert len(won_a) == len(set(won_a))
    owners = dict(sql(db, "SELECT id, claimed_by FROM fairsched_jobs"))
    # Which one wins how many depends on timing (one may even win them all); each row is
    # owned by the one that won it.
    assert all(owners[i] == a.supervisor_id for i in won_a)
    assert all(owners[i] == b.supervisor_id for i in won_b)


@run_async
async def test_claim_returns_won_jobs_in_the_order_asked_with_the_attempt_counted(db):
    ids = enqueue(db, {"type": "pdf", "payload": {"n": 1}}, {"type": "xls", "max_attempts": 7},
                  {"type": "idx"}, {"type": "pdf", "delay": 3600}, {"type": "pdf"})
    sql(db, "UPDATE fairsched_jobs SET status = 'cancelled' WHERE id = %s", (ids[4],))
    async with stores(db) as (store,):
        won = await store.claim([ids[2], ids[0], ids[1], ids[3], ids[4], 999], {"pdf": 5, "idx": 2})
    assert [j.id for j in won] == [ids[2], ids[0], ids[1]]
    assert [j.attempts for j in won] == [1, 1, 1]
    # The job's own value, else the worker's default for its type, else the store's fallback.
    assert {j.id: j.max_attempts for j in won} == {ids[0]: 5, ids[1]: 7, ids[2]: 2}
    assert json.loads(won[1].payload_json) == {"n": 1}  # the text, passed on unparsed
    assert won[0].payload_json is None
    row = job(db, ids[0])
    assert row["status"] == "running" and row["started_at"] is not None
    assert row["max_attempts"] == 5
    async with stores(db) as (store,):
        assert await store.claim([], {}) == []
    ids = enqueue(db, {"type": "other"})
    async with stores(db) as (store,):
        (claimed,) = await store.claim(ids, {})
    assert claimed.max_attempts == DEFAULT_MAX_ATTEMPTS


@run_async
async def test_a_stale_attempt_cannot_complete(db):
    (job_id,) = enqueue(db, {"type": "pdf"})
    async with stores(db, 2) as (a, b):
        (first,) = await a.claim([job_id], {"pdf": 3})
        assert await a.fail(job_id, first.attempts, "flaky", permanent=False, retry_delay=0) == "pending"
        (second,) = await a.claim([job_id], {"pdf": 3})
        assert second.attempts == 2
        assert await a.complete([(job_id, 1, encode_result({"stale": True}))]) == []
        assert await b.complete([(job_id, 2, encode_result({"other": True}))]) == []
        assert await a.fail(job_id, 1, "late", permanent=True, retry_delay=0) is None
        assert await a.cancel_finish(job_id, 1) is None
        assert await a.release([(job_id, 1)]) == {}
        assert job(db, job_id)["status"] == "running"
        assert await a.complete([(job_id, 2, encode_result({"pages": 3}))]) == [job_id]
        assert await a.complete([(job_id, 2, encode_result({"again": True}))]) == []
    row = job(db, job_id)
    assert (row["status"], row["result"], row["attempts"]) == ("succeeded", {"pages": 3}, 2)
    assert row["finished_at"] is not None and row["last_error"] == "flaky"


@run_async
async def test_a_late_write_for_a_handed_back_claim_misses_the_next_claim(db):
    # Handed back, a job keeps its attempt count: the next claim has the same attempts, but
    # not the same claim number, and a write meant for the first claim (sent again after a
    # lost answer, say) leaves the second alone.
    (job_id,) = enqueue(db, {"type": "pdf"})
    async with stores(db) as (a,):
        (first,) = await a.claim([job_id], {"pdf": 3})
        assert await a.release([(job_id, first.claim)]) == {job_id: "pending"}
        (second,) = await a.claim([job_id], {"pdf": 3})
        assert (second.attempts, second.claim) == (first.attempts, first.claim + 1)
        assert await a.release([(job_id, first.claim)]) == {}
        assert await a.complete([(job_id, first.claim, encode_result("stale"))]) == []
        assert await a.fail(job_id, first.claim, "stale", permanent=True, retry_delay=0) is None
        assert job(db, job_id)["status"] == "running"
        assert await a.complete([(job_id, second.claim, encode_result("done"))]) == [job_id]
    assert (job(db, job_id)["status"], job(db, job_id)["attempts"]) == ("succeeded", 1)


@run_async
async def test_complete_writes_a_batch_in_one_call(db):
    ids = enqueue(db, *[{"type": "pdf"}] * 5)
    async with stores(db) as (store,):
        await store.claim(ids, {"pdf": 1})
        done = await store.complete([(i, 1, encode_result({"i": i})) for i in ids[:4]]
                                    + [(ids[4], 9, None)])
    assert sorted(done) == ids[:4]
    assert [job(db, i)["result"] for i in ids[:4]] == [{"i": i} for i in ids[:4]]
    assert job(db, ids[4])["status"] == "running"


@run_async
async def test_a_completion_written_twice_is_known_for_its_own(db):
    # A completion whose answer was lost with its connection is sent again: the fence refuses
    # the second write, and completed_already tells it apart from a job no longer ours.
    mine, taken = enqueue(db, {"type": "pdf"}, {"type": "pdf"})
    async with stores(db, 2) as (store, other):
        await store.claim([mine, taken], {"pdf": 1})
        assert await store.complete([(mine, 1, None)]) == [mine]
        assert await store.complete([(mine, 1, None)]) == []
        sql(db, "UPDATE fairsched_jobs SET claimed_by = %s WHERE id = %s",
            (other.supervisor_id, taken))  # rescued and taken over by another
        await other.complete([(taken, 1, None)])
        assert await store.completed_already([(mine, 1), (taken, 1)]) == {mine}
        assert await store.completed_already([(mine, 2)]) == set()


@run_async
async def test_a_failure_written_twice_is_known_for_its_own(db):
    # The same for a failed attempt: the second write is refused, failed_already tells what the
    # first one left, and a row rescued or claimed again since is not taken for ours.
    retried, final, rescued = enqueue(db, {"type": "pdf"}, {"type": "pdf", "max_attempts": 1},
                                      {"type": "pdf"})
    async with stores(db) as (store,):
        await store.claim([retried, final, rescued], {"pdf": 3})
        for job_id in (retried, final):
            assert await store.fail(job_id, 1, "boom", permanent=False, retry_delay=0) is not None
            assert await store.fail(job_id, 1, "boom", permanent=False, retry_delay=0) is None
        assert await store.failed_already(retried, 1, "boom") == "pending"
        assert await store.failed_already(final, 1, "boom") == "failed"
        assert await store.failed_already(retried, 1, "another error") is None
        await store.claim([retried], {"pdf": 3})  # its second claim
        assert await store.failed_already(retried, 1, "boom") is None
        sql(db, "UPDATE fairsched_jobs SET status = 'pending', claimed_by = NULL,"
                " last_error = 'supervisor 1 stopped heartbeating' WHERE id = %s", (rescued,))
        assert await store.failed_already(rescued, 1, "boom") is None


@run_async
async def test_an_outbox_failure_whose_answer_was_lost_is_not_called_unrecorded(db, caplog):
    from fairsched.supervisor.outbox import Failure, Outbox

    mine, taken = enqueue(db, {"type": "pdf"}, {"type": "pdf"})
    async with stores(db) as (store,):
        await store.claim([mine, taken], {"pdf": 3})
        await store.fail(mine, 1, "boom", permanent=True, retry_delay=0)  # its answer "lost"
        sql(db, "UPDATE fairsched_jobs SET status = 'pending', claimed_by = NULL,"
                " last_error = 'supervisor 1 stopped heartbeating' WHERE id = %s", (taken,))
        outbox = Outbox(failures=[Failure(job_id, 1, "boom", permanent=True, retry_delay=0)
                                  for job_id in (mine, taken)])
        with caplog.at_level("WARNING", logger="fairsched.queue"):
            await outbox.write(store)
    assert not outbox and job(db, mine)["status"] == "failed"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].endswith(f"expired while it ran): {taken}"), warnings


@run_async
async def test_fail_retries_later_then_fails_for_good(db):
    (job_id,) = enqueue(db, {"type": "pdf", "max_attempts": 3})
    async with stores(db) as (store,):
        (claimed,) = await store.claim([job_id], {"pdf": 9})
        status = await store.fail(job_id, claimed.attempts, "timeout", permanent=False,
                                  retry_delay=30)
        assert status == "pending"
        row = job(db, job_id)
        (future,) = sql(db, "SELECT run_after > now() + interval '29 seconds'"
                            " FROM fairsched_jobs WHERE id = %s", (job_id,))[0]
        assert future and row["claimed_by"] is None and row["last_error"] == "timeout"
        # Not eligible yet: neither fetched nor claimable.
        assert await store.fetch({"pdf": 1}, 64.0) == []
        assert await store.claim([job_id], {"pdf": 9}) == []
        for attempt in (2, 3):
            sql(db, "UPDATE fairsched_jobs SET run_after = now() WHERE id = %s", (job_id,))
            (claimed,) = await store.claim([job_id], {"pdf": 9})
            assert claimed.attempts == attempt
            status = await store.fail(job_id, attempt, f"timeout {attempt}", permanent=False,
                                      retry_delay=30)
        assert status == "failed"
    row = job(db, job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("failed", 3, "timeout 3")
    assert row["finished_at"] is not None and row["claimed_by"] is not None


@run_async
async def test_a_permanent_error_fails_at_once(db):
    (job_id,) = enqueue(db, {"type": "pdf"})
    async with stores(db) as (store,):
        await store.claim([job_id], {"pdf": 5})
        assert await store.fail(job_id, 1, "bad input", permanent=True, retry_delay=10) == "failed"
        with pytest.raises(ValueError, match="retry_delay"):
            await store.fail(job_id, 1, "x", permanent=False, retry_delay=-1)
    assert job(db, job_id)["status"] == "failed"


@run_async
async def test_release_gives_the_attempt_back_and_keeps_the_jobs_age(db):
    ids = enqueue(db, {"type": "pdf"}, {"type": "pdf"})
    before = {i: job(db, i)["run_after"] for i in ids}
    async with stores(db) as (store,):
        await store.claim(ids, {"pdf": 3})
        assert await store.release([(ids[0], 1), (ids[1], 2)]) == {ids[0]: "pending"}
        again = await store.fetch({"pdf": 1}, 64.0)
    row = job(db, ids[0])
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)
    assert row["run_after"] == before[ids[0]]
    assert ids[0] in [j.id for j in again]
    assert job(db, ids[1])["status"] == "running"


@run_async
async def test_cancel_of_a_running_job_reaches_its_supervisor(db):
    ids = enqueue(db, {"type": "pdf"}, {"type": "pdf"}, {"type": "pdf"})
    async with stores(db) as (store,):
        await store.claim(ids, {"pdf": 3})
        notifications = await store.listen()
        with psycopg.connect(db, autocommit=True) as conn:
            for job_id in ids:
                assert Queue(conn).cancel_job(job_id) == "running"
        seen = [await asyncio.wait_for(anext(notifications), 5) for _ in ids]
        assert seen == [("cancel", i) for i in ids]
        assert await store.cancel_finish(ids[0], 1) == "cancelled"
        # The worker failed or was shut down after the request: the job still ends cancelled.
        assert await store.fail(ids[1], 1, "interrupted", permanent=False, retry_delay=0) == "cancelled"
        assert await store.release([(ids[2], 1)]) == {ids[2]: "cancelled"}
    assert [job(db, i)["status"] for i in ids] == ["cancelled"] * 3
    assert not any(job(db, i)["cancel_requested"] for i in ids)


@run_async
async def test_a_result_with_a_nul_is_stored_and_one_that_is_no_json_never_reaches_it(db):
    ids = enqueue(db, *[{"type": "pdf"}] * 2)
    # Refused before the table: the supervisor fails such a job for good instead, saying so.
    with pytest.raises(ValueError, match="result is not JSON"):
        encode_result(float("nan"))
    async with stores(db) as (store,):
        await store.claim(ids, {"pdf": 3})
        done = await store.complete([(ids[0], 1, encode_result({"ok": 1})),
                                     (ids[1], 1, encode_result({"text": "a\x00b"}))])
    assert sorted(done) == ids
    assert job(db, ids[0])["status"] == "succeeded"
    # A NUL character is JSON all the same: stored, and given back as it was.
    assert (job(db, ids[1])["status"], job(db, ids[1])["result"]) == ("succeeded",
                                                                     {"text": "a\x00b"})


@pytest.mark.parametrize("batch", [32, 512, 1024])
@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
def test_claims_and_outcomes_find_their_rows_by_primary_key(db, plan_mode, batch):
    """Statistics taken right after a bulk enqueue (every row pending, or finished) must not
    lead the planner into walking a partial index, dead entries and all, for each batch, nor
    into comparing every row of the table (or of the batch) with every row of the batch: a
    generic plan that joined a claim's rows to the rows it locked took 100 ms for 1,024 jobs."""
    from tests.test_store_fetch import explain_prepared, plan_nodes

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("INSERT INTO fairsched_jobs (type) SELECT 'noop' FROM generate_series(1, 60000)")
        conn.execute("INSERT INTO fairsched_jobs (type, status, finished_at) SELECT 'noop',"
                     " 'succeeded', now() FROM generate_series(1, 20000)")
        conn.execute("ANALYZE fairsched_jobs")
        me = conn.execute("INSERT INTO fairsched_supervisors (host, pid, lease)"
                          " VALUES ('here', 1, 15) RETURNING id").fetchone()[0]
        conn.execute("UPDATE fairsched_jobs SET status = 'running', claimed_by = %s, attempts = 1,"
                     " claims = 1 WHERE id <= 5000", (me,))
        running, pending = list(range(1, batch + 1)), list(range(9000, 9000 + batch))
        statements = {
            "claim": (CLAIM_SQL, {"me": me, "ids": pending, "defaults": "{}", "fallback": 3}),
            "complete": (COMPLETE_SQL, {"me": me, "ids": running,
                                        "done": _keyed_by_id((i, "[1,null]") for i in running),
                                        "half_life": 600.0, "limited": []}),
            "release": (RELEASE_SQL, {"me": me, "ids": running,
                                      "claims": _keyed_by_id((i, "1") for i in running)}),
            "fail": (FAIL_SQL, {"me": me, "id": running[-1], "claim": 1, "error": "boom",
                                "permanent": False, "delay": 1.0, "half_life": 600.0}),
            "cancel": (CANCEL_FINISH_SQL, {"me": me, "id": running[-1], "claim": 1,
                                           "half_life": 600.0}),
        }
        for name, (statement, params) in statements.items():
            nodes = list(plan_nodes(explain_prepared(conn, statement, params, plan_mode)))
            scans = {(n["Node Type"], n.get("Index Name")) for n in nodes
                     if n.get("Relation Name") == "fairsched_jobs"
                     and n["Node Type"] != "ModifyTable"}
            assert scans == {("Index Scan", "fairsched_jobs_pkey")}, (name, scans)
            compared = sum(n.get("Rows Removed by Join Filter", 0) for n in nodes)
            assert compared == 0, (name, compared)
