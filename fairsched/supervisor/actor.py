"""The actor: one asyncio loop owns the slot pool, the workers and every job in flight.

Everything that changes state arrives as a callback on the loop (a worker frame, SIGCHLD, a
control request, a database result, a timer), so reasoning about state is sequential and there
are no locks. Database work is handed to the QueueLink and its answers come back as callbacks.
This module holds the state, start and shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import time

from fairsched import __version__, core
from fairsched.config import Config
from fairsched.permissions import make_private_folder
from fairsched.protocol import READ_SIZE
from fairsched.supervisor.hooks import Observer
from fairsched.supervisor.in_flight import RunningJob
from fairsched.supervisor.lease import LeaseGuard
from fairsched.supervisor.pipes import WorkerPipes
from fairsched.supervisor.process import WorkerProcess
from fairsched.supervisor.queue_link import QueueLink
from fairsched.supervisor.running import JobHandling
from fairsched.supervisor.scheduling import Scheduling
from fairsched.supervisor.states import IGNORED_SIGNALS, STOP_SIGNALS, ProcessState
from fairsched.supervisor.stopping import WorkerStopping
from fairsched.supervisor.template_process import Template
from fairsched.supervisor.templates import TemplateLifecycle
from fairsched.supervisor.waiting import WaitingJobs
from fairsched.supervisor.watchdog import Watchdog
from fairsched.supervisor.workers import STOP_GRACE, WorkerLifecycle
from fairsched.worker.launch import become_subreaper

log = logging.getLogger("fairsched.supervisor")


class Supervisor(Scheduling, WorkerLifecycle, WorkerStopping, TemplateLifecycle, WorkerPipes,
                 JobHandling):
    """The actor. Its state is all set up here; the scheduling cycle (scheduling.py), the
    worker processes (workers.py), the templates that fork them (templates.py), their pipes
    (pipes.py) and the jobs (running.py) are handled by the mixins it is made of."""

    def __init__(self, config: Config, observer: Observer | None = None,
                 early_signals: list[int] | None = None):
        self.config = config
        self.early_signals = early_signals if early_signals is not None else []
        self.observer = observer or Observer()
        self.weights = config.scoring
        self.priority_per_second = self.weights.priority / self.weights.age
        self.type_ids = {t: i for i, t in enumerate(sorted(config.types))}
        self.pool = core.SlotPool()
        self.procs = [WorkerProcess(spec, i) for spec in config.workers
                      for i in range(1, spec.processes + 1)]
        self.by_pid: dict[int, WorkerProcess] = {}
        self.slot_owner: dict[int, tuple[WorkerProcess, int]] = {}
        self.running: dict[int, RunningJob] = {}  # by pool slot id
        self.running_by_job: dict[int | str, RunningJob] = {}
        # On-demand requests and fetched queued candidates waiting for a slot, and the queued
        # jobs whose claim is on its way.
        self.waiting = WaitingJobs(self.type_ids)
        self.exhausted: set[str] = set()  # types whose last fetch came back short
        self.notified: set[str] = set()  # types with new jobs notified since the last fetch began
        self._fetched = False  # a fetch answered since the last cycle
        self._stale_types: set[str] = set()  # types notified while that fetch ran
        self.stop_asked = False  # a shutdown is under way, or about to be
        self.hurried = False  # stop was asked again while shutting down
        self.losses_in_row = 0
        self.queue = QueueLink(self, config)
        self.lease = LeaseGuard(self, config.supervisor.lease)
        self.watchdog: Watchdog | None = None
        self.templates: dict[str, Template] = {}
        self.template_pids: dict[int, str] = {}
        self.warming: dict[str, Template] = {}  # templates still importing their handler
        self.template_losses: dict[str, list[float]] = {}  # monotonic times, by group
        # Groups whose template could not import the handler: why, said when one of their
        # workers, importing it itself, is ready after all (else that worker says what failed).
        self.import_failed: dict[str, str] = {}
        self.template_timers: dict[str, asyncio.TimerHandle] = {}  # replacements due
        self.pending_spawns: dict[str, collections.deque] = {}
        self.early_exits: dict[int, int] = {}
        self.crashed_jobs: dict[int | str, None] = {}  # jobs that crashed a worker, oldest first
        self.shutting_down = False
        self.stopped = asyncio.Event()
        self.changed = asyncio.Event()
        self.next_slot_id = 1
        self.next_generation = 1
        self.next_request = 1
        self.started = time.time()
        self.counters = {"succeeded": 0, "failed": 0, "retried": 0, "cancelled": 0,
                         "returned": 0, "unrecorded": 0, "claim_losses": 0, "restarts": 0}
        self._scheduling = False
        self._schedule_pending = False
        self._unflushed: set[WorkerProcess] = set()
        self.read_buffer = memoryview(bytearray(READ_SIZE))  # every worker's reads, one at a time
        self._wake_handle: asyncio.TimerHandle | None = None
        self.starting = False
        self.up = False  # the database works and the workers were started
        self._stop_when_started: tuple[float | None] | None = None  # (timeout,) of an early stop
        self.loop: asyncio.AbstractEventLoop | None = None
        self.log_dir = config.supervisor.state_dir / "logs"

    # -- start and stop ------------------------------------------------------------------------

    async def start(self, templates: dict[str, Template] | None = None) -> None:
        """Start the workers (adopting `templates`, see start_templates) and the database."""
        self.loop = asyncio.get_running_loop()
        make_private_folder(self.log_dir)
        become_subreaper()
        self.loop.add_signal_handler(signal.SIGCHLD, self.reap_workers)
        for sig in STOP_SIGNALS:
            self.loop.add_signal_handler(sig, self.request_shutdown, None)
        for sig in IGNORED_SIGNALS:
            self.loop.add_signal_handler(sig, self._ignore_signal, sig)
        self.watchdog = Watchdog(self.loop, self.log_dir / "watchdog.log", self.busy_pids,
                                 self.worker_pids)
        self.watchdog.start()
        self.starting = True
        for sig in self.early_signals:  # those that came before the loop took them over
            if sig in STOP_SIGNALS:
                self.request_shutdown(None)
            else:
                self._ignore_signal(sig)
        self.early_signals.clear()
        try:
            # The handlers import in their templates meanwhile; workers start once the
            # database is known to work, so a supervisor that cannot use it starts none.
            try:
                await self.queue.start()
            except BaseException:
                for template in (templates or {}).values():  # for shutdown to stop
                    self.warming[template.group] = template
                raise
            self.up = True
            if self._stop_when_started is None:
                self.spawn_workers(templates)
            else:  # stopped while the database started: no worker to start and stop again
                for template in (templates or {}).values():
                    self.warming[template.group] = template
            self.observer.start(self)
        finally:
            self.starting = False
        if self._stop_when_started is not None:
            log.info("supervisor %s connected to its database (pid %d); stopping before any "
                     "worker started", self.queue.supervisor_id, os.getpid())
            self.request_shutdown(*self._stop_when_started)
            return
        log.info("supervisor %s started (pid %d, fairsched %s, core %s, database %s, %d worker%s)",
                 self.queue.supervisor_id, os.getpid(), __version__, core.__impl__, self.queue.kind,
                 len(self.procs), "" if len(self.procs) == 1 else "s")
        if self.queue.kind == "embedded":
            url = self.queue.database.url
            log.info("embedded PostgreSQL at %s (other supervisors on this host: "
                     "FAIRSCHED_DATABASE_URL='%s')", url, url)
        if core.__impl__ != "c" and os.environ.get("FAIRSCHED_NO_EXTENSIONS") != "1":
            log.warning("the compiled scheduling core did not load (%s); running the "
                        "pure-Python one, which plans large cycles far more slowly (rebuild: "
                        "`make build` or `pip install .`)", core.compiled_error())

    def _ignore_signal(self, sig: int) -> None:
        log.warning("ignoring %s: fairsched has no reload (`fairsched restart NAME` restarts "
                    "workers with their code as it is now; a changed workers.toml takes a "
                    "restart of the supervisor)", signal.Signals(sig).name)

    def release_signals(self) -> None:
        """Give the signals back before the loop closes.

        asyncio closes its self-pipe before it drops the wakeup fd, so a child exiting in
        between would make CPython print a raw "Exception ignored" line to stderr.
        """
        if self.loop is None:
            return
        for sig in (signal.SIGCHLD, *STOP_SIGNALS, *IGNORED_SIGNALS):
            self.loop.remove_signal_handler(sig)
        for sig in (*STOP_SIGNALS, *IGNORED_SIGNALS):
            signal.signal(sig, signal.SIG_IGN)  # shutdown has already begun or finished

    def busy_pids(self) -> list[int]:
        """The workers running queued jobs now, for the lease watchdog."""
        return [p.pid for p in self.procs if p.queued_jobs and p.pid is not None]

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def request_shutdown(self, timeout: float | None) -> None:
        if self.starting:
            # The database may be half set up (an embedded server starting): stop once it is,
            # so that it is stopped too, along with the workers already running.
            if self._stop_when_started is None:
                log.info("stopping as soon as the database is connected")
            self._stop_when_started = (timeout,)
        elif not self.stop_asked:  # (a second signal may come before the task runs)
            self.stop_asked = True
            self.loop.create_task(self.shutdown(timeout))
        elif not self.hurried:  # a second stop: the shutdown waits for nothing more
            log.warning("stop asked again: no more waiting for running jobs or the database")
            self.hurried = True
            self.queue.stop_waiting()
            self._changed()

    async def shutdown(self, timeout: float | None = None) -> None:
        if self.shutting_down:
            return
        self.shutting_down = self.stop_asked = True
        try:
            await self._shut_down(timeout)
        except Exception:  # never expected; the process must still end, and say why
            log.exception("the shutdown failed part way")
        finally:
            self.stopped.set()

    async def _shut_down(self, timeout: float | None) -> None:
        self.lease.stop()
        timeout = self.config.supervisor.shutdown_timeout if timeout is None else timeout
        if self.up:  # not when it could not start at all: the caller says why
            log.info("shutting down: cancelling %d running job%s, waiting up to %g s",
                     len(self.running), "" if len(self.running) == 1 else "s", timeout)
        for req in self.waiting.requests():
            self._finish_request(req, {"event": "error", "job_id": req.job_id,
                                       "error": "the supervisor is shutting down"})
        self.waiting.clear()
        for rj in list(self.running.values()):
            self.cancel_job(rj, "shutdown")
        for proc in self.procs:
            if proc.pid is None and proc.state is ProcessState.STARTING:
                proc.set_state(ProcessState.STOPPING)  # its template's answer: it is stopped then
        deadline = time.monotonic() + timeout
        self._stop_idle_workers()
        while self.running and time.monotonic() < deadline and not self.hurried:
            await self._wait_changed(deadline - time.monotonic())
            self._stop_idle_workers()
        for proc in self.procs:
            self._cancel_timers(proc)
            if proc.state in (ProcessState.DOWN, ProcessState.FATAL):
                proc.set_state(ProcessState.STOPPED)
            elif proc.pid is not None:
                jobs = [str(rj.job_id) for rj in self.running.values() if rj.proc is proc]
                if jobs:
                    when = ("when stop was asked again" if self.hurried else
                            f"at the end of shutdown_timeout ({timeout:g} s)")
                    log.warning("worker %s still runs job %s %s; killing it", proc.name,
                                ", ".join(jobs), when)
                    proc.kill_reason = ("still running when stop was asked again" if self.hurried
                                        else f"still running after shutdown_timeout, {timeout:g} s")
                self.stop_worker(proc, kill_now=bool(jobs))
        deadline = time.monotonic() + STOP_GRACE + 1.0
        while self.by_pid and time.monotonic() < deadline:
            await self._wait_changed(deadline - time.monotonic())
        if self.watchdog is not None:
            self.watchdog.close()  # it exits when its socket closes
            deadline = time.monotonic() + STOP_GRACE
            while self.watchdog.pid is not None and time.monotonic() < deadline:
                await self._wait_changed(deadline - time.monotonic())
            if self.watchdog.pid is not None:  # stopped, or stuck: every worker is gone now
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.watchdog.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.watchdog.pid, 0)
        self.reap_workers()
        for template in [*self.templates.values(), *self.warming.values()]:
            self._drop_template(template)
        for pid in self.template_pids:  # the templates and what their imports started
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        await self.queue.close()
        self.observer.stop()
        if self.up:
            log.info("supervisor stopped")

    def _stop_idle_workers(self) -> None:
        """Shutting down: a worker whose jobs have all reported is told to stop at once."""
        busy = {rj.proc for rj in self.running.values()}
        for proc in self.procs:
            if (proc.pid is not None and proc not in busy
                    and proc.state in (ProcessState.STARTING, ProcessState.RUNNING)):
                self.stop_worker(proc)

    async def _wait_changed(self, timeout: float) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.0, timeout))
        except TimeoutError:
            pass

    def _changed(self) -> None:
        self.changed.set()
