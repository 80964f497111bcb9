"""Drive the actor in this test process: a Supervisor on a real event loop, with real worker
processes and the real PostgreSQL, and no `fairsched supervise` around it.

A test waits on what the actor reports as it happens (its observer calls and its log lines,
each of which wakes the waiting test) rather than on polls of a subprocess; it reads the
actor's state directly (`ps()` is what `fairsched ps --json` prints) and submits on-demand
requests the way the control socket does. The end-to-end tests of the commands stay with
tests/supervisor_harness.py.

    def test_it(actor):
        async def scenario(a):
            answer = await a.on_demand("pdf", {"n": 1}).outcome()
            ...
        actor(WORKERS, scenario)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import tempfile
import textwrap
import time
from pathlib import Path

import psycopg

from fairsched.config import load_config
from fairsched.protocol import payload_json
from fairsched.store.queue import Queue
from fairsched.supervisor.actor import Supervisor
from fairsched.supervisor.hooks import Observer
from fairsched.supervisor.states import (
    IGNORED_SIGNALS,
    RELOAD_SIGNALS,
    STOP_SIGNALS,
    ProcessState,
)
from fairsched.supervisor.status import snapshot
from fairsched.worker._linux import PR_SET_CHILD_SUBREAPER, _prctl
from tests.supervisor_harness import HANDLERS

READY = (ProcessState.RUNNING, ProcessState.FATAL)
# Waits wake on every report; this is only how often a condition that changed without one
# (none is expected) is looked at again.
RECHECK = 0.5


class Reports(Observer):
    """What the actor reported: its observer calls, in order, and its log lines. Each wakes
    whoever waits (`news`)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.lines: list[str] = []
        self.news = asyncio.Event()
        self.watchers: list = []  # called (soon: not inside the actor's step) at each report

    def note(self, *call) -> None:
        self.calls.append(call)
        self.told()

    def told(self) -> None:
        self.news.set()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a line logged in another thread: the loop's own reports follow
            return
        for watcher in self.watchers:
            loop.call_soon(watcher)

    def job_started(self, job_type: str, waited: float) -> None:
        self.note("job_started", job_type)

    def job_finished(self, job_type: str, outcome: str, seconds: float) -> None:
        self.note("job_finished", job_type, outcome)

    def job_unrecorded(self, job_type: str, outcome: str) -> None:
        self.note("job_unrecorded", job_type, outcome)

    def worker_restarted(self, group: str) -> None:
        self.note("worker_restarted", group)

    def worker_recycled(self, group: str, reason: str) -> None:
        self.note("worker_recycled", group, reason)

    def claims_lost(self, count: int) -> None:
        self.note("claims_lost", count)

    def group_scaled(self, group: str, processes: int, direction: str) -> None:
        self.note("group_scaled", group, processes, direction, time.monotonic())

    def scaled(self, group: str) -> list[tuple[int, str, float]]:
        """(processes, direction, monotonic time) of each change of the group's size."""
        return [c[2:] for c in self.calls if c[0] == "group_scaled" and c[1] == group]

    def finished(self, outcome: str | None = None) -> list[tuple]:
        return [c for c in self.calls
                if c[0] == "job_finished" and outcome in (None, c[2])]


class _Tap(logging.Handler):
    def __init__(self, reports: Reports):
        super().__init__(logging.INFO)
        self.reports = reports

    def emit(self, record: logging.LogRecord) -> None:
        self.reports.lines.append(record.getMessage())
        self.reports.told()


class OnDemand:
    """An on-demand request as its caller sees it: the events the actor sends it."""

    def __init__(self, actor: Actor, events: asyncio.Queue):
        self.actor = actor
        self.events = events
        self.seen: list[dict] = []
        self.request = None

    async def outcome(self, timeout: float = 20.0) -> dict:
        """The request's last event, `result` or `error`, once it comes."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self.events.get()
                self.seen.append(event)
                if event["event"] in ("result", "error"):
                    return event


class Actor:
    """One supervisor in this process, on its own config and state folder."""

    def __init__(self, database_url: str, workers: str, supervisor: str = "",
                 scoring: str = "", shutdown_timeout: float = 5,
                 modules: dict[str, str] | None = None):
        # Short paths: the control socket lives under state_dir (Unix sockets are ~107 bytes).
        self.dir = Path(tempfile.mkdtemp(prefix="fa-", dir="/tmp"))
        shutil.copy(HANDLERS, self.dir / "sup_handlers.py")
        for name, source in (modules or {}).items():  # handler modules beside the config
            (self.dir / f"{name}.py").write_text(textwrap.dedent(source))
        self.database_url = database_url
        self.config_path = self.dir / "workers.toml"
        self.shutdown_timeout = shutdown_timeout
        self.rewrite(workers, supervisor, scoring)
        self.reports = Reports()
        self.sup: Supervisor | None = None
        self._tap = _Tap(self.reports)
        self._signals: dict[int, object] = {}

    def rewrite(self, workers: str, supervisor: str = "", scoring: str = "") -> None:
        """Write its workers.toml (again: a reload reads it)."""
        self.config_path.write_text(
            f"[supervisor]\nstate_dir = \"state\"\nshutdown_timeout = {self.shutdown_timeout}\n"
            f"database = {self.database_url!r}\n" + textwrap.dedent(supervisor)
            + "\n[scoring]\n" + textwrap.dedent(scoring) + "\n" + textwrap.dedent(workers))

    # -- start and stop ------------------------------------------------------------------------

    async def start(self, ready: bool = True) -> Actor:
        for sig in (*STOP_SIGNALS, *RELOAD_SIGNALS, *IGNORED_SIGNALS, signal.SIGCHLD):
            self._signals[sig] = signal.getsignal(sig)
        logging.getLogger("fairsched").addHandler(self._tap)
        logging.getLogger("fairsched").setLevel(logging.INFO)
        config = load_config(self.config_path)
        config.make_state_dir()
        self.sup = Supervisor(config, self.reports)
        await self.sup.start()
        if ready:
            await self.until(lambda: all(p.state in READY for p in self.procs),
                             what="every worker ready")
        return self

    async def stop(self, timeout: float | None = None) -> None:
        try:
            if self.sup is not None:
                await self.sup.shutdown(timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Give back what the actor took of this process (its signals, being the subreaper,
        the log), and kill what is left of its workers."""
        if self.sup is not None:
            self.sup.release_signals()
            for proc in self.sup.workers.procs:
                if proc.life.pid is not None:
                    with contextlib.suppress(OSError):
                        os.killpg(proc.life.pid, signal.SIGKILL)
        for sig, handler in self._signals.items():
            signal.signal(sig, handler)
        _prctl(PR_SET_CHILD_SUBREAPER, 0)
        logging.getLogger("fairsched").removeHandler(self._tap)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- what the test does --------------------------------------------------------------------

    @property
    def procs(self):
        return self.sup.workers.procs

    def proc(self, name: str):
        return next(p for p in self.procs if p.name == name)

    def ps(self) -> dict:
        """What `fairsched ps --json` prints (but the process figures)."""
        return snapshot(self.sup)

    def on_demand(self, type_name: str, payload=None, priority: int = 0) -> OnDemand:
        """Submit an on-demand request as the control socket does."""
        events: asyncio.Queue = asyncio.Queue()
        waiting = OnDemand(self, events)
        text, _ = payload_json(payload)
        waiting.request = self.sup.jobs.submit_on_demand(type_name, text, priority,
                                                         events.put_nowait)
        return waiting

    async def enqueue(self, type_name: str, payload=None, **options) -> int:
        """Add a queued job through the Python API, on a connection of its own."""
        def enqueue() -> int:
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                return Queue(conn).enqueue(type_name, payload, **options)

        return await asyncio.to_thread(enqueue)

    async def job(self, job_id: int) -> dict:
        """The job's row, as `fairsched job ID --json` reads it."""
        def read() -> dict:
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                return Queue(conn).get_job(job_id)

        return await asyncio.to_thread(read)

    # -- waiting on what it reports ------------------------------------------------------------

    async def until(self, condition, timeout: float = 20.0, what="condition"):
        """Await `condition()` true (and return it), looked at again at each report of the
        actor; AssertionError naming `what` after `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (found := condition()):
            left = deadline - loop.time()
            if left <= 0:
                said = what() if callable(what) else what
                raise AssertionError(f"timed out waiting for {said}; the log ends:\n"
                                     + "\n".join(self.reports.lines[-30:]))
            self.reports.news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.reports.news.wait(), min(left, RECHECK))
        return found

    async def logged(self, pattern: str, timeout: float = 20.0) -> re.Match:
        """The first log line of the actor that matches `pattern`, once there is one."""
        def match():
            return next((m for line in self.reports.lines if (m := re.search(pattern, line))),
                        None)

        return await self.until(match, timeout, f"a log line matching {pattern!r}")


def run_actor(database_url: str, workers: str, scenario, **options) -> None:
    """Start an actor on `workers`, await `scenario(actor)`, stop it (the test's loop is its
    own: asyncio.run)."""
    async def main():
        actor = Actor(database_url, workers, **options)
        try:
            await actor.start()
            await scenario(actor)
        finally:
            await actor.stop()

    asyncio.run(main())
