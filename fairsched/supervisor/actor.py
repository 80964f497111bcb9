"""The actor: one asyncio loop, on which every change of state happens, and the components
that own that state, each changed only by its own methods:

- Workers (workers.py): the worker processes, their templates (templates.py), their pipes
  (pipes.py) and the lease watchdog;
- Jobs (running.py): the jobs running on slots and the on-demand requests' callers;
- Planner (scheduling.py): the slot pool, the jobs waiting for a slot, the cycles;
- QueueLink (queue_link.py): the database lanes, which post what they learn as messages
  (messages.py) to `handle`, the one dispatch of them;
- LeaseGuard (lease.py): the lease's timers and the fence;
- Autoscaler (autoscale.py): when the groups with a range of processes grow and shrink.

Everything arrives as a callback on the loop (a worker frame, SIGCHLD, a control request, a
database answer, a timer), so state changes one step at a time, with no locks. This module
wires the components, dispatches the queue link's messages, and starts and stops it all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass

from fairsched import __version__, core
from fairsched.config import Config, load_config
from fairsched.errors import ConfigError, FairschedError
from fairsched.logs import fields
from fairsched.permissions import make_private_folder
from fairsched.supervisor.autoscale import Autoscaler
from fairsched.supervisor.hooks import Observer
from fairsched.supervisor.lease import WATCHDOG_AT, LeaseGuard
from fairsched.supervisor.messages import (
    Backlog,
    CancelRequested,
    Claimed,
    Connected,
    Disconnected,
    FetchBegan,
    Fetched,
    Held,
    JobsNotified,
    LeaseExpired,
    LeaseRenewed,
    NextDue,
    OutcomeUnrecorded,
    Stale,
)
from fairsched.supervisor.queue_link import QueueLink
from fairsched.supervisor.reload import ConfigChange, config_change
from fairsched.supervisor.running import Jobs
from fairsched.supervisor.scheduling import Planner
from fairsched.supervisor.states import IGNORED_SIGNALS, RELOAD_SIGNALS, STOP_SIGNALS
from fairsched.supervisor.template_process import Template
from fairsched.supervisor.workers import STOP_GRACE, Workers
from fairsched.worker import orphan
from fairsched.worker.launch import become_subreaper

log = logging.getLogger("fairsched.supervisor")


class ReloadRefused(FairschedError):
    """A reload asked of a supervisor that is starting or shutting down."""


@dataclass
class RunState:
    """What only the actor changes and every component reads."""
    shutting_down: bool = False


class Supervisor:
    """The actor: builds and wires the components, handles the queue link's messages, the
    signals, start and shutdown. Made on the running loop."""

    def __init__(self, config: Config, observer: Observer | None = None,
                 early_signals: list[int] | None = None):
        self.config = config
        self.early_signals = early_signals if early_signals is not None else []
        self.observer = observer or Observer()
        self.loop = asyncio.get_running_loop()
        self.run = RunState()
        self.stopped = asyncio.Event()
        self.changed = asyncio.Event()
        self.workers = Workers(config, self.loop, self.run, self.observer, self._changed)
        self.jobs = Jobs(config, self.loop, self.run, self.observer, self._changed)
        self.planner = Planner(config, self.loop, self.run, self.observer)
        self.queue = QueueLink(config, self.handle, self.observer,
                               wanted=self.planner.free_by_type,
                               running_queued=self.jobs.running_queued)
        self.lease = LeaseGuard(self.loop, self.run, config.supervisor.lease,
                                running_out=self._lease_running_out,
                                kill_due=self._lease_kill_due)
        self.autoscaler = Autoscaler(config, self.loop, self.run, self.observer)
        self.workers.connect(self.planner, self.jobs, self.lease)
        self.autoscaler.connect(self.workers, self.planner, self.queue)
        self.jobs.connect(self.planner, self.queue, self.lease, self.workers)
        self.planner.connect(self.queue, self.lease, self.jobs, self.workers)
        self.stop_asked = False  # a shutdown is under way, or about to be
        self.hurried = False  # stop was asked again while shutting down
        self.started = time.time()
        self.starting = False
        self.up = False  # the database works and the workers were started
        self._stop_when_started: tuple[float | None] | None = None  # (timeout,) of an early stop
        self._reload_when_started = False  # SIGHUP came while starting
        self.log_dir = config.supervisor.state_dir / "logs"
        self.web = None  # the web dashboard ([supervisor] web), once started

    @property
    def shutting_down(self) -> bool:
        return self.run.shutting_down

    def counters(self) -> dict[str, int]:
        """What `ps` counts: jobs by outcome, claims lost, worker restarts."""
        return {**self.jobs.counters, "claim_losses": self.planner.claim_losses,
                "restarts": self.workers.restarts}

    # -- the queue link's messages -------------------------------------------------------------

    def handle(self, msg) -> None:
        """Act on one message of the queue link."""
        match msg:
            case Fetched(rows, wanted):
                self.planner.fetched(rows, wanted)
            case Claimed(claims, won, contested, refused):
                self.planner.claimed(claims, won, contested, refused)
            case Held(req, slot_id, hold):
                self.planner.held(req, slot_id, hold)
            case FetchBegan():
                self.planner.fetch_began()
            case JobsNotified(type_name):
                self.planner.jobs_notified(type_name)
            case CancelRequested(job_id):
                self.jobs.cancel_requested(job_id)
            case Stale():
                self.planner.forget_queued()
            case NextDue(delay):
                self.planner.wake_in(delay)
            case Connected() | Disconnected():
                self.planner.schedule()
            case LeaseRenewed(sent_at):
                self._lease_renewed(sent_at)
            case LeaseExpired(lost, idle):
                if idle:
                    self.lease.said_expired_idle()
                self.lease.expired(lost)
            case OutcomeUnrecorded(job_type, outcome):
                self.jobs.outcome_unrecorded(job_type, outcome)
            case Backlog(counts):
                self.autoscaler.counted(counts)
            case _:
                raise TypeError(f"no handler for {msg!r}")

    def _lease_renewed(self, sent_at: float) -> None:
        self.workers.lease_renewed(sent_at + self.lease.lease * WATCHDOG_AT)
        running = [job_id for job_id, _ in self.jobs.running_queued()]
        if self.lease.renewed(sent_at, running):
            self.planner.schedule()

    def _lease_running_out(self, expired: bool, lost: frozenset | None, late: float) -> None:
        """The lease could not be renewed in time (or had run out): give the queued jobs
        running here back before other supervisors take them over, and claim no more."""
        self.workers.read_pending()  # late after a stall: jobs may have finished meanwhile
        self.lease.fence()
        self.planner.forget_fetched()
        self.workers.refresh_watchdog()  # who is busy now, before its turn comes
        jobs = self.jobs.queued(lost)
        self.lease.said_running_out(late, len(jobs), expired)
        for rj in jobs:
            self.jobs.cancel_job(rj, "lease")

    def _lease_kill_due(self) -> None:
        """Kill the workers still running a job given back; their on-demand jobs run again.
        Restarted at once, not counted as a crash."""
        self.workers.read_pending()
        for proc in self.jobs.given_back_on():
            log.error("worker %s is still running a job of the expiring lease; killing it",
                      proc.name)
            self.jobs.rerun_on_demand(proc)
            self.workers.kill_for_lease(proc)

    # -- start and stop ------------------------------------------------------------------------

    async def start(self, templates: dict[str, Template] | None = None) -> None:
        """Start the workers (adopting `templates`, see start_templates) and the database."""
        make_private_folder(self.log_dir)
        become_subreaper()
        self.loop.add_signal_handler(signal.SIGCHLD, self.workers.reap_workers)
        for sig in STOP_SIGNALS:
            self.loop.add_signal_handler(sig, self.request_shutdown, None)
        for sig in RELOAD_SIGNALS:
            self.loop.add_signal_handler(sig, self._reload_on_signal, sig)
        for sig in IGNORED_SIGNALS:
            self.loop.add_signal_handler(sig, self._ignore_signal, sig)
        self.workers.start_watchdog()
        self.starting = True
        for sig in self.early_signals:  # those that came before the loop took them over
            if sig in STOP_SIGNALS:
                self.request_shutdown(None)
            elif sig in RELOAD_SIGNALS:
                self._reload_on_signal(sig)  # acted on once started
            else:
                self._ignore_signal(sig)
        self.early_signals.clear()
        try:
            # The handlers import in their templates meanwhile; workers start once the
            # database is known to work, so a supervisor that cannot use it starts none.
            try:
                await self._start_web()
                await self.queue.start()
            except BaseException:
                self.workers.keep_templates(templates or {})  # for shutdown to stop
                raise
            self.up = True
            if self._stop_when_started is None:
                self.workers.use_database(self.queue.database_url)
                self.workers.start(templates)
                self.autoscaler.start()
            else:  # stopped while the database started: no worker to start and stop again
                self.workers.keep_templates(templates or {})
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
                 len(self.workers.procs), "" if len(self.workers.procs) == 1 else "s")
        if self.queue.kind == "embedded":
            url = self.queue.database.url
            log.info("embedded PostgreSQL at %s (other supervisors on this host: "
                     "FAIRSCHED_DATABASE_URL='%s')", url, url)
        if core.__impl__ != "c" and os.environ.get("FAIRSCHED_NO_EXTENSIONS") != "1":
            log.warning("the compiled scheduling core did not load (%s); running the "
                        "pure-Python one, which plans large cycles far more slowly (rebuild: "
                        "`make build` or `pip install .`)", core.compiled_error())
        if orphan.__impl__ != "c" and os.environ.get("FAIRSCHED_NO_EXTENSIONS") != "1":
            log.warning("the compiled fork helper (fairsched.worker._orphan_c) did not load; "
                        "templates fork their workers through a pure-Python intermediate, "
                        "which costs each start about a millisecond more (rebuild: `make build` "
                        "or `pip install .`)")
        if self._reload_when_started:
            self._reload_on_signal(signal.SIGHUP)

    async def _start_web(self) -> None:
        """The web dashboard, when [supervisor] web is set: listening before the database and
        the workers start (WebError, one line, when it cannot)."""
        settings = self.config.supervisor
        if settings.web is None:
            return
        from fairsched.web.app import Dashboard, load_token  # aiohttp only when asked for

        web = Dashboard(self, settings.web, load_token(settings))
        await web.start()
        self.web = web

    def _ignore_signal(self, sig: int) -> None:
        log.warning("ignoring %s (SIGHUP reloads workers.toml; SIGTERM stops)",
                    signal.Signals(sig).name)

    # -- a reload ------------------------------------------------------------------------------

    def reload(self) -> ConfigChange:
        """Read workers.toml again (the file this supervisor was started with) and apply what
        changed: groups added start, removed ones stop once their jobs end, changed ones have
        their processes replaced one at a time, [scoring] counts from the next cycle. The whole
        file is checked first: ConfigError (one line naming the file and key) for a bad one, or
        one that changes a setting only a restart takes, and nothing changes. ReloadRefused
        while starting or shutting down."""
        if self.stop_asked or not self.up or self.run.shutting_down:
            raise ReloadRefused("the supervisor is " + (
                "shutting down" if self.stop_asked or self.run.shutting_down else "starting")
                + ": nothing was reloaded")
        new = load_config(self.config.path)
        change = config_change(self.config, new)
        if not change.nothing:
            self.config = new
            self.planner.reconfigure(new)  # first: ids for the new types
            self.queue.reconfigure(new)
            self.workers.reconfigure(new, change)
            self.autoscaler.reconfigure(new)
            self.jobs.reconfigure(new)
            if change.scoring:
                self.planner.forget_queued()  # fetched in the old order: fetch afresh
        for line in change.lines():
            log.info("reloaded %s: %s", self.config.path.name, line,
                     extra=fields(event="reloaded", change=line))
        return change

    def _reload_on_signal(self, sig: int) -> None:
        if self.starting or (not self.up and not self.stop_asked):
            # Its workers are not all started yet: read the file once they are.
            self._reload_when_started = True
            return
        self._reload_when_started = False
        log.info("%s: reloading %s", signal.Signals(sig).name, self.config.path)
        try:
            self.reload()
        except (ConfigError, ReloadRefused) as exc:
            log.error("reload refused, nothing changed: %s", exc)

    def release_signals(self) -> None:
        """Give the signals back before the loop closes.

        asyncio closes its self-pipe before it drops the wakeup fd, so a child exiting in
        between would make CPython print a raw "Exception ignored" line to stderr.
        """
        if self.loop is None:
            return
        for sig in (signal.SIGCHLD, *STOP_SIGNALS, *RELOAD_SIGNALS, *IGNORED_SIGNALS):
            self.loop.remove_signal_handler(sig)
        for sig in (*STOP_SIGNALS, *RELOAD_SIGNALS, *IGNORED_SIGNALS):
            signal.signal(sig, signal.SIG_IGN)  # shutdown has already begun or finished

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
        if self.run.shutting_down:
            return
        self.run.shutting_down = self.stop_asked = True
        self.queue.wind_down()
        try:
            await self._shut_down(timeout)
        except Exception:  # never expected; the process must still end, and say why
            log.exception("the shutdown failed part way")
        finally:
            self.stopped.set()

    async def _shut_down(self, timeout: float | None) -> None:
        self.lease.stop()
        self.autoscaler.stop()
        timeout = self.config.supervisor.shutdown_timeout if timeout is None else timeout
        running = len(self.jobs.running)
        if self.up:  # not when it could not start at all: the caller says why
            log.info("shutting down: cancelling %d running job%s, waiting up to %g s",
                     running, "" if running == 1 else "s", timeout)
        self.jobs.drop_requests("the supervisor is shutting down")
        self.jobs.cancel_all("shutdown")
        self.workers.shutting_down()
        deadline = time.monotonic() + timeout
        self.workers.stop_idle()
        while self.jobs.running and time.monotonic() < deadline and not self.hurried:
            await self._wait_changed(deadline - time.monotonic())
            self.workers.stop_idle()
        self.workers.stop_all(timeout, self.hurried)
        deadline = time.monotonic() + STOP_GRACE + 1.0
        while self.workers.live() and time.monotonic() < deadline:
            await self._wait_changed(deadline - time.monotonic())
        await self.workers.stop_watchdog(self._wait_changed)
        self.workers.reap_workers()
        self.workers.close_templates()
        if self.web is not None:
            await self.web.close()
        await self.queue.close()
        self.observer.stop()
        if self.up:
            log.info("supervisor stopped")

    async def _wait_changed(self, timeout: float) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.0, timeout))
        except TimeoutError:
            pass

    def _changed(self) -> None:
        self.changed.set()
