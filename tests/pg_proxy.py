"""A byte-forwarding proxy in front of PostgreSQL that a test can cut, like a network partition.

`PgProxy(url)` listens on a Unix socket of its own and forwards every connection to the server
of `url` (a Unix socket or TCP). `url_through` is the same URL by way of the proxy. `cut()`
stops every byte in both directions and refuses new connections: statements in flight hang,
as they do when a network drops packets. `heal()` closes the connections it held (the way a
peer's reset ends them) and accepts new ones again. `lose_answer_to(marker)`: the next statement
whose text holds `marker` reaches the server, which runs it, but nothing more of the server's
comes back on that connection, as when a network drops packets just after a statement left.
`hold_answer_to(marker)`: the same, but the server's answer is only late: `pass_answer()` lets
what was held, and all that follows, through, as a slow network would deliver it.
`refuse(marker)`: a new connection whose startup packet holds `marker` (its application_name,
say) is closed at once, as by a firewall's rule, until `refuse(None)`; `refused` counts them.
"""

from __future__ import annotations

import os
import selectors
import socket
import tempfile
import threading
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

# Bytes of the claim statement (fairsched.store.statements.CLAIM_SQL), for the markers that
# hold or lose its answer.
CLAIM = b"claims = j.claims + 1"
# Bytes of the fetch statement (FETCH_SQL) alone: "CROSS JOIN LATERAL" is in it, but also in
# NEXT_ELIGIBLE_SQL, which follows a fetch that came back short.
FETCH = b"AS want(type, k)"


class PgProxy:
    def __init__(self, url: str):
        params = conninfo_to_dict(url)
        host = str(params.get("host") or "/tmp")
        port = int(params.get("port") or 5432)
        if host.startswith("/"):
            self._target = (socket.AF_UNIX, os.path.join(host, f".s.PGSQL.{port}"))
        else:
            self._target = (socket.AF_INET, (host, port))
        self.dir = Path(tempfile.mkdtemp(prefix="fsp-", dir="/tmp"))
        self._path = str(self.dir / f".s.PGSQL.{port}")
        self.url_through = make_conninfo(url, host=str(self.dir), port=str(port))
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut = False
        self._closed = False
        self._marker: bytes | None = None
        self._muted: set[socket.socket] = set()  # servers whose answers are dropped
        self._holding = False  # the connection the marker names is held, not muted
        self._held: dict[socket.socket, bytearray] = {}  # servers whose answers wait here
        self._refusing: bytes | None = None
        self._fresh: set[socket.socket] = set()  # clients that have sent nothing yet
        self.refused = 0
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._listener = self._listen()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="pg-proxy")
        self._thread.start()

    def _listen(self) -> socket.socket:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self._path)
        listener.listen(64)
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)
        return listener

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._selector.unregister(self._listener)
            self._listener.close()
            os.unlink(self._path)  # new connections fail: no such socket
            for client, server in self._pairs:
                for sock in (client, server):
                    self._selector.unregister(sock)
        self._wake()

    def lose_answer_to(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def refuse(self, marker: bytes | None) -> None:
        with self._lock:
            self._refusing = marker

    def hold_answer_to(self, marker: bytes) -> None:
        with self._lock:
            self._marker, self._holding = marker, True

    @property
    def answer_held(self) -> bool:
        """Whether the statement `hold_answer_to` named has reached the server."""
        with self._lock:
            return self._marker is None and bool(self._held)

    def pass_answer(self) -> None:
        with self._lock:
            for server, held in self._held.items():
                client = next((c for c, s in self._pairs if s is server), None)
                if client is not None and held:
                    client.sendall(held)
            self._held.clear()

    @property
    def answer_lost(self) -> bool:
        """Whether the statement `lose_answer_to` named has reached the server."""
        with self._lock:
            return self._marker is None and bool(self._muted)

    def heal(self) -> None:
        with self._lock:
            for client, server in self._pairs:
                client.close()
                server.close()
            self._pairs.clear()
            self._cut = False
            self._listener = self._listen()
        self._wake()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(timeout=5)
        for client, server in self._pairs:
            client.close()
            server.close()
        if not self._cut:
            self._listener.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        if os.path.exists(self._path):
            os.unlink(self._path)
        os.rmdir(self.dir)

    def _wake(self) -> None:
        self._wake_w.send(b"x")

    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select():
                with self._lock:
                    if self._closed:
                        return
                    sock = key.fileobj
                    if sock is self._wake_r:
                        self._wake_r.recv(64)
                    elif sock is self._listener:
                        self._accept()
                    elif not self._cut and sock.fileno() != -1:
                        self._forward(sock, key.data)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        server = socket.socket(self._target[0], socket.SOCK_STREAM)
        server.connect(self._target[1])
        self._pairs.append((client, server))
        self._fresh.add(client)
        self._selector.register(client, selectors.EVENT_READ, server)
        self._selector.register(server, selectors.EVENT_READ, client)

    def _forward(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            data = source.recv(1 << 16)
        except OSError:
            data = b""
        if data and source in self._muted:
            return  # the answer is lost on the way
        if source in self._fresh:
            self._fresh.discard(source)
            if data and self._refusing is not None and self._refusing in data:
                self.refused += 1
                data = b""  # closed, as below
        if data and source in self._held:
            self._held[source] += data  # the answer is late
            return
        if data:
            try:
                sink.sendall(data)  # blocking: PostgreSQL messages here are small
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    if self._holding:
                        self._holding = False
                        self._held[sink] = bytearray()
                    else:
                        self._muted.add(sink)
                return
            except OSError:
                pass
        for pair in [p for p in self._pairs if source in p]:
            self._pairs.remove(pair)
            for sock in pair:
                self._selector.unregister(sock)
                self._muted.discard(sock)
                self._held.pop(sock, None)
                self._fresh.discard(sock)
                sock.close()
