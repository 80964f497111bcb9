"""Supervisor rows: heartbeats, leases, rescue of a dead supervisor's jobs; notifications;
delayed jobs; a lost connection."""

from __future__ import annotations

import asyncio
import math

import psycopg
import pytest
from test_store_claim import enqueue, job, run_async, sql, stores

from fairsched.store.aqueue import AsyncStore
from fairsched.store.queue import Queue
from fairsched.store.rows import encode_result


def expire(url: str, store: AsyncStore) -> None:
    """Make a supervisor's lease run out without waiting for it."""
    sql(url, "UPDATE fairsched_supervisors SET heartbeat_at = now() - interval '1 hour'"
             " WHERE id = %s", (store.supervisor_id,))


@run_async
async def test_connect_registers_and_heartbeat_renews(db):
    async with stores(db, lease=7.5, host="node-1") as (store,):
        ((host, pid, lease, fresh),) = sql(
            db, "SELECT host, pid, lease, heartbeat_at >= now() - interval '5 s'"
                " FROM fairsched_supervisors WHERE id = %s", (store.supervisor_id,))
        assert (host, lease, fresh) == ("node-1", 7.5, True)
        expire(db, store)
        assert await store.heartbeat() is True
        ((fresh,),) = sql(db, "SELECT heartbeat_at >= now() - interval '5 s'"
                              " FROM fairsched_supervisors")
        assert fresh
    assert sql(db, "SELECT count(*) FROM fairsched_supervisors") == [(0,)]
    with pytest.raises(ValueError, match="lease must be"):
        await AsyncStore.connect(db, lease=0)


@run_async
async def test_rescue_returns_a_dead_supervisors_jobs(db):
    retried, exhausted, cancelling, other = enqueue(
        db, {"type": "pdf"}, {"type": "pdf", "max_attempts": 1}, {"type": "pdf"}, {"type": "xls"})
    async with stores(db, 3) as (dead, alive, bystander):
        await dead.claim([retried, exhausted, cancelling], {"pdf": 3})
        await bystander.claim([other], {"xls": 3})
        with psycopg.connect(db, autocommit=True) as conn:
            Queue(conn).cancel_job(cancelling)
        notifications = await alive.listen()
        expire(db, dead)
        expire(db, alive)  # its own stale lease is not a reason to rescue itself
        assert await alive.rescue_expired() == {"pending": 1, "failed": 1, "cancelled": 1}
        assert await asyncio.wait_for(anext(notifications), 5) == ("jobs", "pdf")
        assert await alive.rescue_expired() == {}
        # The dead supervisor comes back: its old claims are fenced off.
        assert await dead.complete([(retried, 1, None), (exhausted, 1, None)]) == []
        assert await dead.heartbeat() is False
        assert await dead.heartbeat() is True
    row = job(db, retried)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 1, None)
    assert "stopped heartbeating during attempt 1 of 3" in row["last_error"]
    row = job(db, exhausted)
    assert (row["status"], row["finished_at"] is not None) == ("failed", True)
    assert "attempt 1 of 1" in row["last_error"]
    assert job(db, cancelling)["status"] == "cancelled"
    assert job(db, other)["status"] == "running"


@run_async
async def test_a_rescue_takes_only_those_whose_watched_heartbeat_stood_still(db):
    (job_id,) = enqueue(db, {"type": "pdf"})
    async with stores(db, 2) as (victim, rescuer):
        await victim.claim([job_id], {"pdf": 3})
        expire(db, victim)
        ((_, watched, _),) = await rescuer.peers()
        await victim.heartbeat()  # alive after all: a newer beat than the one watched,
        expire(db, victim)  # which a server clock that jumped ahead makes look old as well
        assert await rescuer.rescue_expired([(victim.supervisor_id, watched)]) == {}
        ((_, watched, _),) = await rescuer.peers()
        assert await rescuer.rescue_expired([(victim.supervisor_id, watched)]) == {"pending": 1}
    assert job(db, job_id)["status"] == "pending"


@run_async
async def test_a_supervisor_that_left_with_jobs_running_is_a_suspect_at_once(db):
    (job_id,) = enqueue(db, {"type": "pdf"})
    async with stores(db) as (rescuer,):
        leaving = await AsyncStore.connect(db)
        await leaving.claim([job_id], {"pdf": 3})
        await leaving.close()  # its row stays, its heartbeat at -infinity
        ((peer_id, beat, _),) = await rescuer.peers()  # readable, though no date
        assert (peer_id, beat) == (leaving.supervisor_id, -math.inf)
        assert await rescuer.rescue_expired([(peer_id, beat)]) == {"pending": 1}
    assert job(db, job_id)["status"] == "pending"


@run_async
async def test_deregistering_with_jobs_left_running_hands_them_back(db):
    ids = enqueue(db, {"type": "pdf"}, {"type": "pdf"})
    async with stores(db) as (other,):
        leaving = await AsyncStore.connect(db)
        await leaving.claim(ids[:1], {"pdf": 3})
        await leaving.close()
        assert await other.rescue_expired() == {"pending": 1}
        idle = await AsyncStore.connect(db)
        await idle.close()
        assert sql(db, "SELECT id FROM fairsched_supervisors") == [(other.supervisor_id,)]
    assert job(db, ids[0])["status"] == "pending"


@run_async
async def test_orphaned_running_jobs_are_rescued_once_old_enough(db):
    (job_id,) = enqueue(db, {"type": "pdf"})
    async with stores(db, 2) as (gone, rescuer):
        await gone.claim([job_id], {"pdf": 3})
        sql(db, "DELETE FROM fairsched_supervisors WHERE id = %s", (gone.supervisor_id,))
        assert await rescuer.rescue_expired() == {}  # might belong to a supervisor just starting
        sql(db, "UPDATE fairsched_jobs SET started_at = now() - interval '5 minutes'")
        assert await rescuer.rescue_expired() == {"pending": 1}
    assert job(db, job_id)["status"] == "pending"


@run_async
async def test_listen_reports_new_jobs_by_type(db):
    async with stores(db) as (store,):
        # `await` subscribes first: jobs enqueued before the first read are not missed.
        notifications = await store.listen()
        enqueue(db, {"type": "a"}, {"type": "b"}, {"type": "a"})
        seen = []
        async for kind, value in notifications:
            seen.append((kind, value))
            if len(seen) == 2:
                break
        assert sorted(seen) == [("jobs", "a"), ("jobs", "b")]
        await notifications.aclose()
        with pytest.raises(psycopg.InterfaceError):
            await anext(notifications)


@run_async
async def test_listen_works_as_a_plain_async_iterator(db):
    async with stores(db) as (store,):
        async def first_notification():
            async for kind, value in store.listen():
                return kind, value

        reader = asyncio.create_task(first_notification())
        # The reader subscribes on its first step: keep enqueueing until it has heard one.
        while not reader.done():
            enqueue(db, {"type": "c"})
            await asyncio.wait([reader], timeout=0.05)
        assert reader.result() == ("jobs", "c")


@run_async
async def test_next_eligible_in_is_the_wait_for_the_earliest_delayed_job(db):
    async with stores(db) as (store,):
        assert await store.next_eligible_in() is None
        enqueue(db, {"type": "a"}, {"type": "a", "delay": 500, "priority": 3},
                {"type": "b", "delay": 100})
        (b_at,) = sql(db, "SELECT min(extract(epoch FROM run_after))::float8"
                          " FROM fairsched_jobs WHERE run_after > now()")[0]
        # The wait, by the server's clock alone: right whatever this host's clock says.
        (server_now,) = sql(db, "SELECT extract(epoch FROM now())::float8")[0]
        assert 99 < await store.next_eligible_in() <= b_at - server_now + 0.001
        sql(db, "DELETE FROM fairsched_jobs WHERE type = 'b'")
        assert 499 < await store.next_eligible_in() <= 500
        sql(db, "DELETE FROM fairsched_jobs WHERE run_after > now()")
        assert await store.next_eligible_in() is None  # a job due now is no wait


@run_async
async def test_the_heartbeat_measures_the_servers_clock_against_this_hosts(db):
    async with stores(db) as (store,):
        await store.heartbeat()
        assert abs(store.clock_offset) < 0.5  # one host, one clock
        # now() is the start of the transaction: inside one begun 1.5 s ago, the server's
        # clock reads 1.5 s behind this host's.
        async with store.conn.transaction():
            await store.conn.execute("SELECT 1")
            await asyncio.sleep(1.5)
            assert await store.heartbeat()
        assert -1.8 < store.clock_offset < -1.2, store.clock_offset


@run_async
async def test_a_lost_connection_is_an_operational_error(db):
    (job_id,) = enqueue(db, {"type": "pdf"})
    async with stores(db) as (store,):
        notifications = await store.listen()
        sql(db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database()")
        with pytest.raises(psycopg.OperationalError):
            await store.claim([job_id], {"pdf": 3})
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(anext(notifications), 5)


@run_async
async def test_after_a_lost_connection_the_same_supervisor_finishes_its_claims(db):
    ids = enqueue(db, {"type": "pdf"}, {"type": "pdf"})
    async with stores(db) as (store,):
        claimed = await store.claim(ids, {"pdf": 3})
        sql(db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = current_database()")
        with pytest.raises(psycopg.OperationalError):
            await store.heartbeat()
        # A new connection under the same supervisor id, as the claim lane makes one.
        again = await AsyncStore.connect(db, supervisor_id=store.supervisor_id, lease=5)
        try:
            assert again.supervisor_id == store.supervisor_id and not again.lease_lost
            for claimed_job, job_id in zip(claimed, ids, strict=True):
                assert await again.complete([(claimed_job.id, 1, encode_result("done"))]) == \
                    [job_id]
        finally:
            await again.close(deregister=False)
        assert sql(db, "SELECT id, lease FROM fairsched_supervisors") == [(store.supervisor_id, 5.0)]
    assert [job(db, i)["status"] for i in ids] == ["succeeded", "succeeded"]


@run_async
async def test_connections_give_up_on_a_silent_network_within_the_lease(db):
    def options(conn) -> dict:
        return {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}

    async with stores(db, lease=9) as (store,):
        listening = await store.listen().start()
        try:
            for conn in (store.conn, listening._conn):
                opts = options(conn)
                assert opts["tcp_user_timeout"] == "3000" and opts["keepalives_idle"] == "3"
                assert opts["keepalives"] == "1" and opts["keepalives_count"] == "3"
        finally:
            await listening.aclose()
        again = await AsyncStore.connect(db, lease=9, supervisor_id=store.supervisor_id)
        try:  # a reconnection's too
            assert options(again.conn)["tcp_user_timeout"] == "3000"
        finally:
            await again.close(deregister=False)
    # What the operator put in the URL stays.
    own = psycopg.conninfo.make_conninfo(db, tcp_user_timeout="500")
    async with stores(own, lease=9) as (store,):
        assert options(store.conn)["tcp_user_timeout"] == "500"
