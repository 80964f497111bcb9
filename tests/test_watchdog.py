"""The lease watchdog as the supervisor runs it: a process of its own, told over a socket which
workers run queued jobs and until when the lease holds, killing their process groups when a
lease ends unrenewed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fairsched.supervisor.watchdog import parse_state
from fairsched.worker.launch import start_helper


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Group:
    """A stand-in worker: a process group of a shell and the `sleep` it started."""

    def __init__(self):
        self.proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"],
                                     stdout=subprocess.PIPE, start_new_session=True, text=True)
        self.pid = self.proc.pid
        self.child = int(self.proc.stdout.readline())
        self.proc.stdout.close()

    def gone(self, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not alive(self.child):
                return True
            time.sleep(0.01)
        return False

    def cleanup(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture
def watchdog(tmp_path):
    launched = start_helper([sys.executable, "-P", "-m", "fairsched.supervisor.watchdog"],
                            tmp_path / "watchdog.log")
    launched.sock.setblocking(True)
    launched.sock.settimeout(10)
    yield launched
    launched.sock.close()
    try:
        os.waitpid(launched.pid, 0)
    except ChildProcessError:
        pass  # the test reaped it


@pytest.fixture
def groups():
    made: list[Group] = []

    def make() -> Group:
        made.append(Group())
        return made[-1]

    yield make
    for group in made:
        group.cleanup()


def tell(watchdog, until: float | None, *pids: int) -> None:
    line = " ".join(["-" if until is None else repr(until), *map(str, pids)])
    watchdog.sock.sendall(line.encode() + b"\n")


def test_an_unrenewed_lease_kills_the_busy_workers_groups_and_says_so_first(watchdog, groups):
    busy, idle = groups(), groups()
    tell(watchdog, time.monotonic() + 0.3, busy.pid)
    assert watchdog.sock.recv(100) == b"killed %d\n" % busy.pid
    assert busy.gone()  # the worker and what it started
    assert not idle.gone(timeout=0.3)


def test_renewals_keep_busy_workers_alive(watchdog, groups):
    busy = groups()
    for _ in range(10):  # a second, more than three leases' worth
        tell(watchdog, time.monotonic() + 0.3, busy.pid)
        time.sleep(0.1)
    tell(watchdog, time.monotonic() + 0.3)  # its queued job ended: nothing to kill
    assert not busy.gone(timeout=0.6)
    tell(watchdog, None, busy.pid)  # no lease yet: nothing to count down
    assert not busy.gone(timeout=0.3)


def test_the_watchdog_leaves_when_the_supervisor_does(watchdog):
    watchdog.sock.shutdown(2)
    _, status = os.waitpid(watchdog.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("line", [b"", b"soon 12", b"1.5 1", b"1.5 x"])
def test_state_lines_are_checked(line):
    with pytest.raises(ValueError):
        parse_state(line)
