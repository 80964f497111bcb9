"""The supervisor's asynchronous side of the job table: fetch, claim, finish, heartbeat, rescue.

Claims are optimistic (one UPDATE ... WHERE status = 'pending' per batch) and every later write
is fenced on (claimed_by, claims), `claims` counting every claim of the job: a supervisor that
lost a job, to a rescue after its lease expired, to a retry or to a hand-back and a new claim,
can no longer change it. Errors from a lost connection surface as
psycopg.OperationalError; the caller reconnects.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from fairsched.store.queue import encode_json, storable_text
from fairsched.store.schema import CANCEL_CHANNEL, JOBS_CHANNEL, MAX_PRIORITY

# Used when a claimed job has no max_attempts and its type is missing from the defaults.
DEFAULT_MAX_ATTEMPTS = 3
CONNECT_TIMEOUT = 10
MAX_ERROR = 65536  # characters of last_error kept

# Property 2 of the design: per type, the k best jobs by score. For queued jobs the score order
# is the ascending order of (eligible_epoch - priority * W_p / W_a); within one priority level
# that is run_after order, so the k best overall are among the k oldest of each of the eleven
# levels, and each level is one short range scan of the partial index. Only what scoring needs
# is read, all of it in that index: the payload of the jobs won comes back with the claim.
FETCH_SQL = f"""
SELECT c.id, c.type, c.priority, extract(epoch FROM c.run_after)::float8
  FROM unnest(%(types)s::text[], %(limits)s::integer[]) AS want(type, k)
 CROSS JOIN LATERAL (
       SELECT j.*
         FROM generate_series(0, {MAX_PRIORITY}) AS level(priority)
        CROSS JOIN LATERAL (
              SELECT id, type, priority, run_after
                FROM fairsched_jobs
               WHERE status = 'pending' AND type = want.type
                 AND priority = level.priority AND run_after <= now()
               ORDER BY run_after, id
               LIMIT want.k) AS j
        ORDER BY extract(epoch FROM j.run_after)::float8 - j.priority * %(pps)s::float8, j.id
        LIMIT want.k) AS c
 ORDER BY extract(epoch FROM c.run_after)::float8 - c.priority * %(pps)s::float8, c.id
"""

# Claims and outcomes name their rows by id, and must find them through the primary key. A
# plain `status = 'pending'` (or 'running') would let the planner pick a partial index by its
# predicate and walk every entry in it, dead ones included; with statistics taken while the
# queue looked different (all pending, nothing running), it does, and a 1 ms statement takes
# 10 ms. The status to match comes from a subquery the planner cannot see into (OFFSET 0), so
# the condition proves no index predicate and the primary key is the only way in.
#
# Outcomes join nothing. Those same statistics say no row has claimed_by set, so the planner
# believes `claimed_by = me` leaves one row and puts the table on the outer side of a nested
# loop over the batch: rows x batch comparisons, over a second for 512 outcomes. Instead the
# rows come from `id = ANY(ids)` through the primary key, and each one's claim (and result)
# is looked up in a jsonb object keyed by job id: linear in the batch whatever the estimates.
# The claim names its ids on the table's side of its join too, or a large batch is hashed
# against a scan of the whole table.
def _fence(status: str) -> str:
    return f"(SELECT '{status}'::text OFFSET 0) AS fence(status)"


# SKIP LOCKED: a row another supervisor is claiming right now is a lost claim, not a wait.
CLAIM_SQL = f"""
UPDATE fairsched_jobs AS j
   SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1, claimed_by = %(me)s,
       started_at = now(), finished_at = NULL, cancel_requested = false,
       max_attempts = coalesce(j.max_attempts, (%(defaults)s::jsonb ->> j.type)::integer,
                               %(fallback)s)
  FROM (SELECT p.id FROM fairsched_jobs AS p, {_fence("pending")}
         WHERE p.id = ANY(%(ids)s::bigint[]) AND p.status = fence.status
           AND p.run_after <= now()
         ORDER BY p.id FOR UPDATE OF p SKIP LOCKED) AS won
 WHERE j.id = won.id AND j.id = ANY(%(ids)s::bigint[])
RETURNING j.id, j.type, j.priority, extract(epoch FROM j.run_after)::float8,
          j.payload::text, j.attempts, j.max_attempts, j.claims
"""

COMPLETE_SQL = f"""
UPDATE fairsched_jobs AS j
   SET status = 'succeeded', result = nullif(%(done)s::jsonb -> j.id::text -> 1, 'null'),
       finished_at = now(), cancel_requested = false
  FROM {_fence("running")}
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = fence.status AND j.claimed_by = %(me)s
   AND j.claims = (%(done)s::jsonb -> j.id::text ->> 0)::integer
RETURNING j.id
"""

# A failure after a cancel request ends the job cancelled: the user asked for it to stop.
FAIL_SQL = f"""
WITH failed AS (
    UPDATE fairsched_jobs AS j SET
        status = CASE WHEN cancel_requested THEN 'cancelled'
                      WHEN %(permanent)s OR attempts >= max_attempts THEN 'failed'
                      ELSE 'pending' END,
        last_error = %(error)s,
        run_after = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                         THEN run_after
                         ELSE now() + %(delay)s * interval '1 second' END,
        finished_at = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                           THEN now() END,
        started_at = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                          THEN started_at END,
        claimed_by = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                          THEN claimed_by END,
        cancel_requested = false
      FROM {_fence("running")}
     WHERE j.id = %(id)s AND j.status = fence.status
       AND j.claimed_by = %(me)s AND j.claims = %(claim)s
    RETURNING j.type, j.status)
SELECT status, CASE WHEN status = 'pending' THEN pg_notify('fairsched_jobs', type) END
  FROM failed
"""

CANCEL_FINISH_SQL = f"""
UPDATE fairsched_jobs AS j
   SET status = 'cancelled', finished_at = now(), cancel_requested = false
  FROM {_fence("running")}
 WHERE j.id = %(id)s AND j.status = fence.status
   AND j.claimed_by = %(me)s AND j.claims = %(claim)s
RETURNING j.status
"""

# Back to pending without spending the attempt, keeping run_after so the job keeps its age.
RELEASE_SQL = f"""
WITH released AS (
    UPDATE fairsched_jobs AS j SET
        status = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'pending' END,
        attempts = j.attempts - 1, started_at = NULL,
        finished_at = CASE WHEN j.cancel_requested THEN now() END,
        claimed_by = CASE WHEN j.cancel_requested THEN j.claimed_by END,
        cancel_requested = false
      FROM {_fence("running")}
     WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = fence.status AND j.claimed_by = %(me)s
       AND j.claims = (%(claims)s::jsonb ->> j.id::text)::integer
    RETURNING j.id, j.type, j.status)
SELECT id, CASE WHEN status = 'pending' THEN pg_notify('fairsched_jobs', type) END
  FROM released
"""

# The running jobs of the supervisors just found dead, and orphans: running jobs whose
# supervisor row is gone for another reason (deleted by hand). An orphan must be older than
# ORPHAN_AGE, because a supervisor registered after this statement's snapshot may own it.
RESCUE_SQL = """
WITH rescued AS (
    UPDATE fairsched_jobs AS j SET
        status = CASE WHEN j.cancel_requested THEN 'cancelled'
                      WHEN j.attempts >= j.max_attempts THEN 'failed'
                      ELSE 'pending' END,
        last_error = CASE WHEN j.cancel_requested THEN j.last_error
                          ELSE 'supervisor ' || j.claimed_by || ' stopped heartbeating during'
                               || ' attempt ' || j.attempts || ' of ' || j.max_attempts END,
        finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                           THEN now() END,
        started_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                          THEN j.started_at END,
        claimed_by = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                          THEN j.claimed_by END,
        run_after = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                         THEN j.run_after ELSE now() END,
        cancel_requested = false
     WHERE j.status = 'running'
       AND (j.claimed_by = ANY(%(dead)s::bigint[])
            OR (j.claimed_by IS DISTINCT FROM %(me)s
                AND j.started_at < now() - %(orphan_age)s * interval '1 second'
                AND NOT EXISTS (SELECT 1 FROM fairsched_supervisors s
                                 WHERE s.id = j.claimed_by)))
    RETURNING j.type, j.status
), notified AS (
    SELECT pg_notify('fairsched_jobs', type)
      FROM (SELECT DISTINCT type FROM rescued WHERE status = 'pending') AS t
)
SELECT (SELECT count(*) FROM rescued), (SELECT count(*) FROM notified)
"""
ORPHAN_AGE = 60.0

# Earliest future run_after, one index probe per (type, priority); with no types given, the
# pending types are walked through the index too (a loose index scan).
NEXT_ELIGIBLE_SQL = f"""
WITH RECURSIVE pending_types(type) AS (
    (SELECT type FROM fairsched_jobs WHERE status = 'pending' ORDER BY type LIMIT 1)
    UNION ALL
    SELECT (SELECT f.type FROM fairsched_jobs f
             WHERE f.status = 'pending' AND f.type > t.type ORDER BY f.type LIMIT 1)
      FROM pending_types t WHERE t.type IS NOT NULL
), wanted(type) AS (
    SELECT type FROM pending_types WHERE type IS NOT NULL AND %(types)s::text[] IS NULL
    UNION ALL
    SELECT unnest(%(types)s::text[])
)
SELECT extract(epoch FROM min(next.run_after))::float8,
       extract(epoch FROM min(next.run_after) - now())::float8
  FROM wanted
 CROSS JOIN generate_series(0, {MAX_PRIORITY}) AS level(priority)
 CROSS JOIN LATERAL (
       SELECT run_after FROM fairsched_jobs
        WHERE status = 'pending' AND type = wanted.type AND priority = level.priority
          AND run_after > now()
        ORDER BY run_after LIMIT 1) AS next
"""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending job as fetch returns it: what its score needs, without its payload."""

    id: int
    type: str
    priority: int
    eligible_at: float  # epoch seconds: created, or its retry's run_after


@dataclass(frozen=True, slots=True)
class QueuedJob(Candidate):
    """A job just claimed: a candidate's fields, its payload and attempts (this one counted)."""

    payload_json: str | None  # the payload's JSON text as stored; None for SQL NULL
    attempts: int
    max_attempts: int | None
    claim: int  # this claim's number: what its outcome is fenced on


class AsyncStore:
    """One supervisor's connection to the job table; create with `await AsyncStore.connect(...)`."""

    def __init__(self, conn: psycopg.AsyncConnection, url: str, supervisor_id: int,
                 lease: float, host: str):
        self.conn = conn
        self.url = url
        self.supervisor_id = supervisor_id
        self.lease = lease
        self.host = host
        # Set by a reconnect that found this supervisor's row gone: its jobs were rescued.
        self.lease_lost = False
        # The server's clock minus this host's, as of the last heartbeat: job times read from
        # the table (created_at, run_after) less this are times of this host's clock.
        self.clock_offset = 0.0
        self._listeners: set[Notifications] = set()

    @classmethod
    async def connect(cls, url: str, *, lease: float = 15.0, host: str | None = None,
                      supervisor_id: int | None = None) -> AsyncStore:
        """Connect and register a supervisor row; heartbeat well within `lease` seconds.

        After a lost connection, pass the old `supervisor_id` to carry on as the same
        supervisor: its claims stay its own, so completions written after the reconnect
        still pass the fence.
        """
        if not isinstance(lease, int | float) or not math.isfinite(lease) or lease <= 0:
            raise ValueError(f"lease must be a number of seconds > 0, got {lease!r}")
        host = host or socket.gethostname()
        conn = await open_connection(url, float(lease))
        renewed: float | None = 0.0
        try:
            if supervisor_id is None:
                cur = await conn.execute(
                    "INSERT INTO fairsched_supervisors (host, pid, lease) VALUES (%s, %s, %s)"
                    " RETURNING id", (host, os.getpid(), float(lease)))
                (supervisor_id,) = await cur.fetchone()
            else:
                renewed = await _renew(conn, supervisor_id, host, float(lease))
        except BaseException:
            await conn.close()
            raise
        store = cls(conn, url, supervisor_id, float(lease), host)
        store.lease_lost = renewed is None
        return store

    async def reconnect(self) -> None:
        """Replace a lost connection, staying the same supervisor (see connect)."""
        old = self.conn
        conn = await open_connection(self.url, self.lease)
        try:
            self.lease_lost = await _renew(conn, self.supervisor_id, self.host, self.lease) is None
        except BaseException:
            await conn.close()
            raise
        self.conn = conn
        await old.close()

    async def heartbeat(self) -> bool:
        """Renew the lease. False: it had expired and the row was rescued; it is registered
        again under the same id, and the jobs it lost can no longer be finished by it."""
        sent = time.time()
        server_now = await _renew(self.conn, self.supervisor_id, self.host, self.lease)
        if server_now is None:
            return False
        self.clock_offset = server_now - (sent + time.time()) / 2
        return True

    async def peers(self) -> list[tuple[int, float, float]]:
        """(id, heartbeat_at as epoch seconds, lease) of every other registered supervisor;
        -inf for one that deregistered with jobs still running (close())."""
        cur = await self.conn.execute(
            "SELECT id, extract(epoch FROM heartbeat_at)::float8, lease"
            " FROM fairsched_supervisors WHERE id <> %s", (self.supervisor_id,))
        return await cur.fetchall()

    async def rescue_expired(self, suspects: Iterable[tuple[int, float]] | None = None) -> int:
        """Hand back the running jobs of supervisors whose lease expired; return how many.

        With `suspects`, (id, heartbeat_at epoch) pairs the caller has watched stand still for a
        whole lease on its own clock, only those, and only while their heartbeat is still
        the one watched: then a step of the database server's clock cannot make live
        supervisors look dead.
        """
        async with self.conn.transaction():
            if suspects is None:
                cur = await self.conn.execute(
                    "DELETE FROM fairsched_supervisors"
                    " WHERE id <> %s AND heartbeat_at < now() - lease * interval '1 second'"
                    " RETURNING id", (self.supervisor_id,))
            else:
                suspects = list(suspects)
                cur = await self.conn.execute(
                    "DELETE FROM fairsched_supervisors s"
                    " USING unnest(%s::bigint[], %s::float8[]) AS seen(id, heartbeat_at)"
                    " WHERE s.id = seen.id AND s.id <> %s"
                    " AND extract(epoch FROM s.heartbeat_at)::float8 = seen.heartbeat_at"
                    " AND s.heartbeat_at < now() - s.lease * interval '1 second' RETURNING s.id",
                    ([i for i, _ in suspects], [h for _, h in suspects], self.supervisor_id))
            dead = [row[0] for row in await cur.fetchall()]
            cur = await self.conn.execute(RESCUE_SQL, {
                "dead": dead, "me": self.supervisor_id, "orphan_age": ORPHAN_AGE})
            (moved, _) = await cur.fetchone()
        return moved

    async def fetch(self, free_by_type: Mapping[str, int],
                    priority_per_second: float) -> list[Candidate]:
        """Up to 2 x free slots candidates per type, best score first across all types."""
        if not math.isfinite(priority_per_second) or priority_per_second < 0:
            raise ValueError(f"priority_per_second must be >= 0, got {priority_per_second!r}")
        wanted = [(t, 2 * n) for t, n in free_by_type.items() if n > 0]
        if not wanted:
            return []
        cur = await self.conn.execute(FETCH_SQL, {
            "types": [t for t, _ in wanted], "limits": [k for _, k in wanted],
            "pps": float(priority_per_second)})
        return [Candidate(*row) for row in await cur.fetchall()]

    async def claim(self, ids: list[int], default_max_attempts: Mapping[str, int]) -> list[QueuedJob]:
        """Claim the jobs still pending among `ids` in one statement; return those won, in the
        order of `ids`, with attempts already counting this one."""
        if not ids:
            return []
        cur = await self.conn.execute(CLAIM_SQL, {
            "me": self.supervisor_id, "ids": list(ids), "fallback": DEFAULT_MAX_ATTEMPTS,
            "defaults": json.dumps({t: int(n) for t, n in default_max_attempts.items()}),
        })
        won = {row[0]: QueuedJob(*row) for row in await cur.fetchall()}
        return [won[i] for i in dict.fromkeys(ids) if i in won]

    async def complete(self, items: Iterable[tuple[int, int, Any]]) -> list[int]:
        """Mark jobs succeeded, items (id, claim, result) fenced on that claim (QueuedJob.claim);
        return the ids that changed.

        A result jsonb cannot hold (NaN, a NUL character) fails its job for good instead,
        with the reason in last_error, so one bad result never blocks the batch.
        """
        storable, unstorable = [], []
        for job_id, claim, result in items:
            try:
                storable.append((job_id, claim, encode_json(result, "result")))
            except ValueError as exc:
                unstorable.append((job_id, claim, f"the result could not be stored: {exc}"))
        failed = [job_id for job_id, claim, error in unstorable
                  if await self.fail(job_id, claim, error, permanent=True, retry_delay=0)]
        return failed + await self.complete_encoded(storable)

    async def complete_encoded(self, items: list[tuple[int, int, str | None]]) -> list[int]:
        """complete() for results already encoded (queue.encode_json): (id, claim, JSON text
        or None); return the ids that changed."""
        if not items:
            return []
        cur = await self.conn.execute(COMPLETE_SQL, {
            "me": self.supervisor_id, "ids": [job_id for job_id, _, _ in items],
            "done": _keyed_by_id((job_id, f"[{claim},{result or 'null'}]")
                                 for job_id, claim, result in items),
        })
        return [row[0] for row in await cur.fetchall()]

    async def completed_already(self, items: Iterable[tuple[int, int]]) -> set[int]:
        """Of (id, claim) pairs, the jobs this supervisor has recorded succeeded under that
        claim: a completion whose answer was lost with its connection, written all the same."""
        items = list(items)
        cur = await self.conn.execute(
            "SELECT j.id FROM fairsched_jobs j"
            " JOIN unnest(%s::bigint[], %s::integer[]) AS mine(id, claim) ON mine.id = j.id"
            " WHERE j.status = 'succeeded' AND j.claimed_by = %s AND j.claims = mine.claim",
            ([i for i, _ in items], [c for _, c in items], self.supervisor_id))
        return {row[0] for row in await cur.fetchall()}

    async def fail(self, job_id: int, claim: int, error: str, *, permanent: bool,
                   retry_delay: float) -> str | None:
        """Record a failed attempt: 'pending' (retried after retry_delay), 'failed' (permanent
        or attempts used up), 'cancelled' (a cancel was requested); None if no longer ours."""
        delay = float(retry_delay)
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"retry_delay must be a number of seconds >= 0, got {retry_delay!r}")
        cur = await self.conn.execute(FAIL_SQL, {
            "me": self.supervisor_id, "id": job_id, "claim": claim,
            "error": storable_text(str(error)[:MAX_ERROR]), "permanent": bool(permanent),
            "delay": delay})
        row = await cur.fetchone()
        return row[0] if row else None

    async def cancel_finish(self, job_id: int, claim: int) -> str | None:
        """End a job cancelled; None if no longer ours."""
        cur = await self.conn.execute(CANCEL_FINISH_SQL, {
            "me": self.supervisor_id, "id": job_id, "claim": claim})
        row = await cur.fetchone()
        return row[0] if row else None

    async def release(self, items: Iterable[tuple[int, int]]) -> list[int]:
        """Put unfinished jobs, items (id, claim), back to pending without spending their
        attempt (shutdown, restart, lost lease)."""
        items = list(items)
        if not items:
            return []
        cur = await self.conn.execute(RELEASE_SQL, {
            "me": self.supervisor_id, "ids": [job_id for job_id, _ in items],
            "claims": _keyed_by_id((job_id, str(claim)) for job_id, claim in items)})
        return [row[0] for row in await cur.fetchall()]

    async def held(self) -> list[tuple[int, int, bool]]:
        """(id, claim, cancel requested) of the jobs running under this supervisor's claim, by
        the table."""
        cur = await self.conn.execute(
            "SELECT id, claims, cancel_requested FROM fairsched_jobs"
            " WHERE status = 'running' AND claimed_by = %s", (self.supervisor_id,))
        return await cur.fetchall()

    async def next_eligible_at(self, types: Iterable[str] | None = None) -> float | None:
        """Epoch seconds when the next delayed job (of `types`, or of any type) becomes eligible."""
        return (await self._next_eligible(types))[0]

    async def next_eligible_in(self, types: Iterable[str] | None = None) -> float | None:
        """Seconds until the next delayed job (of `types`, or of any type) becomes eligible, by
        the server's clock: a timer armed with it is right however far this host's clock is
        from the server's."""
        return (await self._next_eligible(types))[1]

    async def _next_eligible(self, types: Iterable[str] | None) -> tuple[float | None, float | None]:
        cur = await self.conn.execute(
            NEXT_ELIGIBLE_SQL, {"types": None if types is None else list(types)})
        row = await cur.fetchone()
        return (row[0], row[1]) if row else (None, None)

    def listen(self) -> Notifications:
        """Notifications on a connection of their own: ('jobs', type) and ('cancel', job_id).

        `async for kind, value in store.listen()` works; `await store.listen()` first makes
        sure LISTEN is in effect, so a fetch done after it misses nothing.
        """
        notifications = Notifications(self.url, self._listeners, self.lease)
        self._listeners.add(notifications)
        return notifications

    async def close(self, deregister: bool = True) -> None:
        """Close the connections; deregister to let other supervisors rescue what is left."""
        for notifications in list(self._listeners):
            await notifications.aclose()
        try:
            if deregister and not self.conn.closed:
                # Jobs still running under this id go back through the next rescue at once.
                await self.conn.execute(
                    "WITH gone AS (DELETE FROM fairsched_supervisors s WHERE s.id = %(me)s"
                    "  AND NOT EXISTS (SELECT 1 FROM fairsched_jobs WHERE status = 'running'"
                    "                  AND claimed_by = %(me)s) RETURNING id)"
                    " UPDATE fairsched_supervisors SET heartbeat_at = '-infinity'"
                    " WHERE id = %(me)s AND NOT EXISTS (SELECT 1 FROM gone)",
                    {"me": self.supervisor_id})
        finally:
            await self.conn.close()


def _keyed_by_id(items: Iterable[tuple[int, str]]) -> str:
    """The text of a JSON object from (job id, JSON text of its value) pairs."""
    return "{" + ",".join(f'"{job_id}":{text}' for job_id, text in items) + "}"


async def open_connection(url: str, lease: float) -> psycopg.AsyncConnection:
    """An autocommit connection that notices a silently dead network well within the lease.

    A connection whose packets vanish (a NAT or firewall that dropped its state, a cut link)
    would otherwise hang a statement for the kernel's default of about 15 minutes, and an
    idle LISTEN connection for hours. So, over TCP, the kernel gives up on data unacknowledged
    for a third of the lease and probes an idle connection after a third of it. libpq ignores
    these over Unix sockets; settings given in the URL win.
    """
    given = conninfo_to_dict(url)
    tcp = {"keepalives": 1, "keepalives_idle": max(1, round(lease / 3)),
           "keepalives_interval": 1, "keepalives_count": 3,
           "tcp_user_timeout": max(1000, round(lease * 1000 / 3))}
    return await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
        **{key: value for key, value in tcp.items() if key not in given})


async def _renew(conn: psycopg.AsyncConnection, supervisor_id: int, host: str,
                 lease: float) -> float | None:
    """Renew the lease of a known supervisor: the server's clock (epoch seconds), or None when
    its row was gone (the lease had expired and its jobs were rescued), in which case it is
    registered again."""
    cur = await conn.execute(
        "UPDATE fairsched_supervisors SET heartbeat_at = now(), host = %s, pid = %s, lease = %s"
        " WHERE id = %s RETURNING extract(epoch FROM now())::float8",
        (host, os.getpid(), lease, supervisor_id))
    row = await cur.fetchone()
    if row is not None:
        return row[0]
    await _register(conn, supervisor_id, host, lease)
    return None


async def _register(conn: psycopg.AsyncConnection, supervisor_id: int, host: str,
                    lease: float) -> None:
    """(Re)create a supervisor row under a known id, with a fresh heartbeat."""
    await conn.execute(
        "INSERT INTO fairsched_supervisors (id, host, pid, lease) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), host = excluded.host,"
        " pid = excluded.pid, lease = excluded.lease",
        (supervisor_id, host, os.getpid(), lease))


class Notifications:
    """An async iterator over job and cancel notifications, with its own LISTEN connection."""

    def __init__(self, url: str, owners: set, lease: float):
        self.url = url
        self.lease = lease
        self._owners = owners
        self._conn: psycopg.AsyncConnection | None = None
        self._stream = None
        self._closed = False

    async def start(self) -> Notifications:
        if self._closed:
            raise psycopg.InterfaceError("notifications are closed")
        if self._conn is None:
            conn = await open_connection(self.url, self.lease)
            try:
                await conn.execute(f"LISTEN {JOBS_CHANNEL}")
                await conn.execute(f"LISTEN {CANCEL_CHANNEL}")
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
            self._stream = conn.notifies()
        return self

    def __await__(self):
        return self.start().__await__()

    def __aiter__(self) -> Notifications:
        return self

    async def __aenter__(self) -> Notifications:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def __anext__(self) -> tuple[str, Any]:
        await self.start()
        while True:
            try:
                notify = await self._stream.__anext__()
            except StopAsyncIteration:
                await self.aclose()
                raise
            if notify.channel == JOBS_CHANNEL:
                return ("jobs", notify.payload)
            if notify.channel == CANCEL_CHANNEL:
                try:
                    return ("cancel", int(notify.payload))
                except ValueError:
                    continue

    async def aclose(self) -> None:
        self._closed = True
        self._owners.discard(self)
        conn, self._conn = self._conn, None
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                await stream.aclose()
            except Exception:
                pass
        if conn is not None:
            await conn.close()


def retry_delay(attempt: int, base: float = 1.0, cap: float = 300.0, rng=random,
                *, jitter: str = "equal") -> float:
    """Seconds before retry number `attempt` (1 after the first failure): exponential backoff,
    base x 2^(attempt-1) capped at `cap`, with jitter so failed jobs do not retry in lockstep.

    "full" jitter draws from [0, d]; "equal" jitter from [d/2, d], keeping a floor.
    """
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be an integer >= 1, got {attempt!r}")
    if not (math.isfinite(base) and base >= 0 and math.isfinite(cap) and cap >= 0):
        raise ValueError(f"base and cap must be finite and >= 0, got {base!r}, {cap!r}")
    delay = min(cap, base * 2.0 ** min(attempt - 1, 1000))
    if jitter == "full":
        return rng.uniform(0.0, delay)
    if jitter == "equal":
        return delay / 2 + rng.uniform(0.0, delay / 2)
    raise ValueError(f"jitter must be 'full' or 'equal', got {jitter!r}")
