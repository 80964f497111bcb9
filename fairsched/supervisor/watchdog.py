"""The lease watchdog: a small process beside the supervisor that ends its queued jobs when
the supervisor itself is too stalled to do so.

A supervisor that cannot renew its lease gives its queued jobs back and kills their workers
before other supervisors may take them over (lease.py). That takes a running event loop. A
supervisor that is stopped (SIGSTOP, Ctrl-Z), swapping, or otherwise stuck cannot, and its
workers would go on running jobs that another supervisor starts again. So after every change
the supervisor tells this process, over a socketpair, until when its lease holds for its
workers and which workers run queued jobs; one line each time, the whole state:

    <lease end, time.monotonic() seconds, or "-" for none yet> <pid> <pid> ...

The clock is CLOCK_MONOTONIC, the same in every process of the host. When the lease ends with
no newer line, the watchdog writes "killed <pid>" for each of those workers, then kills their
process groups (SIGKILL: the workers and whatever their jobs started). It runs in a session of
its own, so what stops the supervisor's terminal group does not stop it, and it exits when the
supervisor's end of the socket closes. Only the standard library is imported: it starts in a
few tens of milliseconds and stays small.
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

CHANNEL_FD = 3

log = logging.getLogger("fairsched.supervisor")


def parse_state(line: bytes) -> tuple[float | None, tuple[int, ...]]:
    """(lease end, busy worker pids) from one state line; ValueError when it is not one."""
    words = line.split()
    if not words:
        raise ValueError("empty state line")
    until = None if words[0] == b"-" else float(words[0])
    pids = tuple(int(w) for w in words[1:])
    if any(pid <= 1 for pid in pids):
        raise ValueError(f"not a worker pid in {line!r}")
    return until, pids


def watch(sock: socket.socket) -> None:
    """Serve the supervisor's state lines until its end closes; kill at each lease's end."""
    buffer = b""
    until: float | None = None
    busy: tuple[int, ...] = ()
    while True:
        timeout = None if until is None or not busy else max(0.0, until - time.monotonic())
        readable, _, _ = select.select([sock], [], [], timeout)
        if readable:
            data = sock.recv(65536)
            if not data:
                return  # the supervisor is gone, and its workers with it (they see EOF too)
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            if lines:
                until, busy = parse_state(lines[-1])  # only the newest state counts
        if until is not None and busy and time.monotonic() >= until:
            # The report goes first: the supervisor reads it before it can see the exits.
            sock.sendall(b"".join(b"killed %d\n" % pid for pid in busy))
            for pid in busy:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            print(f"fairsched lease watchdog: the supervisor's lease ended with no renewal; "
                  f"killed the workers running its queued jobs (pids "
                  f"{', '.join(map(str, busy))})", file=sys.stderr, flush=True)
            busy = ()


class Watchdog:
    """The supervisor's end: starts the watchdog, keeps it told, and hears whom it killed.

    `busy_pids()` gives the pids of the workers running queued jobs now; `changed()` says
    that set (or the lease) changed, and the new state goes out once per loop iteration.
    """

    RESTART_DELAY = 1.0  # seconds before a watchdog that died is started again

    def __init__(self, loop, log_path, busy_pids):
        self.loop = loop
        self.log_path = log_path
        self.busy_pids = busy_pids
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.until: float | None = None
        self.killed: set[int] = set()
        self.closing = False
        self._unsent = b""  # the rest of a line the socket did not take at once
        self._scheduled = False
        self._reports = b""

    def start(self) -> None:
        from fairsched.worker.launch import start_helper

        if self.closing or self.pid is not None:
            return
        try:
            launched = start_helper([sys.executable, "-P", "-m", "fairsched.supervisor.watchdog"],
                                    self.log_path)
        except OSError as exc:
            log.error("cannot start the lease watchdog (%s); trying again in %g s", exc,
                      self.RESTART_DELAY)
            self.loop.call_later(self.RESTART_DELAY, self.start)
            return
        self.pid, self.sock, self._unsent = launched.pid, launched.sock, b""
        self.loop.add_reader(self.sock.fileno(), self._read_reports)
        self.changed()

    def lease(self, until: float) -> None:
        """The workers' share of the lease now ends at loop time `until`."""
        self.until = until
        self.changed()

    def changed(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._send_state)

    def _send_state(self) -> None:
        self._scheduled = False
        if self.sock is None:
            return
        until = "-" if self.until is None else repr(self.until)
        line = " ".join([until, *map(str, self.busy_pids())]).encode() + b"\n"
        if self._unsent:  # a line is half out: this one follows once the socket takes it
            self._unsent += line
            return
        self._write(line)

    def _write(self, data: bytes) -> None:
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
        # Only the newest full state matters: finish the line under way, then send that.
        first, newline, rest = data.partition(b"\n")
        if rest:
            rest = rest.rstrip(b"\n").rpartition(b"\n")[2] + b"\n"
        self._write(first + newline + rest)

    def _read_reports(self) -> None:
        if self.sock is None:
            return
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
            if word == b"killed" and pid.isdigit():
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
        self._lost()
        self.pid = None
        if not self.closing:
            from fairsched.supervisor.process import describe_exit

            log.error("the lease watchdog ended (%s; see %s); starting it again in %g s",
                      describe_exit(status), self.log_path, self.RESTART_DELAY)
            self.loop.call_later(self.RESTART_DELAY, self.start)

    def close(self) -> None:
        """Let the watchdog go: it exits when its socket closes; the caller reaps it."""
        self.closing = True
        self._lost()


def main() -> None:
    from fairsched.worker._linux import set_parent_death_signal

    with contextlib.suppress(OSError):
        set_parent_death_signal(signal.SIGKILL)
    sock = socket.socket(fileno=CHANNEL_FD)
    sock.setblocking(True)
    try:
        watch(sock)
    except (OSError, ValueError) as exc:
        print(f"fairsched lease watchdog: {exc}", file=sys.stderr, flush=True)
        sys.exit(70)


if __name__ == "__main__":
    main()
