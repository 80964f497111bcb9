"""The supervisor's asynchronous side of the job table: fetch, claim, finish, heartbeat, rescue.

Claims are optimistic (one UPDATE ... WHERE status = 'pending' per batch) and every later write
is fenced on (claimed_by, claims), `claims` counting every claim of the job: a supervisor that
lost a job, to a rescue after its lease expired, to a retry or to a hand-back and a new claim,
can no longer change it (the statements, and why each is shaped as it is: statements.py).
Errors from a lost connection surface as psycopg.OperationalError; the caller reconnects.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Iterable, Mapping

import psycopg

from fairsched.store.connections import Notifications, open_connection
from fairsched.store.rows import Candidate, QueuedJob, storable_text
from fairsched.store.statements import (
    BACKLOG_SQL,
    CANCEL_FINISH_SQL,
    CLAIM_SQL,
    COMPLETE_SQL,
    FAIL_SQL,
    FETCH_SQL,
    LIMIT_LOCK,
    LIMIT_RUNNING_SQL,
    LIMITED_IN_BATCH_SQL,
    NEXT_ELIGIBLE_SQL,
    ORPHAN_AGE,
    RELEASE_HOLDS_SQL,
    RELEASE_SQL,
    RESCUE_SQL,
)

# Used when a claimed job has no max_attempts and its type is missing from the defaults.
DEFAULT_MAX_ATTEMPTS = 3
MAX_ERROR = 65536  # characters of last_error kept


class AsyncStore:
    """One supervisor's connection to the job table; create with `await AsyncStore.connect(...)`."""

    def __init__(self, conn: psycopg.AsyncConnection, url: str, supervisor_id: int,
                 lease: float, host: str, lane: str = "claims"):
        self.conn = conn
        self.url = url
        self.supervisor_id = supervisor_id
        self.lease = lease
        self.host = host
        self.lane = lane  # what pg_stat_activity's application_name calls the connection
        # Set by a reconnect that found this supervisor's row gone: its jobs were rescued.
        self.lease_lost = False
        # The server's clock minus this host's, as of the last heartbeat: job times read from
        # the table (created_at, run_after) less this are times of this host's clock.
        self.clock_offset = 0.0
        self._listeners: set[Notifications] = set()
        # [scoring] usage_half_life: how fast a tenant's usage decays, as completions write
        # it and fetches read it.
        self.usage_half_life = 600.0
        self.limited_types: list[str] = []  # [limits]: completions of these notify

    @classmethod
    async def connect(cls, url: str, *, lease: float = 15.0, host: str | None = None,
                      supervisor_id: int | None = None, lane: str = "claims") -> AsyncStore:
        """Connect and register a supervisor row; heartbeat well within `lease` seconds.

        After a lost connection, pass the old `supervisor_id` to carry on as the same
        supervisor: its claims stay its own, so completions written after the reconnect
        still pass the fence.
        """
        if not isinstance(lease, int | float) or not math.isfinite(lease) or lease <= 0:
            raise ValueError(f"lease must be a number of seconds > 0, got {lease!r}")
        host = host or socket.gethostname()
        conn = await open_connection(url, float(lease), lane)
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
        store = cls(conn, url, supervisor_id, float(lease), host, lane)
        store.lease_lost = renewed is None
        return store

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

    async def rescue_expired(self, suspects: Iterable[tuple[int, float]] | None = None
                             ) -> dict[str, int]:
        """Hand back the running jobs of supervisors whose lease expired; return how many by
        the status each took: 'pending' (back in the queue), 'cancelled' (a cancel had been
        asked) or 'failed' (no attempts left).

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
            return {status: count for status, count, _ in await cur.fetchall()}

    async def fetch(self, free_by_type: Mapping[str, int],
                    priority_per_second: float) -> list[Candidate]:
        """Up to 2 x free slots candidates per type and tenant, each with its tenant's usage,
        best score first across all types (the tenant term left out)."""
        if not math.isfinite(priority_per_second) or priority_per_second < 0:
            raise ValueError(f"priority_per_second must be >= 0, got {priority_per_second!r}")
        wanted = [(t, 2 * n) for t, n in free_by_type.items() if n > 0]
        if not wanted:
            return []
        cur = await self.conn.execute(FETCH_SQL, {
            "types": [t for t, _ in wanted], "limits": [k for _, k in wanted],
            "pps": float(priority_per_second), "half_life": self.usage_half_life})
        return [Candidate(i, t, p, e, tenant=tenant, usage=usage)
                for i, t, p, e, tenant, usage in await cur.fetchall()]

    async def backlog(self, caps: Mapping[str, int], wait: float) -> dict[str, int]:
        """Jobs of each type in `caps` eligible for `wait` seconds or more and still pending,
        counted up to its cap."""
        if not caps:
            return {}
        cur = await self.conn.execute(BACKLOG_SQL, {
            "types": list(caps), "caps": [int(k) for k in caps.values()], "wait": float(wait)})
        return {t: int(n) for t, n in await cur.fetchall()}

    async def claim(self, ids: list[int], default_max_attempts: Mapping[str, int]) -> list[QueuedJob]:
        """Claim the jobs still pending among `ids` in one statement; return those won, in the
        order of `ids`, with attempts already counting this one."""
        if not ids:
            return []
        cur = await self.conn.execute(CLAIM_SQL, {
            "me": self.supervisor_id, "ids": _bigint_array(ids), "fallback": DEFAULT_MAX_ATTEMPTS,
            "defaults": json.dumps({t: int(n) for t, n in default_max_attempts.items()}),
        })
        won = {row[0]: QueuedJob(*row) for row in await cur.fetchall()}
        return [won[i] for i in dict.fromkeys(ids) if i in won]

    async def claim_within(self, ids: list[int], default_max_attempts: Mapping[str, int],
                           limits: Mapping[str, int]) -> tuple[list[QueuedJob], dict[int, str]]:
        """claim(), with no more jobs of a type in `limits` running at once, across every
        supervisor, than its limit (on-demand holds counted). Returns the jobs won and the ids
        left unclaimed because their type was at its limit, with that type."""
        if not ids or not limits:
            return await self.claim(ids, default_max_attempts), {}
        cur = await self.conn.execute(LIMITED_IN_BATCH_SQL, {
            "ids": _bigint_array(ids), "limited": list(limits)})
        rows = await cur.fetchall()
        limited = {job_id: type_name for job_id, type_name, pending in rows if pending}
        taken = {job_id for job_id, _, pending in rows if not pending}
        ids = [i for i in ids if i not in taken]
        if not limited:
            return await self.claim(ids, default_max_attempts), {}
        async with self.conn.transaction():
            await self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_signed(LIMIT_LOCK),))
            cur = await self.conn.execute(LIMIT_RUNNING_SQL,
                                          {"types": sorted(set(limited.values()))})
            room = {t: limits[t] - int(n) for t, n in await cur.fetchall()}
            kept, refused = [], {}
            for job_id in ids:
                t = limited.get(job_id)
                if t is not None:
                    if room[t] <= 0:
                        refused[job_id] = t
                        continue
                    room[t] -= 1
                kept.append(job_id)
            return await self.claim(kept, default_max_attempts), refused

    async def limit_running(self, types: list[str]) -> dict[str, int]:
        """[limits]: the jobs of each type running across every supervisor, on-demand holds
        included."""
        cur = await self.conn.execute(LIMIT_RUNNING_SQL, {"types": list(types)})
        return {t: int(n) for t, n in await cur.fetchall()}

    async def hold(self, type_name: str, limit: int) -> int | None:
        """Take a place for an on-demand job of a limited type: the hold's id, or None when
        the type is at its limit (counted as claim_within counts)."""
        async with self.conn.transaction():
            await self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_signed(LIMIT_LOCK),))
            cur = await self.conn.execute(LIMIT_RUNNING_SQL, {"types": [type_name]})
            (_, n), = await cur.fetchall()
            if n >= limit:
                return None
            cur = await self.conn.execute(
                "INSERT INTO fairsched_limit_holds (type, supervisor) VALUES (%s, %s)"
                " RETURNING id", (type_name, self.supervisor_id))
            return (await cur.fetchone())[0]

    async def release_holds(self, hold_ids: list[int]) -> None:
        """On-demand jobs of limited types ended: their places are free, and the supervisors
        waiting for one are told (as a completion tells them)."""
        await self.conn.execute(RELEASE_HOLDS_SQL, {"ids": _bigint_array(hold_ids)})

    async def complete(self, items: list[tuple[int, int, str | None]]) -> list[int]:
        """Mark jobs succeeded, items (id, claim, result) fenced on that claim (QueuedJob.claim),
        each result as rows.encode_result gives it (JSON text, or None); return the ids that
        changed."""
        if not items:
            return []
        cur = await self.conn.execute(COMPLETE_SQL, {
            "me": self.supervisor_id, "ids": _bigint_array(job_id for job_id, _, _ in items),
            "done": _keyed_by_id((job_id, f"[{claim},{result or 'null'}]")
                                 for job_id, claim, result in items),
            "half_life": self.usage_half_life, "limited": self.limited_types,
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

    async def failed_already(self, job_id: int, claim: int, error: str) -> str | None:
        """The status a failed attempt of this supervisor's under `claim` left, if it was
        written (by a try whose answer was lost with its connection); None if it was not: the
        row moved on without it (a rescue writes its own last_error; a new claim, its own
        claim number). One such row reads as ours: a job rescued while cancelling keeps the
        last_error an earlier attempt left, and that may be the very error this attempt
        reports; the row is right all the same, only "not recorded" goes unsaid."""
        cur = await self.conn.execute(
            "SELECT status FROM fairsched_jobs WHERE id = %s AND claims = %s"
            " AND status <> 'running' AND last_error = %s"
            " AND (claimed_by = %s OR (claimed_by IS NULL AND status = 'pending'))",
            (job_id, claim, _stored_error(error), self.supervisor_id))
        row = await cur.fetchone()
        return row[0] if row else None

    async def fail(self, job_id: int, claim: int, error: str, *, permanent: bool,
                   retry_delay: float) -> str | None:
        """Record a failed attempt: 'pending' (retried after retry_delay), 'failed' (permanent
        or attempts used up), 'cancelled' (a cancel was requested); None if no longer ours."""
        delay = float(retry_delay)
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"retry_delay must be a number of seconds >= 0, got {retry_delay!r}")
        cur = await self.conn.execute(FAIL_SQL, {
            "me": self.supervisor_id, "id": job_id, "claim": claim,
            "error": _stored_error(error), "permanent": bool(permanent),
            "delay": delay, "half_life": self.usage_half_life})
        row = await cur.fetchone()
        return row[0] if row else None

    async def cancel_finish(self, job_id: int, claim: int) -> str | None:
        """End a job cancelled; None if no longer ours."""
        cur = await self.conn.execute(CANCEL_FINISH_SQL, {
            "me": self.supervisor_id, "id": job_id, "claim": claim,
            "half_life": self.usage_half_life})
        row = await cur.fetchone()
        return row[0] if row else None

    async def release(self, items: Iterable[tuple[int, int]]) -> dict[int, str]:
        """Put unfinished jobs, items (id, claim), back to pending without spending their
        attempt (shutdown, restart, lost lease); by id, the status each one took: 'pending',
        or 'cancelled' for a job whose cancel reached the table first."""
        items = list(items)
        if not items:
            return {}
        cur = await self.conn.execute(RELEASE_SQL, {
            "me": self.supervisor_id, "ids": [job_id for job_id, _ in items],
            "claims": _keyed_by_id((job_id, str(claim)) for job_id, claim in items)})
        return {job_id: status for job_id, status, _ in await cur.fetchall()}

    async def released_already(self, items: Iterable[tuple[int, int]]) -> dict[int, str]:
        """Of (id, claim) pairs, the jobs back in the queue from that claim (a release whose
        answer was lost with its connection, written all the same), or ended cancelled by it:
        not claimed again since. By id, their status, as `release` returns it."""
        items = list(items)
        cur = await self.conn.execute(
            "SELECT j.id, j.status FROM fairsched_jobs j"
            " JOIN unnest(%s::bigint[], %s::integer[]) AS mine(id, claim) ON mine.id = j.id"
            " WHERE j.claims = mine.claim AND (j.status = 'pending'"
            " OR (j.status = 'cancelled' AND j.claimed_by = %s))",
            ([i for i, _ in items], [c for _, c in items], self.supervisor_id))
        return dict(await cur.fetchall())

    async def still_pending(self, ids: list[int]) -> list[tuple[int, str]]:
        """(id, type) of the jobs among `ids` that are pending and eligible: after a claim
        lost them, they are locked by a transaction that is not a claim."""
        if not ids:
            return []
        cur = await self.conn.execute(  # by primary key, as the claim (statements.py)
            "SELECT j.id, j.type FROM fairsched_jobs AS j,"
            " (SELECT 'pending'::text OFFSET 0) AS fence(status)"
            " WHERE j.id = ANY(%s::bigint[]) AND j.status = fence.status"
            " AND j.run_after <= now()", (list(ids),))
        return await cur.fetchall()

    async def missing(self, ids: Iterable[int]) -> set[int]:
        """The jobs among `ids` that are no longer in the table (deleted by hand)."""
        ids = list(ids)
        cur = await self.conn.execute(
            "SELECT i FROM unnest(%s::bigint[]) AS i"
            " WHERE NOT EXISTS (SELECT 1 FROM fairsched_jobs WHERE id = i)", (ids,))
        return {row[0] for row in await cur.fetchall()}

    async def held(self) -> list[tuple[int, int, bool]]:
        """(id, claim, cancel requested) of the jobs running under this supervisor's claim, by
        the table."""
        cur = await self.conn.execute(
            "SELECT id, claims, cancel_requested FROM fairsched_jobs"
            " WHERE status = 'running' AND claimed_by = %s", (self.supervisor_id,))
        return await cur.fetchall()

    async def next_eligible_in(self) -> float | None:
        """Seconds until the next delayed job becomes eligible, by the server's clock: a timer
        armed with it is right however far this host's clock is from the server's."""
        cur = await self.conn.execute(NEXT_ELIGIBLE_SQL)
        row = await cur.fetchone()
        return row[0] if row else None

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


def _stored_error(error: str) -> str:
    """An error as last_error keeps it."""
    return storable_text(str(error)[:MAX_ERROR])


def _signed(key: int) -> int:
    """A 64-bit key as the bigint pg_advisory_xact_lock takes."""
    return key - (1 << 64) if key >= 1 << 63 else key


def _bigint_array(ids: Iterable[int]) -> str:
    """Job ids as the text of a bigint[]: a batch of hundreds costs a fifth of what adapting
    a list of ints takes, on the hot path of every claim and completion."""
    return "{" + ",".join(map(str, map(int, ids))) + "}"


def _keyed_by_id(items: Iterable[tuple[int, str]]) -> str:
    """The text of a JSON object from (job id, JSON text of its value) pairs."""
    return "{" + ",".join(f'"{job_id}":{text}' for job_id, text in items) + "}"


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

