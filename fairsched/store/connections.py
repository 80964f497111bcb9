"""The supervisor's connections to PostgreSQL: opened to notice a dead network and a stuck
statement well within the lease, and one of them listening for new jobs and cancels.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from fairsched.store.database import SET_TRIES, connect_timeout
from fairsched.store.schema import CANCEL_CHANNEL, JOBS_CHANNEL

# A statement of the supervisor's that takes longer than this share of its lease is given up:
# by the supervisor, which takes the connection for lost (queue_link.py says why), and by the
# server, through the connection's own statement_timeout. The server's half matters: a
# statement waiting on a lock (a LOCK TABLE held for minutes) does not notice its client has
# gone, so every reconnection would otherwise leave one more backend waiting, until the
# server's connections ran out. And a database-wide statement_timeout shorter than that (set
# for the applications beside fairsched) would fail every large batch of outcomes for ever.
ANSWER_WITHIN = 1 / 4


async def open_connection(url: str, lease: float, lane: str = "claims") -> psycopg.AsyncConnection:
    """An autocommit connection that notices a silently dead network well within the lease.

    A connection whose packets vanish (a NAT or firewall that dropped its state, a cut link)
    would otherwise hang a statement for the kernel's default of about 15 minutes, and an
    idle LISTEN connection for hours. So, over TCP, the kernel gives up on data unacknowledged
    for a third of the lease and probes an idle connection after a third of it. libpq ignores
    these over Unix sockets; settings given in the URL win. pg_stat_activity names the
    connection by its `lane` and this process's pid, unless the URL or PGAPPNAME names it.
    Its statements end on the server after ANSWER_WITHIN of the lease, whatever
    statement_timeout the database or role sets, and it is never ended for being idle.
    """
    given = conninfo_to_dict(url)
    defaults = {"keepalives": 1, "keepalives_idle": max(1, round(lease / 3)),
                "keepalives_interval": 1, "keepalives_count": 3,
                "tcp_user_timeout": max(1000, round(lease * 1000 / 3)),
                "fallback_application_name": f"fairsched {lane} (pid {os.getpid()})"}
    defaults.update(connect_timeout(url)[0])
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True,
        **{key: value for key, value in defaults.items() if key not in given})
    try:
        # A SET rather than the startup packet's `options`, which connection poolers refuse.
        # Under a statement_timeout of a millisecond or so set for others, even this may run
        # out on a busy host: it is tried again, not taken for a lost connection.
        for tries_left in reversed(range(SET_TRIES)):
            try:
                await conn.execute("SELECT set_config('statement_timeout', %s, false)",
                                   (f"{max(1, round(lease * ANSWER_WITHIN * 1000))}ms",))
                break
            except psycopg.errors.QueryCanceled:
                if not tries_left:
                    raise
        if conn.info.server_version >= 140000:
            # Idle between heartbeats, and the LISTEN connection idle for hours: an
            # idle_session_timeout meant for others would end them, each time a lost
            # connection to report and notifications missed until the next one.
            await conn.execute("SET idle_session_timeout = 0")
    except BaseException:
        await conn.close()
        raise
    return conn


class Notifications:
    """An async iterator over job and cancel notifications, with its own LISTEN connection.

    It waits for the connection's socket itself rather than in psycopg's notifies(), which
    wakes up ten times a second (to let Ctrl-C through): an idle supervisor sleeps until a
    notification, or its next heartbeat, is due."""

    def __init__(self, url: str, owners: set, lease: float):
        self.url = url
        self.lease = lease
        self._owners = owners
        self._conn: psycopg.AsyncConnection | None = None
        self._backlog: collections.deque = collections.deque()
        self._waiting: asyncio.Future | None = None
        self._closed = False

    async def start(self) -> Notifications:
        if self._closed:
            raise psycopg.InterfaceError("notifications are closed")
        if self._conn is None:
            conn = await open_connection(self.url, self.lease, "notifications")
            try:
                await conn.execute(f"LISTEN {JOBS_CHANNEL}")
                await conn.execute(f"LISTEN {CANCEL_CHANNEL}")
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
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
            # What has arrived (timeout=0: read what is there, wait for nothing).
            self._backlog.extend([n async for n in self._conn.notifies(timeout=0)])
            while self._backlog:
                notify = self._backlog.popleft()
                if notify.channel == JOBS_CHANNEL:
                    return ("jobs", notify.payload)
                if notify.channel == CANCEL_CHANNEL:
                    with contextlib.suppress(ValueError):
                        return ("cancel", int(notify.payload))
            await self._readable()

    async def _readable(self) -> None:
        """Until the connection's socket has something to read (a notification, or the end
        of the connection, which the next read raises)."""
        loop = asyncio.get_running_loop()
        waiting = self._waiting = loop.create_future()
        fd = self._conn.fileno()
        loop.add_reader(fd, lambda: waiting.done() or waiting.set_result(None))
        try:
            await waiting
        finally:
            self._waiting = None
            loop.remove_reader(fd)

    async def aclose(self) -> None:
        self._closed = True
        self._owners.discard(self)
        waiting, self._waiting = self._waiting, None
        if waiting is not None and not waiting.done():  # a reader waits: it stops
            waiting.set_exception(psycopg.InterfaceError("notifications are closed"))
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
