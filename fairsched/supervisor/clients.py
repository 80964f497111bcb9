"""The control socket's connections, each held to what one client may take, so that operators
always get in: at most MAX_CONNECTIONS open (a newcomer past that closes the oldest one still
sending its request, rather than being turned away), REQUEST_WITHIN seconds to send a request,
MAX_LINE bytes in it, and LINE_BUDGET bytes of unfinished requests held for all of them
together. What is cut is logged as one line per SUMMARY_EVERY seconds, not one per connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket

from fairsched.files import size_text
from fairsched.protocol import MAX_PAYLOAD

log = logging.getLogger("fairsched.control")

MAX_CONNECTIONS = 512  # open at once: each holds a file descriptor
# Bytes of a request line: room for the largest payload (MAX_PAYLOAD bytes of UTF-8 JSON, as
# `fairsched submit --on-demand` sends it) and the rest of the request.
MAX_LINE = 2 * MAX_PAYLOAD
# Bytes every connection may hold of its request without drawing on LINE_BUDGET: ps, stop and
# restart fit, so a flood of large requests never keeps an operator out.
FREE_LINE = 4096
# Bytes of unfinished requests past their FREE_LINE, all connections together: what
# hundreds of clients sending megabytes without a line break can make the supervisor hold.
LINE_BUDGET = 16 << 20
READ_SIZE = 64 << 10  # bytes asked of the socket at once, past FREE_LINE
REQUEST_WITHIN = 10.0  # seconds from connecting to the end of the request line
SUMMARY_EVERY = 5.0  # seconds between the log lines that count cut connections

_LINE, _BUDGET = size_text(MAX_LINE), size_text(LINE_BUDGET)
# Why a connection was cut: the log's words, and what the client is told (code 1: try again).
REASONS = {
    "slow": (f"sent no whole request within {REQUEST_WITHIN:g} s",
             f"no whole request within {REQUEST_WITHIN:g} s: closed"),
    "long": (f"sent a request longer than {_LINE}", f"a request is at most {_LINE}: closed"),
    "budget": (f"sent a large request when unfinished requests already held {_BUDGET}",
               f"the supervisor holds {_BUDGET} of unfinished requests already; try again"),
    "evicted": (f"were closed while still sending their request, the oldest of "
                f"{MAX_CONNECTIONS} open, to make room for newer ones",
                f"{MAX_CONNECTIONS} control connections were open: this one, the oldest still "
                "sending its request, was closed to make room; try again"),
    "refused": (f"were turned away: {MAX_CONNECTIONS} open, none of them still sending its "
                "request",
                f"the supervisor serves {MAX_CONNECTIONS} control connections at once, none of "
                "them idle; try again"),
    "garbage": ("sent something other than a JSON request", "bad request"),
    "unread": (f"did not read their answer within {REQUEST_WITHIN:g} s", ""),
}


def reason_text(reason: str, to_client: bool = False) -> str:
    return REASONS[reason][1 if to_client else 0]


class Cut(Exception):
    """The supervisor closes this connection; `reason` is a key of REASONS."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Connection:
    __slots__ = ("sock", "task", "opened", "reading", "held", "cut", "handed")

    def __init__(self, sock: socket.socket, opened: float):
        self.sock = sock
        self.task: asyncio.Task | None = None
        self.opened = opened
        self.reading = True  # still sending its request: the one to close for a newcomer
        self.held = 0  # bytes past FREE_LINE counted against LINE_BUDGET
        self.cut: str | None = None  # why it was closed from outside its task
        self.handed = False  # to a transport, which closes it


class Connections:
    """Every open control connection, oldest first; the bytes their requests hold."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.open: dict[int, Connection] = {}  # by id(): insertion order is age
        self.held = 0
        self.tally = Tally(loop)

    def admit(self, sock: socket.socket) -> Connection | None:
        """A newly accepted connection, or None when it must be turned away (every one open
        is past its request: on-demand callers waiting, stops)."""
        if len(self.open) >= MAX_CONNECTIONS:
            oldest = next((c for c in self.open.values() if c.reading and c.cut is None), None)
            if oldest is None:
                self.tally.add("refused")
                return None
            # Told now: its task may not have started yet, and a task cancelled before it
            # starts never runs (its end closes the socket all the same, see ended()).
            oldest.cut = "evicted"
            self.tell(oldest.sock, "evicted")
            oldest.task.cancel()
            self.forget(oldest)
        conn = Connection(sock, self.loop.time())
        self.open[id(conn)] = conn
        return conn

    def ended(self, conn: Connection, task: asyncio.Task | None = None) -> None:
        """Its task is done, however (cancelled before it started too): the socket is closed
        unless a transport took it. Only now: while the task awaited a read, the loop watched
        the socket's number, which a new connection may take once it is closed."""
        self.forget(conn)
        if not conn.handed:
            conn.sock.close()

    def forget(self, conn: Connection) -> None:
        self.release(conn)
        self.open.pop(id(conn), None)

    def release(self, conn: Connection) -> None:
        conn.reading = False
        self.held -= conn.held
        conn.held = 0

    def _reserve(self, conn: Connection, size: int) -> None:
        """Count a request grown to `size` bytes against LINE_BUDGET (Cut when it is spent)."""
        want = max(0, size - FREE_LINE)
        if self.held + want - conn.held > LINE_BUDGET:
            raise Cut("budget")
        self.held += want - conn.held
        conn.held = want

    async def read_request(self, conn: Connection) -> tuple[bytes, bytes] | None:
        """The request line (with its line break) and what followed it in the same read;
        None when the client hung up first. Cut when it is too slow, too long, or the
        budget is spent. Memory stays within what `_reserve` counted: each read asks for
        no more than it reserved."""
        chunks: list[bytes] = []
        size = 0
        async with asyncio.timeout_at(conn.opened + REQUEST_WITHIN):
            while True:
                want = FREE_LINE - size if size < FREE_LINE else min(READ_SIZE,
                                                                     MAX_LINE + 1 - size)
                self._reserve(conn, size + want)
                chunk = await self.loop.sock_recv(conn.sock, want)
                if not chunk:
                    return None
                end = chunk.find(b"\n")
                if end >= 0:
                    chunks.append(chunk[:end + 1])
                    return b"".join(chunks), chunk[end + 1:]
                chunks.append(chunk)
                size += len(chunk)
                self._reserve(conn, size)
                if size > MAX_LINE:
                    raise Cut("long")

    def tell(self, sock: socket.socket, reason: str) -> None:
        """Say why to a client being cut, as far as its socket takes it at once (it may not
        read: nothing waits for it), and count it for the log."""
        self.tally.add(reason)
        line = json.dumps({"ok": False, "code": 1, "event": "refused",
                           "error": reason_text(reason, to_client=True)})
        with contextlib.suppress(OSError):
            sock.send(line.encode() + b"\n")


class Tally:
    """Connections cut, by reason, logged as one line SUMMARY_EVERY seconds after the first."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float = SUMMARY_EVERY):
        self.loop = loop
        self.every = every
        self.counts: collections.Counter[str] = collections.Counter()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, reason: str) -> None:
        self.counts[reason] += 1
        if self._handle is None:
            self._handle = self.loop.call_later(self.every, self.flush)

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if not self.counts:
            return
        total = sum(self.counts.values())
        said = "; ".join(f"{n} {reason_text(reason)}" for reason, n in self.counts.most_common())
        log.warning("control socket: cut or turned away %d connection%s in %g s: %s", total,
                    "" if total == 1 else "s", self.every, said)
        self.counts.clear()
