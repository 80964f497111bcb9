"""The actor: one asyncio loop owns the slot pool, the workers and every job in flight.

Everything that changes state arrives as a callback on the loop (a worker frame, SIGCHLD, a
control request, a database result, a timer), so reasoning about state is sequential and there
are no locks. Database work is handed to the QueueLink and its answers come back as callbacks.
This module holds the state, start and shutdown, and the scheduling cycle.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import time

from fairsched import core
from fairsched.config import Config
from fairsched.protocol import READ_SIZE
from fairsched.supervisor.hooks import Observer
from fairsched.supervisor.jobs import Request, RunningJob
from fairsched.supervisor.lease import LeaseGuard
from fairsched.supervisor.pipes import WorkerPipes
from fairsched.supervisor.process import WorkerProcess
from fairsched.supervisor.queue_link import QueueLink
from fairsched.supervisor.running import JobHandling
from fairsched.supervisor.states import IGNORED_SIGNALS, STOP_SIGNALS, ProcessState
from fairsched.supervisor.templates import TemplateLifecycle
from fairsched.supervisor.watchdog import Watchdog
from fairsched.supervisor.workers import STOP_GRACE, WorkerLifecycle
from fairsched.worker.launch import Template, become_subreaper

log = logging.getLogger("fairsched.supervisor")

LOSSES_BEFORE_REFETCH = 5


class Supervisor(WorkerLifecycle, TemplateLifecycle, WorkerPipes, JobHandling):
    """The actor. Its state is all set up here; the worker processes (workers.py), the
    templates that fork them (templates.py), their pipes (pipes.py) and the jobs (running.py)
    are handled by the mixins it is made of."""

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
        self.requests: dict[int, Request] = {}  # waiting on-demand requests by number
        self.cache: dict[int, object] = {}  # fetched queued candidates, not yet claimed
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
        self.template_timers: dict[str, asyncio.TimerHandle] = {}  # replacements due
        self.pending_spawns: dict[str, collections.deque] = {}
        self.early_exits: dict[int, int] = {}
        self.shutting_down = False
        self.stopped = asyncio.Event()
        self.changed = asyncio.Event()
        self.next_slot_id = 1
        self.next_generation = 1
        self.next_request = 1
        self.started = time.time()
        self.counters = {"succeeded": 0, "failed": 0, "retried": 0, "cancelled": 0,
                         "returned": 0, "claim_losses": 0, "restarts": 0}
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
        self.log_dir.mkdir(parents=True, exist_ok=True)
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
        log.info("supervisor %s started (pid %d, core %s, database %s, %d worker%s)",
                 self.queue.supervisor_id, os.getpid(), core.__impl__, self.queue.kind,
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
            log.info("shutting down: cancelling %d running jobs, waiting up to %g s",
                     len(self.running), timeout)
        for req in list(self.requests.values()):
            self._finish_request(req, {"event": "error", "job_id": req.job_id,
                                       "error": "the supervisor is shutting down"})
        self.requests.clear()
        self.cache.clear()
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

    # -- scheduling -----------------------------------------------------------------------------

    def schedule(self) -> None:
        """Ask for a scheduling cycle; every request made in one loop pass folds into one cycle."""
        if not self._schedule_pending:
            self._schedule_pending = True
            self.loop.call_soon(self._run_schedule)

    def _run_schedule(self) -> None:
        self._schedule_pending = False
        self._scheduling = True
        try:
            self._cycle()
            self._flush_all()
        finally:
            self._scheduling = False

    def _cycle(self) -> None:
        fetched, self._fetched = self._fetched, False
        stale, self._stale_types = self._stale_types, set()
        if self.shutting_down or self.pool.n_free == 0:
            for t in stale:
                self._forget_cached(t)
            return
        if not fetched and self.queue.connected and self._unknown_types():
            # A type with a free slot may have pending jobs this supervisor has not seen
            # (property 2): any of them may outscore what is known, an on-demand request
            # included. Plan once a fetch has told (one fetch: a type notified again during
            # it waits no longer); without the database, plan with what is known.
            self.queue.request_fetch()
            return
        entries: list = []
        types, priorities, eligible, on_demand, ids = [], [], [], [], []
        for req in self.requests.values():
            entries.append(req)
            types.append(req.type_id)
            priorities.append(req.priority)
            eligible.append(req.eligible_at)
            on_demand.append(1)
            ids.append(req.core_id)
        type_ids = self.type_ids
        offset = self.queue.clock_offset  # queued jobs' times are the server's; requests' ours
        for qj in () if self.lease.fenced else self.cache.values():
            tid = type_ids.get(qj.type)
            if tid is not None:
                entries.append(qj)
                types.append(tid)
                priorities.append(qj.priority)
                eligible.append(qj.eligible_at - offset)
                on_demand.append(0)
                ids.append(qj.id)
        for t in stale:
            self._forget_cached(t)  # planned in this cycle only: entries has them
        if entries:
            cands = core.Candidates.from_lists(types, priorities, eligible, on_demand, ids)
            idx, slots = core.plan_cycle(self.pool, cands, time.time(), self.weights,
                                         matching=self.config.matching)
            claims = []
            for i, slot_id in zip(idx, slots, strict=True):
                entry = entries[i]
                if isinstance(entry, Request):
                    del self.requests[entry.number]
                    entry.attempts += 1
                    self.start_job(entry, slot_id, attempt=entry.attempts)
                else:
                    self.cache.pop(entry.id, None)
                    claims.append((entry, slot_id))
            if claims:
                self.queue.claim(claims)
        if self._unknown_types():
            self.queue.request_fetch()

    def _unknown_types(self) -> bool:
        """Whether a type with a free slot has pending jobs that may be better than any
        known: none of it is cached, and its last fetch did not find it drained. (The cached
        jobs of a type are its best: queued jobs age alike, so their order never changes
        until new ones arrive, and then the type's cache is dropped.)"""
        cached = {qj.type for qj in self.cache.values()}
        return any(t not in cached for t in self.free_by_type())

    def _forget_cached(self, type_name: str | None = None) -> None:
        """Drop the cached candidates of `type_name` (of every type with None): newer jobs
        may outrank them, and the next fetch finds out."""
        if type_name is None:
            self.cache.clear()
        else:
            self.cache = {i: qj for i, qj in self.cache.items() if qj.type != type_name}

    def free_by_type(self) -> dict[str, int]:
        if self.shutting_down or self.lease.fenced:
            return {}
        free = {}
        for t, tid in self.type_ids.items():
            if t not in self.exhausted:
                n = self.pool.free_count(tid)
                if n:
                    free[t] = n
        return free

    def running_queued_ids(self) -> list[int]:
        ids = [rj.job_id for rj in self.running.values() if rj.request is None]
        ids.extend(qj.id for qj, _ in self.queue.claims)
        return ids

    def on_fetched(self, rows: list, wanted: dict[str, int]) -> None:
        # Rows the actor reserved while this fetch was in flight are still pending in the
        # table: without this they would be claimed twice, and lost the second time.
        busy = {rj.job_id for rj in self.running.values()}
        busy.update(qj.id for qj, _ in self.queue.claims)
        # The types it did not ask for (no free slot then) keep what was known of them.
        self.cache = {i: qj for i, qj in self.cache.items() if qj.type not in wanted}
        self.cache.update((qj.id, qj) for qj in rows if qj.id not in busy)
        # A type notified while the fetch ran may have a better job than it found: the next
        # cycle takes what it found all the same (or a stream of new jobs would starve the
        # type of cycles), and forgets the rest.
        self._stale_types = self.notified & wanted.keys()
        counts: dict[str, int] = {}
        for qj in rows:
            counts[qj.type] = counts.get(qj.type, 0) + 1
        for t, free in wanted.items():
            # Jobs notified while it ran may have come too late for it: not drained yet.
            if counts.get(t, 0) < 2 * free and t not in self.notified:
                self.exhausted.add(t)
            else:
                self.exhausted.discard(t)
        self._fetched = True
        self.schedule()

    def on_claimed(self, claims: list, won: dict, contested: bool = True) -> None:
        """The answer to a claim: `won` by job id. Not `contested`: the claim never reached
        the database (it was lost with the connection), which is no loss to another
        supervisor."""
        lost = 0
        for qj, slot_id in claims:  # in the order planned: a win ends a row of losses
            job = won.get(qj.id)
            owner = self.slot_owner.get(slot_id)
            if job is None:
                if contested:
                    lost += 1
                    self.losses_in_row += 1
                self.pool.release(slot_id)
                continue
            self.losses_in_row = 0
            proc = owner[0] if owner else None
            if (proc is None or proc.state is not ProcessState.RUNNING or self.shutting_down
                    or self.lease.fenced or not self.pool.is_busy(slot_id)):
                # The slot's worker died or is stopping while the claim was in flight, or
                # this supervisor is giving its jobs back.
                self.queue.release(job.id, job.claim)
                self.pool.release(slot_id)
                continue
            self.start_job(job, slot_id, attempt=job.attempts)
        if lost:
            self.counters["claim_losses"] += lost
            self.observer.claims_lost(lost)
            if self.losses_in_row >= LOSSES_BEFORE_REFETCH:
                self.cache.clear()
                self.losses_in_row = 0
            self.exhausted.clear()
        self._flush_all()
        self.schedule()

    def on_jobs_notified(self, type_name: str) -> None:
        type_id = self.type_ids.get(type_name)
        if type_id is None:  # a type only other supervisors on this database run
            return
        self.notified.add(type_name)
        self.exhausted.discard(type_name)
        self._forget_cached(type_name)
        self.queue.due_unknown = True  # it may be a delayed job, or a retry
        if self.pool.free_count(type_id):
            self.queue.request_fetch()

    def on_poll(self) -> None:
        # A delayed job that came due, a notification lost: what is known may be stale.
        self.exhausted.clear()
        self._forget_cached()
        self.queue.due_unknown = True

    def wake_in(self, delay: float) -> None:
        delay = max(0.0, delay)
        if self._wake_handle is not None:
            if self._wake_handle.when() <= self.loop.time() + delay:
                return
            self._wake_handle.cancel()
        self._wake_handle = self.loop.call_later(delay + 0.001, self._on_wake)

    def _on_wake(self) -> None:
        self._wake_handle = None  # a delayed job comes due: it may outrank what is cached
        self.exhausted.clear()
        self._forget_cached()
        self.queue.due_unknown = True  # and the next one's time is to be learnt
        self.queue.request_fetch()

    def on_cancel_requested(self, job_id) -> None:
        try:
            rj = self.running_by_job.get(int(job_id))
        except (TypeError, ValueError):
            return
        if rj is not None and rj.cancel_reason != "user":  # asked once is enough
            self.cancel_job(rj, "user")

