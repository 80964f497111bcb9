"""The control socket: newline-delimited JSON requests from `fairsched ps/restart/reload/stop/
submit`.

The socket lives in a 0700 folder under state_dir, itself mode 0600. An flock on a lock file
beside it makes a second supervisor on the same state_dir refuse to start while the first lives,
and lets it take over a socket left behind by a crash. What each connection may take (how many,
how long, how many bytes) is clients.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import logging
import math
import os
import socket
from pathlib import Path

from fairsched.control_client import LOCK_FILE
from fairsched.errors import ConfigError, FairschedError, path_name
from fairsched.permissions import make_private_folder, open_private, private_umask
from fairsched.protocol import MAX_DEPTH, MAX_PAYLOAD, json_depth, payload_json
from fairsched.supervisor.clients import (
    FREE_LINE,
    MAX_CONNECTIONS,
    REQUEST_WITHIN,
    Connection,
    Connections,
    Cut,
)
from fairsched.supervisor.status import snapshot

log = logging.getLogger("fairsched.control")

MAX_WAITING = 256  # on-demand callers waiting at once, each holding its connection and payload
HOLD_PROGRESS_AT = 64 << 10  # bytes unread by an on-demand caller: further progress waits
ANSWER_WITHIN = REQUEST_WITHIN  # seconds a client has to take an answer it asked for
# Blank bytes (a CR, line breaks) an on-demand caller may send past its request: more is
# another request, or a stream of nothing the supervisor would read for ever.
MAX_TRAILING = 64
ACCEPT_PAUSE = 0.1  # seconds without accepting after accept() failed (no descriptor left)


class AlreadyRunning(FairschedError):
    pass


class ControlServer:
    """Take the lock (`lock`) before anything starts; serve (`start`) once the actor runs."""

    def __init__(self, socket_path: Path):
        self.sup = None
        self.path = socket_path
        self.folder = socket_path.parent
        self.lock_path = self.folder / LOCK_FILE
        self._lock_fd: int | None = None
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self.connections: Connections | None = None
        self._waiting = 0  # on-demand callers connected now: ps, stop, restart keep room

    def lock(self) -> None:
        make_private_folder(self.folder)
        fd = open_private(self.lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyRunning(
                f"another supervisor (pid {other}) is running on {path_name(self.folder.parent)}; "
                "stop it first (`fairsched stop`)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    async def start(self, sup) -> None:
        self.sup = sup
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # stale: we hold the lock, so its owner is gone
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with private_umask():
                listener.bind(str(self.path))
            # A burst of callers waits in the backlog rather than being refused there.
            listener.listen(MAX_CONNECTIONS)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.connections = Connections(asyncio.get_running_loop())
        self._accepting = asyncio.ensure_future(self._accept())

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self.connections is not None:
            for conn in list(self.connections.open.values()):
                if conn.task is not None:
                    conn.task.cancel()
            self.connections.tally.flush()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        conns = self.connections
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # EMFILE: the caller waits in the backlog meanwhile
                log.warning("control socket: cannot accept a connection: %s",
                            exc.strerror or exc)
                await asyncio.sleep(ACCEPT_PAUSE)
                continue
            conn = conns.admit(sock)
            if conn is None:
                conns.tell(sock, "refused")
                sock.close()
                continue
            conn.task = asyncio.ensure_future(self._serve(conn))
            conn.task.add_done_callback(functools.partial(conns.ended, conn))
            await asyncio.sleep(0)  # a burst of callers is accepted while others are served

    async def _serve(self, conn: Connection) -> None:
        conns = self.connections
        writer = None
        try:
            try:
                got = await conns.read_request(conn)
            except Cut as cut:
                conns.tell(conn.sock, cut.reason)
                return
            except TimeoutError:
                conns.tell(conn.sock, "slow")
                return
            if got is None:  # hung up
                return
            conns.release(conn)
            line, rest = got
            try:
                request = json.loads(line)
                if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
                    raise ValueError("not a request object")
            except (ValueError, RecursionError):
                conns.tally.add("garbage")
                with contextlib.suppress(OSError):
                    conn.sock.send(b'{"ok": false, "error": "bad request"}\n')
                return
            reader, writer = await asyncio.open_unix_connection(sock=conn.sock,
                                                                limit=FREE_LINE)
            conn.handed = True
            await self._dispatch(request, rest, reader, writer)
        except ConnectionError:  # the caller hung up before reading all it asked for
            log.debug("a control connection closed before its answer was read")
        except asyncio.CancelledError:  # closed to make room, or the supervisor stops
            pass
        except OSError as exc:  # the socket failed otherwise: this connection only
            log.debug("a control connection failed: %s", exc)
        finally:
            if writer is not None and writer.transport.get_write_buffer_size():
                writer.transport.abort()  # what it did not read is dropped
            elif writer is not None:
                writer.close()

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Until the client has taken what was written to it: ConnectionError when it does not
        within ANSWER_WITHIN seconds (it asked and does not read; a suspended process)."""
        try:
            await asyncio.wait_for(writer.drain(), ANSWER_WITHIN)
        except TimeoutError:
            self.connections.tally.add("unread")
            raise ConnectionResetError("answer not read") from None

    async def _dispatch(self, request: dict, rest: bytes, reader, writer) -> None:
        sup = self.sup
        cmd = request["cmd"]
        if cmd == "ps":
            _send(writer, {"ok": True, "ps": snapshot(sup)})
        elif cmd == "restart":
            names = [] if sup.shutting_down else sup.workers.restart(str(request.get("name", "")))
            if sup.shutting_down:
                _send(writer, {"ok": False, "code": 1,
                               "error": "the supervisor is shutting down: nothing restarts"})
            elif names:
                _send(writer, {"ok": True, "restarted": names})
            else:
                known = sorted({p.group for p in sup.workers.procs}
                               | {p.name for p in sup.workers.procs})
                _send(writer, {"ok": False, "code": 2,
                               "error": f"no worker or group named {request.get('name')!r} "
                                        f"(known: {', '.join(known)})"})
        elif cmd == "stop":
            timeout = request.get("timeout")
            if timeout is not None and not _seconds(timeout):
                _send(writer, {"ok": False, "code": 2,
                               "error": f"timeout must be a number of seconds >= 0, got "
                                        f"{timeout!r}"})
                await self._drain(writer)
                return
            _send(writer, {"ok": True, "pid": os.getpid()})
            # Once the caller has the answer: one that gave up meanwhile (a supervisor
            # stopped with SIGSTOP and woken later) was told the stop did not happen.
            await self._drain(writer)
            sup.request_shutdown(float(timeout) if isinstance(timeout, int | float) else None)
            await sup.stopped.wait()
        elif cmd == "reload":
            _send(writer, self._reload())
        elif cmd == "submit":
            await self._submit(request, rest, reader, writer)
        else:
            _send(writer, {"ok": False, "code": 2, "error": f"unknown command {cmd!r}"})
        await self._drain(writer)

    def _reload(self) -> dict:
        """`fairsched reload`: what changed, or why nothing did (code 2: the file, or a
        setting that takes a restart; 1: the supervisor is starting or stopping)."""
        from fairsched.supervisor.actor import ReloadRefused

        try:
            return {"ok": True, "changes": self.sup.reload().as_json()}
        except ConfigError as exc:
            log.error("reload refused, nothing changed: %s", exc)
            return {"ok": False, "code": 2, "error": str(exc)}
        except ReloadRefused as exc:
            return {"ok": False, "code": 1, "error": str(exc)}

    async def _submit(self, request: dict, rest: bytes, reader, writer) -> None:
        if self._waiting >= MAX_WAITING:
            _send(writer, {"event": "refused", "code": 1,
                           "error": f"{MAX_WAITING} on-demand requests are waiting already; "
                                    "try again"})
            return
        self._waiting += 1
        try:
            await self._serve_submit(request, rest, reader, writer)
        finally:
            self._waiting -= 1

    async def _serve_submit(self, request: dict, rest: bytes, reader, writer) -> None:
        sup = self.sup
        done = asyncio.Event()
        final: dict = {}
        held: dict = {}  # the latest progress event, held back while the caller reads slowly
        flushing: list[asyncio.Task] = []
        withdrawn = False  # its timeout passed, or it sent more than its request

        def notify(event: dict) -> None:
            if withdrawn:
                return  # the caller was told it was withdrawn: nothing more goes to it
            line = None
            if event["event"] in ("result", "error"):
                try:
                    line = _line(event)
                except (ValueError, RecursionError) as exc:
                    # A result a `command` worker sent nested as deep as a frame may be read
                    # is one level too deep to give back: the caller still gets an answer.
                    log.warning("the result of job %s cannot be sent back to its caller: %s",
                                event.get("job_id"), exc)
                    event = {"event": "error", "job_id": event.get("job_id"),
                             "error": f"its result cannot be sent back: {exc}"}
                    line = _line(event)
                final.update(event)
                done.set()
                held.clear()  # stale now
            if writer.is_closing():
                return
            if line is not None:
                writer.write(line)
                return
            holding = bool(flushing) and not flushing[-1].done()
            if event["event"] == "progress" and (
                    holding or writer.transport.get_write_buffer_size() >= HOLD_PROGRESS_AT):
                # A caller that reads slowly (or is suspended) gets the latest progress once
                # it catches up, not every one: what waits here for it stays bounded.
                held["event"] = event
                if not flushing or flushing[-1].done():
                    flushing[:] = [asyncio.ensure_future(send_held())]
                return
            _send(writer, event)

        async def send_held() -> None:
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            event = held.pop("event", None)
            if event is not None and not writer.is_closing():
                _send(writer, event)

        timeout = request.get("timeout")
        if timeout is not None and not (_seconds(timeout) and timeout > 0):
            _send(writer, {"event": "refused", "code": 2,
                           "error": f"timeout must be a number of seconds > 0, got {timeout!r}"})
            return
        priority = request.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 10:
            _send(writer, {"event": "refused", "code": 2,
                           "error": f"priority must be an integer 0..10, got {priority!r}"})
            return
        try:
            payload, size = payload_json(request.get("payload"))
        except ValueError as exc:  # NaN or Infinity: json.loads takes them, frames do not
            _send(writer, {"event": "refused", "code": 2, "error": f"payload: {exc}"})
            return
        except RecursionError:  # read, but too deep to write out again: far past MAX_DEPTH
            _send(writer, {"event": "refused", "code": 2,
                           "error": f"payload nests deeper than {MAX_DEPTH} levels"})
            return
        if size > MAX_PAYLOAD:  # the bytes it takes in the run frame
            _send(writer, {"event": "refused", "code": 2,
                           "error": f"payload is {size} bytes of JSON; at most "
                                    f"{MAX_PAYLOAD} fit in the frame that takes it to a worker"})
            return
        if json_depth(payload) > MAX_DEPTH:
            _send(writer, {"event": "refused", "code": 2,
                           "error": f"payload nests deeper than {MAX_DEPTH} levels"})
            return
        type_name = str(request.get("type", ""))
        req = sup.jobs.submit_on_demand(type_name, payload, priority, notify)
        if req is None:
            _send(writer, {"event": "refused", "code": 2,
                           "error": sup.config.unknown_type(type_name, absolute=True,
                                                            suggest=True)})
            return
        if not req.done:
            _send(writer, {"event": "accepted", "job_id": req.job_id})
        eof = asyncio.ensure_future(_hang_up(reader, rest))
        waiter = asyncio.ensure_future(done.wait())
        try:
            finished, _ = await asyncio.wait(
                {eof, waiter}, timeout=float(timeout) if timeout else None,
                return_when=asyncio.FIRST_COMPLETED)
            if waiter not in finished:
                withdrawn = True  # what the job does from now on is not its caller's
                became = sup.jobs.abandon_request(req)
                if eof in finished and eof.result():
                    _send(writer, {"event": "refused", "code": 2, "job_id": req.job_id,
                                   "error": "one request per connection: this one sent more "
                                            f"after its request, which was withdrawn ({became})"})
                elif eof not in finished:
                    _send(writer, {"event": "timeout", "job_id": req.job_id,
                                   "error": f"no result within {float(timeout):g} s; {became}"})
        finally:
            eof.cancel()
            waiter.cancel()
            for task in flushing:
                task.cancel()


async def _hang_up(reader: asyncio.StreamReader, rest: bytes) -> bytes:
    """Until an on-demand caller hangs up (b"") or, past its request (the first of it came
    with it: `rest`), sends anything but the blank space a line may end with (a CR, another
    line break), or more than MAX_TRAILING bytes of that: those bytes."""
    data, blank = rest, 0
    while True:
        if data.strip():
            return data
        blank += len(data)
        if blank > MAX_TRAILING:
            return data
        data = await reader.read(FREE_LINE)
        if not data:
            return data


def _seconds(value) -> bool:
    """Whether `value` is a finite number of seconds >= 0 (from JSON: no bool, no NaN)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # an integer too large for a float
        return False


def _line(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":"), default=str).encode() + b"\n"


def _send(writer: asyncio.StreamWriter, msg: dict) -> None:
    writer.write(_line(msg))
