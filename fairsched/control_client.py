"""Talk to a running supervisor over its control socket (newline-delimited JSON)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from fairsched.errors import FairschedError, path_name

# Beside the socket: the running supervisor holds a lock on it and writes its pid there.
LOCK_FILE = "supervisor.lock"
# Seconds a supervisor just started (it holds its lock) has to open its control socket and
# say which database it uses; a command waits that long for it.
STARTING_WITHIN = 15.0


def lock_holder(folder: Path) -> int | None:
    """The pid of the supervisor whose lock file is in `folder` while that process still runs
    (it wrote the file after it started: a later process given the same pid did not), else
    None. Read only: taking the lock, even for a moment, could make a supervisor starting
    just then take itself for a second one."""
    import psutil

    path = Path(folder) / LOCK_FILE
    try:
        written = path.stat().st_mtime
        pid = int(path.read_text().strip())
        process = psutil.Process(pid)
        started = process.create_time()
        if process.status() == psutil.STATUS_ZOMBIE:  # exited (its lock went with it)
            return None
    except (OSError, ValueError, psutil.Error):
        return None
    return pid if started <= written + 1.0 else None


class NotRunning(FairschedError):
    pass


class NoSupervisor(NotRunning):
    """Nothing runs there: no supervisor holds the state directory's lock."""


class NoAnswer(FairschedError):
    """The supervisor took the request and said nothing in time: stalled, or stopped."""


class NotASupervisor(NotRunning):
    """What listens on the socket answered in a way no fairsched supervisor does: no
    supervisor runs there."""


def request_line(request: dict) -> bytes:
    """`request` as one line of compact JSON in UTF-8, the size the supervisor measures a
    payload in (escaped, "😀" would take 12 bytes for UTF-8's 4); escaped ASCII only when it
    holds a lone surrogate, which UTF-8 cannot."""
    try:
        return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(request, separators=(",", ":")).encode() + b"\n"


class ControlClient:
    def __init__(self, path: Path, timeout: float | None = 30.0,
                 starting_within: float = STARTING_WITHIN):
        self.path = Path(path)
        self.name = path_name(self.path)  # as messages spell it: one line, whatever the path
        self.timeout = timeout
        self.starting_within = starting_within

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.starting_within
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.path))
                return sock
            except BlockingIOError:
                # Its backlog of connections not yet accepted is full (a burst of callers, a
                # supervisor busy a moment): a socket with a timeout is told so at once,
                # where a blocking one would wait its turn. Wait likewise.
                sock.close()
                if time.monotonic() >= deadline:
                    raise NotRunning(f"the supervisor on {self.name} has accepted no "
                                     f"connection within {self.starting_within:g} s: too "
                                     "busy, or stalled; try again") from None
                time.sleep(0.05)
                continue
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
            except PermissionError as exc:
                sock.close()
                raise NotRunning(f"cannot reach the supervisor on {self.name}: "
                                 f"{self._whose() or exc.strerror}") from None
            except OSError as exc:  # a file where a folder should be, a path too long, ...
                sock.close()
                raise NotRunning(f"cannot reach a supervisor on {self.name}: "
                                 f"{exc.strerror or exc}") from None
            # A supervisor holds its lock from its start, and listens once its database is
            # ready: while it starts, wait for it (a stop said now would stop nothing).
            pid = lock_holder(self.path.parent)
            if pid is None:
                raise NoSupervisor(f"no supervisor is running on {self.name} "
                                   "(start one with `fairsched supervise --config ...`)")
            if time.monotonic() >= deadline:
                raise NotRunning(f"the supervisor (pid {pid}) has not opened {self.name} within "
                                 f"{self.starting_within:g} s: still starting (its database, "
                                 "say), or stalled; try again")
            time.sleep(0.1)

    def _whose(self) -> str | None:
        """Whose the control socket is, and who to run as, when this user may not use it."""
        from fairsched.permissions import not_writable

        for path in (self.path.parent, self.path):
            try:
                problem = not_writable(path)
            except PermissionError:  # in a folder this user cannot enter (state_dir): whose
                try:
                    problem = not_writable(path.parent)
                except OSError:
                    continue
            except OSError:
                continue
            if problem:
                return problem
        return None

    def stream(self, request: dict, timeout: float | None = ...,
               then: float | None = ...) -> Iterator[dict]:
        """Send one request and yield every reply line until the supervisor closes; `timeout`
        (default: the client's) for each, or for the first only when `then` is given."""
        sock = self._connect()
        if timeout is not ...:
            sock.settimeout(timeout)
        try:
            try:
                sock.sendall(request_line(request))
            except (BrokenPipeError, ConnectionResetError):
                pass  # it may have said why (a request too large) before it closed: read on
            except TimeoutError:  # a large payload, and a supervisor that reads none of it
                pid = self.supervisor_pid()
                raise NoAnswer(f"the supervisor (pid {pid}) did not take the request within "
                               f"{sock.gettimeout():g} s: stalled, or stopped with SIGSTOP "
                               f"(`kill -CONT {pid}` wakes it)") from None
            buf = b""
            with sock.makefile("rb") as f:
                while True:
                    waited = sock.gettimeout()
                    try:
                        line = f.readline()
                    except TimeoutError:
                        pid = self.supervisor_pid()
                        raise NoAnswer(f"the supervisor (pid {pid}) did not answer within "
                                       f"{waited:g} s: stalled, or stopped with SIGSTOP "
                                       f"(`kill -CONT {pid}` wakes it)") from None
                    if not line:
                        break
                    buf = line.strip()
                    if buf:
                        yield self._reply(buf)
                        if then is not ...:
                            sock.settimeout(then)
        finally:
            sock.close()

    def _reply(self, line: bytes) -> dict:
        try:
            reply = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            reply = None
        if not isinstance(reply, dict):
            raise self.not_a_supervisor(line)
        return reply

    def not_a_supervisor(self, answer: bytes | dict) -> NotASupervisor:
        """The error for an answer no fairsched supervisor gives (`--socket` naming another
        program's socket, say)."""
        if isinstance(answer, dict):
            answer = json.dumps(answer).encode()
        said = repr(answer[:60])[2:-1] + ("..." if len(answer) > 60 else "")
        return NotASupervisor(f"{self.name} is not a fairsched supervisor's control socket: "
                              f"it answered '{said}'")

    def supervisor_pid(self) -> str:
        """The pid in the supervisor's lock file (beside its socket), or '?'."""
        try:
            return (self.path.parent / LOCK_FILE).read_text().strip() or "?"
        except OSError:
            return "?"

    def request(self, request: dict) -> dict:
        for reply in self.stream(request):
            return reply
        raise NotRunning(f"the supervisor on {self.name} closed the connection without answering")

    def ps(self) -> dict:
        reply = self.request({"cmd": "ps"})
        if "ps" not in reply and "error" in reply:  # refused: too many connections, say
            raise NotRunning(f"the supervisor on {self.name} did not answer: {reply['error']}")
        ps = reply.get("ps")
        if not (isinstance(ps, dict) and isinstance(ps.get("supervisor"), dict)
                and isinstance(ps.get("slots"), list)
                and all(isinstance(slot, dict) for slot in ps["slots"])):
            raise self.not_a_supervisor(reply)
        return ps
