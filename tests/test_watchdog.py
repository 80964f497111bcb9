"""The lease watchdog as the supervisor runs it: a process of its own, told over a socket which
workers run queued jobs and until when the lease holds, killing their process groups when a
lease ends unrenewed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from fairsched.supervisor.watchdog import Watchdog, clock, parse_state
from fairsched.worker.launch import python_environ, start_helper
from tests.supervisor_harness import alive


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
                            python_environ(), tmp_path / "watchdog.log")
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


async def answered(dog: Watchdog, timeout: float = 10.0) -> None:
    """Until the watchdog has answered every line `dog` sent it."""
    deadline = time.monotonic() + timeout
    while dog._unanswered_since is not None:
        assert time.monotonic() < deadline, "the watchdog did not answer"
        dog._read_reports()
        await asyncio.sleep(0.01)


def tell(watchdog, until: float | None, *pids: int) -> None:
    line = " ".join(["-" if until is None else repr(until), *map(str, pids)])
    watchdog.sock.sendall(line.encode() + b"\n")


def read_lines(watchdog, n: int) -> list[bytes]:
    data = b""
    while data.count(b"\n") < n:
        chunk = watchdog.sock.recv(100)
        assert chunk, data
        data += chunk
    return data.splitlines()


def test_an_unrenewed_lease_kills_the_busy_workers_groups_and_says_so_first(watchdog, groups):
    busy, idle = groups(), groups()
    watchdog.sock.sendall(b"%r %d + %d\n" % (clock() + 0.3, busy.pid, idle.pid))
    assert read_lines(watchdog, 2) == [b"ok", b"killed %d" % busy.pid]
    assert busy.gone()  # the worker and what it started
    assert not idle.gone(timeout=0.3)


def test_renewals_keep_busy_workers_alive(watchdog, groups):
    busy = groups()
    for _ in range(10):  # a second, more than three leases' worth
        tell(watchdog, clock() + 0.3, busy.pid)
        time.sleep(0.1)
    tell(watchdog, clock() + 0.3)  # its queued job ended: nothing to kill
    assert not busy.gone(timeout=0.6)
    tell(watchdog, None, busy.pid)  # no lease yet: nothing to count down
    assert not busy.gone(timeout=0.3)


def test_the_watchdog_answers_the_lines_it_reads_twice_a_second_at_most(watchdog):
    answers, data = [], b""  # when each answer came (read as it comes), what they said

    def take(timeout: float) -> None:
        nonlocal data
        watchdog.sock.settimeout(timeout)
        chunk = watchdog.sock.recv(100)
        assert chunk, data
        data += chunk
        answers.extend([time.monotonic()] * chunk.count(b"\n"))

    first_line = time.monotonic()
    for _ in range(20):
        tell(watchdog, None)
        deadline = time.monotonic() + 0.05
        with contextlib.suppress(TimeoutError):
            while (left := deadline - time.monotonic()) > 0:
                take(left)
    tell(watchdog, None)
    last_line = time.monotonic()
    # One answer at once, then one for each half second that brought lines, the last one
    # owed for the last line even though no line follows it; then nothing, no line coming.
    with pytest.raises(TimeoutError):
        while True:
            take(1.5)
    assert set(data.splitlines()) == {b"ok"}, data
    # The lines took a second or more to send (longer on a busy machine): three answers or
    # more, the k-th (from 0) no sooner than k half seconds after the first line (a late
    # read only makes it later), the last one after the last line.
    assert len(answers) >= 3, data
    early = [k for k, at in enumerate(answers) if at - first_line < 0.45 * k]
    assert early == [], [round(at - first_line, 3) for at in answers]
    assert answers[-1] >= last_line


def test_the_watchdog_leaves_when_the_supervisor_does_and_takes_every_worker_along(
        watchdog, groups):
    busy, idle, stranger = groups(), groups(), groups()
    watchdog.sock.sendall(b"%r %d + %d\n" % (clock() + 60, busy.pid, idle.pid))
    assert read_lines(watchdog, 1) == [b"ok"]  # started up, told
    os.kill(watchdog.pid, signal.SIGTERM)  # a service manager's stop: it waits for the end
    watchdog.sock.sendall(b"%r %d + %d\n" % (clock() + 60, busy.pid, idle.pid))
    assert read_lines(watchdog, 1) == [b"ok"]  # it lived on past the signal
    watchdog.sock.shutdown(socket.SHUT_RDWR)  # the supervisor is gone (killed, say)
    _, status = os.waitpid(watchdog.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert busy.gone() and idle.gone()  # nothing of the supervisor's may outlive it
    assert not stranger.gone(timeout=0.3)


def test_a_supervisor_gone_with_an_answer_unread_still_takes_its_workers_along(watchdog,
                                                                               groups):
    # Its end closed with the watchdog's "ok" unread: the watchdog's next read is a reset,
    # not an EOF, and meant the same (it exited 70, leaving the workers running).
    busy, idle = groups(), groups()
    watchdog.sock.sendall(b"%r %d + %d\n" % (clock() + 60, busy.pid, idle.pid))
    assert watchdog.sock.recv(100, socket.MSG_PEEK) == b"ok\n"  # answered, the answer unread
    watchdog.sock.close()
    _, status = os.waitpid(watchdog.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert busy.gone() and idle.gone()


def test_a_supervisor_gone_before_its_answer_could_be_sent_still_takes_its_workers_along(
        watchdog, groups):
    # Its end no longer reads: the watchdog's answer fails (EPIPE) before any EOF is seen.
    busy, idle = groups(), groups()
    watchdog.sock.sendall(b"%r %d + %d\n" % (clock() + 60, busy.pid, idle.pid))
    assert read_lines(watchdog, 1) == [b"ok"]
    watchdog.sock.shutdown(socket.SHUT_RD)
    watchdog.sock.sendall(b"%r %d + %d\n" % (clock() + 60, busy.pid, idle.pid))  # owed an ok
    _, status = os.waitpid(watchdog.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert busy.gone() and idle.gone()


def test_lines_that_waited_while_the_watchdog_was_stopped_do_not_end_a_renewed_lease(
        tmp_path, groups):
    # The supervisor's own end (Watchdog) keeps renewing while the watchdog is stopped: the
    # socket fills with lines that are stale by the time they are read, and the newest waits
    # on the supervisor's side. Back, the watchdog must not kill on the stale ones.
    busy = groups()

    async def scenario() -> Watchdog:
        loop = asyncio.get_running_loop()
        dog = Watchdog(loop, tmp_path / "watchdog.log", lambda: [busy.pid])
        dog.start()
        dog.lease(loop.time() + 0.3)
        await answered(dog)  # started up
        os.kill(dog.pid, signal.SIGSTOP)
        try:
            for _ in range(3000):  # more than the socket holds
                dog.lease(loop.time() + 0.3)
                await asyncio.sleep(0)
            await asyncio.sleep(0.3)  # every one of them stale now
            dog.lease(loop.time() + 10)
            await asyncio.sleep(0)
            assert dog._unsent  # the newest line has not reached the socket
        finally:
            os.kill(dog.pid, signal.SIGCONT)
        # It has read what was queued and answered; a second answer comes after it has acted
        # on that (a kill is told before the answer that follows it).
        await answered(dog)
        dog.lease(loop.time() + 10)
        await answered(dog)
        dog.close()
        return dog

    dog = asyncio.run(scenario())
    os.waitpid(dog.pid, 0)
    assert not busy.gone(timeout=0.1)
    assert not dog.killed


def test_a_worker_made_busy_is_told_before_the_loop_turns(tmp_path, groups):
    # The supervisor writes a worker's `run` frame and then stalls at once: flush() has
    # told the watchdog already, which kills the worker when the lease ends, stall or not.
    worker = groups()
    busy: list[int] = []
    killed_in_stall = []

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        dog = Watchdog(loop, tmp_path / "watchdog.log", lambda: busy, lambda: [worker.pid])
        dog.start()
        dog.lease(loop.time() + 10)
        await answered(dog)  # started up, told: nobody busy
        dog.lease(loop.time() + 0.3)
        busy.append(worker.pid)
        dog.busy(worker.pid)
        dog.flush()  # as the supervisor does before it writes the run frames
        killed_in_stall.append(worker.gone(timeout=2))  # the loop does not turn meanwhile
        dog.close()
        return dog.pid

    os.waitpid(asyncio.run(scenario()), 0)
    assert killed_in_stall == [True]
    said = (tmp_path / "watchdog.log").read_text()  # dated, as the supervisor's log lines
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} fairsched lease watchdog: the "
                        r"supervisor's lease ended with no renewal; killed the workers running "
                        rf"its queued jobs \(pids {worker.pid}\)\n", said), said


def test_state_lines_read_as_written():
    assert parse_state(b"-") == (None, (), ())
    assert parse_state(b"12.5 40 41 + 42") == (12.5, (40, 41), (42,))


@pytest.mark.parametrize("line", [b"", b"soon 12", b"1.5 1", b"1.5 x", b"1.5 + 1"])
def test_state_lines_are_checked(line):
    with pytest.raises(ValueError):
        parse_state(line)
