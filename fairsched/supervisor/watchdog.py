"""The lease watchdog: a small process beside the supervisor that ends its queued jobs when
the supervisor itself is too stalled to do so.

A supervisor that cannot renew its lease gives its queued jobs back and kills their workers
before other supervisors may take them over (lease.py). That takes a running event loop. A
supervisor that is stopped (SIGSTOP, Ctrl-Z), swapping, or otherwise stuck cannot, and its
workers would go on running jobs that another supervisor starts again. So the supervisor tells
this process, over a socketpair, until when its lease holds for its workers, which workers
may be running queued jobs, and which others there are; one line each time, the whole state:

    <lease end, CLOCK_BOOTTIME seconds, or "-" for none> <busy pid> ... [+ <other pid> ...]

CLOCK_BOOTTIME is the same in every process of the host and, unlike CLOCK_MONOTONIC, goes on
counting while the host is suspended (the other hosts' clocks do). When the lease ends with
no newer line, the watchdog writes "killed <pid>" for each busy worker, then kills their
process groups (SIGKILL: the workers and whatever their jobs started). It answers the lines it
reads with "ok" (at most every ANSWER_EVERY seconds), so the supervisor can tell that it is
still there: one that goes quiet (stopped, say) is killed and replaced. When the supervisor's
end of the socket closes (it exited, or was killed) it kills every worker's group: no worker,
nor what its jobs started, may outlive the supervisor (a `command` worker busy in a job may
not notice it is gone), and its queued jobs will run again elsewhere. It runs in a session of its own, so what stops the supervisor's
terminal group does not stop it, and ignores SIGTERM (a service manager's stop): it leaves
when the supervisor does. Only the standard library is imported: it starts in a few tens of
milliseconds and stays small.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

CHANNEL_FD = 3
GRACE = 0.05  # seconds a passed deadline waits once for a fresher line already on its way
ANSWER_EVERY = 0.5  # seconds between "ok" answers at most
SLICE = 0.25  # seconds the watchdog sleeps at most while a lease counts down
SILENCE = 5.0  # seconds a line may go unanswered before the watchdog is taken for stuck
RESTART_FIRST = 1.0  # seconds before a watchdog that died is started again, doubling to
RESTART_MAX = 30.0
STEADY = 60.0  # seconds up after which a watchdog's restarts count from RESTART_FIRST again

log = logging.getLogger("fairsched.supervisor")

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def clock() -> float:
    """Seconds on the clock the lease ends are given in (CLOCK_BOOTTIME on Linux)."""
    return time.monotonic() if _BOOTTIME is None else time.clock_gettime(_BOOTTIME)


def parse_state(line: bytes) -> tuple[float | None, tuple[int, ...], tuple[int, ...]]:
    """(lease end, busy worker pids, other worker pids) from one state line; ValueError when
    it is not one."""
    words = line.split()
    if not words:
        raise ValueError("empty state line")
    until = None if words[0] == b"-" else float(words[0])
    busy, others = words[1:], []
    if b"+" in busy:
        cut = busy.index(b"+")
        busy, others = busy[:cut], busy[cut + 1:]
    pids = tuple(int(w) for w in busy), tuple(int(w) for w in others)
    if any(pid <= 1 for group in pids for pid in group):
        raise ValueError(f"not a worker pid in {line!r}")
    return until, *pids


def _drain(sock: socket.socket, buffer: bytes) -> tuple[bytes, bytes, bool]:
    """All the socket holds now: (the newest complete line or b"", the unfinished rest,
    whether the other end has closed)."""
    closed = False
    while True:
        try:
            chunk = sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            break
        except ConnectionResetError:  # it closed with our lines unread: gone all the same
            closed = True
            break
        if not chunk:
            closed = True
            break
        buffer += chunk
    done, _, rest = buffer.rpartition(b"\n")
    return done.rpartition(b"\n")[2], rest, closed


def _say(sock: socket.socket, data: bytes) -> bool:
    """Send to the supervisor; False when it is gone (EPIPE: it closed or died)."""
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _kill(pids: tuple[int, ...]) -> None:
    # Process groups only: a pid alone may have been given to another process by now. A
    # worker too new to lead its own session has no job, and leaves once its pipe closes.
    for pid in pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def watch(sock: socket.socket) -> None:
    """Serve the supervisor's state lines until its end closes; kill at each lease's end."""
    buffer = b""
    until: float | None = None
    busy: tuple[int, ...] = ()
    others: tuple[int, ...] = ()
    graced: float | None = None  # the lease end a grace was given for (once each)
    answered = -ANSWER_EVERY  # when the last "ok" went out
    owed = False  # a line came since
    while True:
        deadlines = [] if until is None or not busy else [until]
        if owed:
            deadlines.append(answered + ANSWER_EVERY)
        # In slices: select() counts on CLOCK_MONOTONIC, which stands still while the host
        # is suspended; the lease end is on CLOCK_BOOTTIME, which does not.
        timeout = min(SLICE, max(0.0, min(deadlines) - clock())) if deadlines else None
        if select.select([sock], [], [], timeout)[0]:
            # Everything queued, newest state only: lines that waited while this process was
            # slow (or stopped) are old news, and must not end a lease renewed since.
            line, buffer, closed = _drain(sock, buffer)
            if line:
                until, busy, others = parse_state(line)
                owed = True
            if closed:  # the supervisor is gone; its queued jobs will run again elsewhere
                _kill(busy + others)
                return
        if owed and clock() >= answered + ANSWER_EVERY:
            if not _say(sock, b"ok\n"):  # the supervisor is gone, as with an EOF
                _kill(busy + others)
                return
            answered, owed = clock(), False
        if until is None or not busy or clock() < until:
            continue
        if graced != until:  # a renewal may be just on its way: wait for it once
            graced = until
            if select.select([sock], [], [], GRACE)[0]:
                continue
        # The report goes first: the supervisor reads it before it can see the exits.
        if not _say(sock, b"".join(b"killed %d\n" % pid for pid in busy)):
            _kill(busy + others)
            return
        _kill(busy)
        _note(f"the supervisor's lease ended with no renewal; killed the workers running its "
              f"queued jobs (pids {', '.join(map(str, busy))})")
        others += busy  # their pids stay taken until the supervisor reaps them
        busy = ()


def _note(message: str) -> None:
    """A line of watchdog.log (its stderr), dated as the supervisor's log lines are."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    print(f"{stamp} fairsched lease watchdog: {message}", file=sys.stderr, flush=True)


class Watchdog:
    """The supervisor's end: starts the watchdog, keeps it told, and hears whom it killed.

    `busy_pids()` gives the pids of the workers running queued jobs now, `worker_pids()` those
    of all its workers. `busy()` (a worker took its first queued job), `born()` and `gone()`
    (a worker's pid became known, or it exited) send the new state at once, in the loop's
    next turn, or sooner with `flush()`, which the supervisor calls before it writes `run`
    frames. A worker whose last queued job ended waits for the next line to go
    out, at the latest with the next lease renewal: that only spares an idle worker, and a
    pool of one-slot workers goes busy and idle with every job.
    """

    def __init__(self, loop, log_path: Path, busy_pids, worker_pids=tuple):
        self.loop = loop
        self.log_path = log_path
        self.busy_pids = busy_pids
        self.worker_pids = worker_pids
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.until: float | None = None  # loop time (time.monotonic()) the lease ends
        self.killed: set[int] = set()
        self.closing = False
        self._sent_busy: frozenset[int] = frozenset()
        self._unsent = b""  # the rest of a line the socket did not take at once
        self._scheduled = False
        self._reports = b""
        self._started_at = 0.0
        self._restarts = 0  # in a row: how long the next restart waits
        self._unanswered_since: float | None = None  # monotonic time of the oldest line unanswered
        self._replacing = False  # it was killed for not answering: start another at once

    def start(self) -> None:
        from fairsched.worker.launch import python_environ, start_helper

        if self.closing or self.pid is not None:
            return
        try:
            launched = start_helper([sys.executable, "-P", "-m", "fairsched.supervisor.watchdog"],
                                    python_environ(), self.log_path)
        except OSError as exc:
            self._restart_later(f"cannot start the lease watchdog ({exc})")
            return
        self.pid, self.sock, self._unsent = launched.pid, launched.sock, b""
        self._sent_busy = frozenset()
        self._unanswered_since = None
        self._started_at = time.monotonic()
        self.loop.add_reader(self.sock.fileno(), self._read_reports)
        self._schedule()

    def lease(self, until: float) -> None:
        """The workers' share of the lease now ends at loop time `until`."""
        self.until = until
        self._schedule()
        self._check_answers()

    def _check_answers(self) -> None:
        """Kill a watchdog that leaves lines unanswered (stopped, or stuck): it could not kill
        on time, and another one will be started."""
        self._read_reports()  # answers that came while this process was busy (or stopped)
        since = self._unanswered_since
        if self.pid is None or self._replacing or since is None:
            return
        silent = time.monotonic() - since
        if silent < SILENCE:
            return
        log.error("the lease watchdog (pid %d) has not answered for %.0f s (stopped?); "
                  "killing it and starting another", self.pid, silent)
        # Killed before its socket closes: a watchdog that sees the socket close kills
        # every worker.
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            return
        self._replacing = True

    def busy(self, pid: int | None) -> None:
        if pid is not None and pid not in self._sent_busy:
            self._schedule()

    def born(self, pid: int) -> None:
        self._schedule()

    def refresh(self) -> None:
        """Send the state now (in the loop's next turn): workers gone idle since the last line
        must not be killed for a lease that is running out."""
        self._schedule()

    def gone(self, pid: int | None) -> None:
        self._schedule()  # its pid must not stay in the watchdog's hands

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send the new state now if one waits: before the `run` frames that make a worker
        busy go out, so that no stall between the two leaves the watchdog unaware of it."""
        if self._scheduled:
            self._send_state()

    def _state_line(self) -> bytes:
        busy = frozenset(self.busy_pids())
        self._sent_busy = busy
        others = sorted(set(self.worker_pids()) - busy)
        if self.until is None:
            until = "-"
        else:  # to the clock the watchdog counts on, which goes on through a suspend
            until = repr(self.until - self.loop.time() + clock())
        words = [until, *map(str, sorted(busy))] + (["+", *map(str, others)] if others else [])
        return " ".join(words).encode() + b"\n"

    def _send_state(self) -> None:
        self._scheduled = False
        if self.sock is None:
            return
        line = self._state_line()
        if self._unsent:  # a line is half out: only the newest state follows it
            self._unsent = self._unsent.partition(b"\n")[0] + b"\n" + line
            return
        self._write(line)

    def _write(self, data: bytes) -> None:
        if self._unanswered_since is None:
            self._unanswered_since = time.monotonic()
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._lost()
            return
        self._unsent = data[sent:]
        if self._unsent:
            self.loop.add_writer(self.sock.fileno(), self._on_writable)

    def _on_writable(self) -> None:
        self.loop.remove_writer(self.sock.fileno())
        data, self._unsent = self._unsent, b""
        self._write(data)

    def _read_reports(self) -> None:
        if self.sock is None:
            return
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            self._reports += data
            *lines, self._reports = self._reports.split(b"\n")
            for line in lines:
                word, _, pid = line.partition(b" ")
                if word == b"ok":
                    self._unanswered_since = None
                elif word == b"killed" and pid.isdigit() and int(pid) in self._sent_busy:
                    self.killed.add(int(pid))

    def took(self, pid: int | None) -> bool:
        """Whether the watchdog killed worker `pid` (each kill is told once)."""
        self._read_reports()
        if pid is None or pid not in self.killed:
            return False
        self.killed.discard(pid)
        return True

    def _lost(self) -> None:
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
            self.sock.close()
            self.sock = None

    def exited(self, status: int) -> None:
        """The watchdog process ended (the supervisor reaped `self.pid`): start another."""
        self._read_reports()  # what it killed before it went
        self._lost()
        self.pid = None
        if self.closing:
            return
        if self._replacing:  # killed for not answering; said so then
            self._replacing = False
            self.start()
            return
        from fairsched.errors import path_name
        from fairsched.supervisor.process import describe_exit

        if time.monotonic() - self._started_at >= STEADY:
            self._restarts = 0
        self._restart_later(f"the lease watchdog ended ({describe_exit(status)}; see "
                            f"{path_name(self.log_path)})")

    def _restart_later(self, why: str) -> None:
        from fairsched.backoff import backoff

        delay = backoff(self._restarts, RESTART_FIRST, RESTART_MAX)
        self._restarts += 1
        log.error("%s; starting it again in %g s (until then a stall of this supervisor "
                  "goes unguarded)", why, delay)
        self.loop.call_later(delay, self.start)

    def close(self) -> None:
        """Let the watchdog go, telling it first that no worker is busy: it exits when its
        socket closes; the caller reaps it."""
        self.closing = True
        if self.sock is not None and not self._unsent:
            with contextlib.suppress(OSError):
                self.sock.send(b"-\n")
        self._lost()


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it leaves when the supervisor does (EOF)
    sock = socket.socket(fileno=CHANNEL_FD)
    sock.setblocking(True)
    try:
        watch(sock)
    except (OSError, ValueError) as exc:
        _note(str(exc))
        sys.exit(os.EX_SOFTWARE)  # fairsched.protocol's import would add a third to its start


if __name__ == "__main__":
    main()
