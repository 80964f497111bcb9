"""Run a real `fairsched supervise` as a subprocess and drive it through the CLI, as operators do."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

HANDLERS = Path(__file__).parent / "handlers" / "sup_handlers.py"


def wait_until(condition, timeout: float = 20.0, what: str = "condition", interval=0.05):
    """Call `condition` until it returns something true, and return that; AssertionError
    naming `what` (a string, or a function giving one) once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(interval)
    return found


def read_until(proc: subprocess.Popen, condition, timeout: float = 20.0,
               what: str = "its output") -> bytes:
    """What `proc` has written to its stdout pipe, read as it comes until `condition(bytes)`
    holds; AssertionError naming `what` if it has not within `timeout` seconds, or `proc`
    closed its stdout first. The rest is left in the pipe (`communicate()` reads it)."""
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while not condition(seen):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"timed out waiting for {what}; read so far: {seen[-2000:]!r}")
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"stdout closed before {what}: {seen[-2000:]!r}")
            seen += chunk
    return seen


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a listener the test configures)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fairsched(*args, env=None, timeout=60, input=None):
    return subprocess.run([sys.executable, "-m", "fairsched", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, input=input)


class Supervisor:
    """A supervisor under test: writes its workers.toml, starts it, cleans up every process."""

    def __init__(self, database_url: str, workers: str, supervisor: str = "", scoring: str = "",
                 shutdown_timeout: float = 5):
        # Short paths: the control socket lives under state_dir (Unix sockets are ~107 bytes).
        self.dir = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
        shutil.copy(HANDLERS, self.dir / "sup_handlers.py")
        self.config = self.dir / "workers.toml"
        self.config.write_text(
            f"[supervisor]\nstate_dir = \"state\"\nshutdown_timeout = {shutdown_timeout}\n"
            + textwrap.dedent(supervisor) + "\n[scoring]\n" + textwrap.dedent(scoring) + "\n"
            + textwrap.dedent(workers))
        self.env = dict(os.environ, FAIRSCHED_DATABASE_URL=database_url,
                        FAIRSCHED_CONFIG=str(self.config))
        self.log = self.dir / "supervisor.log"
        self.proc: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()
        self.children: list[subprocess.Popen] = []

    def start(self, wait: bool = True, pass_fds: tuple[int, ...] = (),
              listening: bool = False) -> Supervisor:
        """Start it; with `wait`, until its workers are ready; with `listening` too, until its
        LISTEN is in effect (see wait_listening)."""
        if getattr(self, "_logf", None):
            self._logf.close()
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fairsched", "supervise", "--config", str(self.config)],
            stdout=self._logf, stderr=subprocess.STDOUT, env=self.env, pass_fds=pass_fds)
        if wait:
            self.wait_for(lambda ps: all(s["state"] in ("free", "busy", "fatal") for s in ps["slots"]),
                          what="all workers ready")
        if listening:
            self.wait_listening()
        return self

    def wait_listening(self, timeout: float = 20.0) -> None:
        """Until the supervisor's notification connection has its LISTENs in effect. Its first
        fetch may come before them, so a job inserted in between is only found by the next
        poll: a test with a long poll_interval that counts on the notification waits here."""
        import psycopg

        from fairsched.store.schema import CANCEL_CHANNEL

        name = f"fairsched notifications (pid {self.proc.pid})"

        def listening():
            with psycopg.connect(self.env["FAIRSCHED_DATABASE_URL"], autocommit=True) as conn:
                # The second LISTEN done (idle after it): the first, for jobs, is in effect too.
                return conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
                    " AND state = 'idle' AND query = %s",
                    (name, f"LISTEN {CANCEL_CHANNEL}")).fetchone() is not None

        wait_until(listening, timeout, interval=0.02,
                   what=lambda: f"{name} to LISTEN:\n{self.output()[-2000:]}")

    def cli(self, *args, timeout=60, input=None):
        return fairsched(*args, env=self.env, timeout=timeout, input=input)

    def enqueue(self, type_name: str, *args: str, payload=None) -> int:
        """`fairsched submit TYPE [ARGS]` with `payload` as JSON, if given: the new job's id."""
        extra = () if payload is None else ("--payload", json.dumps(payload))
        result = self.cli("submit", type_name, *extra, *args)
        assert result.returncode == 0, result.stderr
        return int(result.stdout)

    def spawn_cli(self, *args) -> subprocess.Popen:
        child = subprocess.Popen([sys.executable, "-m", "fairsched", *args], env=self.env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.children.append(child)
        return child

    def ps(self) -> dict:
        """What `fairsched ps --json` prints, asked over the control socket from this process
        (the tests that check the command itself run it): a poll costs a round trip, not the
        start of a Python interpreter. RuntimeError while the supervisor does not answer."""
        from fairsched.cli.supervisor_cmds import add_process_figures
        from fairsched.config import control_socket_of
        from fairsched.control_client import ControlClient, NoAnswer, NotRunning

        client = ControlClient(control_socket_of(self.config), timeout=30.0, starting_within=0)
        try:
            data = add_process_figures(client.ps())
        except (NotRunning, NoAnswer, OSError) as exc:
            raise RuntimeError(str(exc)) from None
        self.seen_pids.update(s["pid"] for s in data["slots"] if s["pid"])
        return data

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited ({self.proc.returncode}) waiting for "
                                     f"{what}:\n{self.output()}")
            try:
                last = self.ps()
                if predicate(last):
                    return last
            except RuntimeError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; last ps: {json.dumps(last)[:2000]}\n"
                             f"{self.output()[-3000:]}")

    def wait_output(self, pattern: str, timeout: float = 20.0) -> re.Match:
        """The first match of `pattern` in the supervisor's output, once it is there."""
        return wait_until(lambda: re.search(pattern, self.output()), timeout,
                          lambda: f"{pattern!r} in the output:\n{self.output()[-2000:]}")

    def slots(self, worker: str | None = None) -> list[dict]:
        return [s for s in self.ps()["slots"] if worker in (None, s["worker"], s["group"])]

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.communicate()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.seen_pids:
            try:
                p = psutil.Process(pid)
                if self.dir.name in " ".join(p.environ().values()) or p.status() == "zombie":
                    p.kill()
            except psutil.Error:
                pass
        if getattr(self, "_logf", None):
            self._logf.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def sleeping(pid: int) -> bool:
    """Whether the process sleeps now (time.sleep): a command in its retry loop, between two
    tries, having found the supervisor busy or still starting (Linux: /proc/PID/wchan)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() in ("hrtimer_nanosleep", "do_nanosleep")
    except OSError:
        return False


def reading(pid: int) -> bool:
    """Whether the process waits to read a Unix socket, all that came on it read: a command
    that has taken every event the supervisor sent so far (Linux: /proc/PID/wchan)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() == "unix_stream_read_generic"
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
