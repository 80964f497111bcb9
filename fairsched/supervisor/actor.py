"""The actor: one asyncio loop owns the slot pool, the workers and every job in flight.

Everything that changes state arrives as a callback on the loop (a worker frame, SIGCHLD, a
control request, a database result, a timer), so reasoning about state is sequential and there
are no locks. Database work is handed to the QueueLink and its answers come back as callbacks.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import secrets
import signal
import time

from fairsched import core
from fairsched.config import Config
from fairsched.protocol import WORKER_MESSAGES, FrameDecoder, ProtocolError, encode, validate
from fairsched.store.aqueue import retry_delay
from fairsched.supervisor.hooks import Observer
from fairsched.supervisor.jobs import Request, RunningJob
from fairsched.supervisor.lease import LeaseGuard
from fairsched.supervisor.process import (
    EXIT_CANNOT_START,
    WorkerProcess,
    describe_exit,
    restart_delay,
)
from fairsched.supervisor.queue_link import Failure, QueueLink
from fairsched.supervisor.states import ProcessState
from fairsched.worker.launch import LaunchSpec, Template, become_subreaper, launch

log = logging.getLogger("fairsched.supervisor")


def fields(**values) -> dict:
    """Structured fields for a log line: the JSON log format shows them as keys."""
    return {"fields": values}

STOP_GRACE = 2.0  # SIGTERM to SIGKILL for a worker that is stopped or timed out
LOSSES_BEFORE_REFETCH = 5


def job_fields(rj: RunningJob, outcome: str, duration: float, **more) -> dict:
    return fields(event="job_finished", job_id=rj.job_id, type=rj.type, worker=rj.proc.name,
                  slot=rj.slot_index, attempt=rj.attempt, outcome=outcome,
                  duration=round(duration, 6), on_demand=rj.on_demand, **more)


class Supervisor:
    def __init__(self, config: Config, observer: Observer | None = None):
        self.config = config
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
        self.losses_in_row = 0
        self.queue = QueueLink(self, config)
        self.lease = LeaseGuard(self, config.supervisor.lease)
        self.templates: dict[str, Template] = {}
        self.template_pids: dict[int, str] = {}
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
        self._wake_handle: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.log_dir = config.supervisor.state_dir / "logs"

    # -- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        await self.queue.start()
        self.observer.start(self)
        become_subreaper()
        self.loop.add_signal_handler(signal.SIGCHLD, self.reap_workers)
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self.request_shutdown, None)
        self._start_templates()
        for proc in self.procs:
            self.spawn_worker(proc)
        log.info("supervisor %s started (pid %d, core %s, database %s, %d workers)",
                 self.queue.supervisor_id, os.getpid(), core.__impl__, self.queue.kind,
                 len(self.procs))

    def release_signals(self) -> None:
        """Give the signals back before the loop closes.

        asyncio closes its self-pipe before it drops the wakeup fd, so a child exiting in
        between would make CPython print a raw "Exception ignored" line to stderr.
        """
        if self.loop is None:
            return
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            self.loop.remove_signal_handler(sig)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # shutdown has already begun or finished

    def request_shutdown(self, timeout: float | None) -> None:
        if not self.shutting_down:
            self.loop.create_task(self.shutdown(timeout))

    async def shutdown(self, timeout: float | None = None) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        self.lease.stop()
        timeout = self.config.supervisor.shutdown_timeout if timeout is None else timeout
        log.info("shutting down: cancelling %d running jobs, waiting up to %g s",
                 len(self.running), timeout)
        for req in list(self.requests.values()):
            self._finish_request(req, {"event": "error", "job_id": req.job_id,
                                       "error": "the supervisor is shutting down"})
        self.requests.clear()
        self.cache.clear()
        for rj in list(self.running.values()):
            self.cancel_job(rj, "shutdown")
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            await self._wait_changed(deadline - time.monotonic())
        for proc in self.procs:
            self._cancel_timers(proc)
            if proc.state in (ProcessState.DOWN, ProcessState.FATAL):
                proc.set_state(ProcessState.STOPPED)
            elif proc.pid is not None:
                busy = any(rj.proc is proc for rj in self.running.values())
                self.stop_worker(proc, kill_now=busy)
        deadline = time.monotonic() + STOP_GRACE + 1.0
        while self.by_pid and time.monotonic() < deadline:
            await self._wait_changed(deadline - time.monotonic())
        self.reap_workers()
        for template in list(self.templates.values()):
            self._drop_template(template)
        await self.queue.close()
        self.observer.stop()
        log.info("supervisor stopped")
        self.stopped.set()

    async def _wait_changed(self, timeout: float) -> None:
        self.changed.clear()
        try:
            await asyncio.wait_for(self.changed.wait(), max(0.0, timeout))
        except TimeoutError:
            pass

    def _changed(self) -> None:
        self.changed.set()

    # -- workers ------------------------------------------------------------------------------

    def _launch_spec(self, proc: WorkerProcess) -> LaunchSpec:
        spec = proc.spec
        return LaunchSpec(name=proc.name, group=spec.name, types=spec.types, slots=spec.slots,
                          handler=spec.handler, command=spec.command, cwd=spec.cwd,
                          log_path=self.log_dir / f"{proc.name}.log", env=dict(spec.env))

    def _start_templates(self) -> None:
        """One pre-loaded template per Python handler group: replacements skip the imports."""
        started = []
        for spec in self.config.workers:
            if spec.handler is None:
                continue
            proc = next(p for p in self.procs if p.spec is spec)
            try:
                started.append(Template.start(self._launch_spec(proc)))
            except OSError as exc:
                log.debug("no template for %s: %s", spec.name, exc)
        for template in started:  # they import in parallel; wait for each once
            self.template_pids[template.pid] = template.group
            try:
                template.wait_ready()
            except OSError as exc:  # the cold path reports the real problem through the worker
                log.debug("no template for %s: %s", template.group, exc)
                template.close()
                continue
            self.templates[template.group] = template
            self.pending_spawns[template.group] = collections.deque()
            self.loop.add_reader(template.fileno(), self._on_template_reply, template)

    def _on_template_reply(self, template: Template) -> None:
        pending = self.pending_spawns.get(template.group)
        while True:
            reply = template.read_reply()
            if reply == {}:
                return
            if reply is None:
                self._drop_template(template)
                return
            if not pending:
                continue
            proc, incarnation = pending.popleft()
            if proc.incarnation != incarnation:
                continue
            pid = reply.get("pid")
            if not isinstance(pid, int) or pid <= 0:
                log.warning("template for %s could not start %s: %s; starting it cold",
                            template.group, proc.name, reply.get("error"))
                self._relaunch_cold(proc)
                continue
            self._learn_pid(proc, pid)

    def _learn_pid(self, proc: WorkerProcess, pid: int) -> None:
        if proc.pid is None:
            proc.pid = pid
            self.by_pid[pid] = proc
            log.info("worker %s spawned (pid %d)", proc.name, pid,
                     extra=fields(event="worker_spawned", worker=proc.name, group=proc.group, pid=pid))
        status = self.early_exits.pop(pid, None)
        if status is not None:  # reaped before we knew whose it was
            self.by_pid.pop(pid, None)
            self.worker_exited(proc, status)
        elif proc.state is ProcessState.STOPPING:
            self.kill_worker(proc, signal.SIGTERM, grace=STOP_GRACE)

    def _drop_template(self, template: Template) -> None:
        if not template.closed:
            self.loop.remove_reader(template.fileno())
            template.close()
        if self.templates.get(template.group) is template:
            del self.templates[template.group]
            if not self.shutting_down:
                log.warning("template for %s exited; replacements start cold", template.group)
        pending = self.pending_spawns.pop(template.group, collections.deque())
        for proc, incarnation in pending:
            if proc.incarnation == incarnation and proc.pid is None:
                self._relaunch_cold(proc)

    def _relaunch_cold(self, proc: WorkerProcess) -> None:
        if proc.sock is not None:
            self.loop.remove_reader(proc.sock.fileno())
            proc.sock.close()
            proc.sock = None
        proc.set_state(ProcessState.DOWN)
        self.spawn_worker(proc, cold=True)

    def spawn_worker(self, proc: WorkerProcess, *, cold: bool = False) -> None:
        if self.shutting_down:
            return
        proc.restart_timer = None
        proc.generation = self.next_generation
        self.next_generation += 1
        proc.incarnation = f"{proc.name}.{proc.generation}.{secrets.token_hex(4)}"
        spec = self._launch_spec(proc)
        template = None if cold else self.templates.get(proc.group)
        pid = None
        try:
            sock = None
            if template is not None:
                try:
                    sock = template.begin_spawn(spec, proc.incarnation)
                    self.pending_spawns[proc.group].append((proc, proc.incarnation))
                except OSError as exc:
                    log.warning("template for %s failed (%s); starting %s cold", proc.group, exc,
                                proc.name)
                    self._drop_template(template)
                    sock = None
            if sock is None:
                launched = launch(spec, proc.incarnation)
                sock, pid = launched.sock, launched.pid
        except OSError as exc:
            self._make_fatal(proc, f"could not start: {exc}")
            return
        proc.pid = None
        proc.sock = sock
        proc.sock.setblocking(False)
        proc.decoder = FrameDecoder(accept=WORKER_MESSAGES)
        proc.outbox = bytearray()
        proc.writing = False
        proc.started_at = time.time()
        proc.started_mono = time.monotonic()
        proc.set_state(ProcessState.STARTING)
        self.loop.add_reader(proc.sock.fileno(), self._on_readable, proc)
        if pid is not None:
            self._learn_pid(proc, pid)

    def _make_fatal(self, proc: WorkerProcess, reason: str) -> None:
        proc.fatal_reason = reason
        proc.set_state(ProcessState.FATAL)
        log.error("worker %s is fatal: %s; run `fairsched restart %s` once fixed",
                  proc.name, reason, proc.name,
                  extra=fields(event="worker_fatal", worker=proc.name, group=proc.group,
                               reason=reason))

    def reap_workers(self) -> None:
        """Collect every exited child; several SIGCHLDs fold into one call."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            proc = self.by_pid.pop(pid, None)
            if proc is not None:
                self.worker_exited(proc, status)
            elif pid in self.template_pids:
                group = self.template_pids.pop(pid)
                template = self.templates.get(group)
                if template is not None and template.pid == pid:
                    self._drop_template(template)
            else:
                # A template-forked worker can exit before its pid reaches us.
                self.early_exits[pid] = status
                while len(self.early_exits) > 256:
                    self.early_exits.pop(next(iter(self.early_exits)))

    def worker_exited(self, proc: WorkerProcess, status: int) -> None:
        how = describe_exit(status)
        proc.last_exit = how
        self.unregister_worker(proc, f"worker {proc.name} {how}")
        self._cancel_timers(proc)
        proc.pid = None
        self._changed()
        if self.shutting_down:
            proc.set_state(ProcessState.STOPPED)
            log.info("worker %s stopped (%s)", proc.name, how)
            return
        if proc.state is ProcessState.STOPPING:  # an operator's restart
            log.info("worker %s %s; restarting", proc.name, how)
            proc.set_state(ProcessState.DOWN)
            self._respawn(proc)
            return
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_CANNOT_START:
            self._make_fatal(proc, f"could not start ({self._last_log_line(proc)})")
            return
        recent = proc.record_crash()
        if proc.crash_loop(recent):
            proc.set_state(ProcessState.DOWN)
            self._make_fatal(proc, f"{how}; crashed {recent} times within "
                                   f"{proc.spec.restart_window:g} s")
            return
        delay = restart_delay(recent)
        proc.set_state(ProcessState.DOWN)
        log.warning("worker %s %s; restarting in %g s", proc.name, how, delay,
                    extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                                 exit=how, restart_in=delay))
        if delay <= 0:
            self._respawn(proc)
        else:
            proc.restart_timer = self.loop.call_later(delay, self._respawn, proc)

    def _respawn(self, proc: WorkerProcess) -> None:
        proc.restarts += 1
        self.counters["restarts"] += 1
        self.observer.worker_restarted(proc.group)
        self.spawn_worker(proc)

    def _last_log_line(self, proc: WorkerProcess) -> str:
        try:
            with open(self.log_dir / f"{proc.name}.log", "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            return lines[-1].strip() if lines else "no output"
        except OSError:
            return "no log"

    def _cancel_timers(self, proc: WorkerProcess) -> None:
        for name in ("restart_timer", "kill_timer"):
            timer = getattr(proc, name)
            if timer is not None:
                timer.cancel()
                setattr(proc, name, None)

    def unregister_worker(self, proc: WorkerProcess, reason: str) -> None:
        """Drop the worker's pipe and slots at once; its running jobs fail this attempt."""
        if proc.sock is not None:
            fd = proc.sock.fileno()
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
            proc.sock.close()
            proc.sock = None
        proc.writing = False
        self._unflushed.discard(proc)
        if not proc.slot_ids:
            return
        self.pool.remove_worker(proc.generation)
        slot_ids, proc.slot_ids = proc.slot_ids, []
        for sid in slot_ids:
            self.slot_owner.pop(sid, None)
        for sid in slot_ids:
            rj = self.running.get(sid)
            if rj is not None:
                self.finish_job(rj, "crashed", error=rj.failure or reason)
        self.schedule()

    def kill_worker(self, proc: WorkerProcess, sig: int, grace: float | None = None) -> None:
        if proc.pid is None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass  # already dead: SIGCHLD is on its way
        except PermissionError:
            os.kill(proc.pid, sig)
        if grace is not None and proc.kill_timer is None:
            proc.kill_timer = self.loop.call_later(grace, self.kill_worker, proc, signal.SIGKILL)

    def stop_worker(self, proc: WorkerProcess, *, kill_now: bool = False) -> None:
        """Take the worker's slots out of the index, then SIGTERM (or SIGKILL) it."""
        if proc.state in (ProcessState.STARTING, ProcessState.RUNNING):
            proc.set_state(ProcessState.STOPPING)
        self.pool.remove_worker(proc.generation)
        if kill_now:
            self.kill_worker(proc, signal.SIGKILL)
        else:
            self.send(proc, {"t": "stop"})
            self.kill_worker(proc, signal.SIGTERM, grace=STOP_GRACE)

    def restart(self, name: str) -> list[str]:
        """Restart a group or one process, `fatal` ones included; returns the process names."""
        procs = [p for p in self.procs if name in (p.name, p.group)]
        for proc in procs:
            proc.crash_times.clear()
            proc.fatal_reason = None
            if proc.state in (ProcessState.DOWN, ProcessState.FATAL, ProcessState.STOPPED):
                self._cancel_timers(proc)
                log.info("worker %s restarted by the operator", proc.name)
                self._respawn(proc)
            elif proc.state in (ProcessState.STARTING, ProcessState.RUNNING):
                for rj in list(self.running.values()):
                    if rj.proc is proc:
                        self.cancel_job(rj, "restart")
                self.stop_worker(proc)
        return [p.name for p in procs]

    # -- the pipe -----------------------------------------------------------------------------

    def send(self, proc: WorkerProcess, msg: dict, *, defer: bool = False) -> bool:
        """Frame `msg` to the worker; with defer, it leaves with the cycle's other frames."""
        if proc.sock is None:
            return False
        proc.outbox += encode(msg)
        if defer:
            self._unflushed.add(proc)
            return True
        return self._flush(proc)

    def _flush(self, proc: WorkerProcess) -> bool:
        if proc.sock is None:
            return False
        if proc.writing:  # a partial write is pending: the writer callback carries on
            return True
        try:
            sent = proc.sock.send(proc.outbox)
        except BlockingIOError:
            sent = 0
        except OSError as exc:  # EPIPE/ECONNRESET: the worker is gone
            self.unregister_worker(proc, f"worker {proc.name} pipe closed ({exc.strerror})")
            return False
        del proc.outbox[:sent]
        if proc.outbox:
            proc.writing = True
            self.loop.add_writer(proc.sock.fileno(), self._on_writable, proc)
        return True

    def _flush_all(self) -> None:
        while self._unflushed:
            self._flush(self._unflushed.pop())

    def _on_writable(self, proc: WorkerProcess) -> None:
        try:
            sent = proc.sock.send(proc.outbox)
        except BlockingIOError:
            return
        except OSError as exc:
            self.unregister_worker(proc, f"worker {proc.name} pipe closed ({exc.strerror})")
            return
        del proc.outbox[:sent]
        if not proc.outbox:
            proc.writing = False
            self.loop.remove_writer(proc.sock.fileno())

    def _on_readable(self, proc: WorkerProcess) -> None:
        try:
            data = proc.sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.unregister_worker(proc, f"worker {proc.name} closed its pipe")
            return
        try:
            messages = proc.decoder.feed(data)
            for msg in messages:
                validate(msg)
                self.handle_message(proc, msg)
                if proc.sock is None:
                    return
        except ProtocolError as exc:
            log.error("worker %s sent a bad frame: %s; killing it", proc.name, exc)
            self.kill_worker(proc, signal.SIGKILL)
            self.unregister_worker(proc, f"worker {proc.name} sent a bad frame: {exc}")

    def handle_message(self, proc: WorkerProcess, msg: dict) -> None:
        kind = msg["t"]
        if kind == "hello":
            self.register_worker(proc, msg)
            return
        if kind == "fatal":
            log.error("worker %s cannot start: %s", proc.name, msg.get("error"))
            return
        if not proc.slot_ids:
            raise ProtocolError(f"{kind!r} before hello")
        slot = msg["slot"]
        rj = self.running.get(proc.slot_ids[slot]) if 0 <= slot < len(proc.slot_ids) else None
        if rj is None or rj.job_id != msg["job_id"]:
            log.warning("worker %s sent %s for job %s on slot %s, which is not running there; ignored",
                        proc.name, kind, msg.get("job_id"), slot)
            return
        if kind == "progress":
            rj.progress = msg.get("fraction")
            rj.message = msg.get("message") or ""
            if rj.request is not None:
                rj.request.notify({"event": "progress", "job_id": rj.job_id,
                                   "fraction": rj.progress, "message": rj.message})
        elif kind == "result":
            self.finish_job(rj, "succeeded", result=msg.get("result"))
        elif kind == "error":
            self.finish_job(rj, "failed", error=msg["error"], permanent=bool(msg.get("permanent")))
        elif kind == "refused":
            log.error("worker %s refused job %s: %s", proc.name, rj.job_id, msg.get("reason"))
            self.finish_job(rj, "refused", error=f"refused by {proc.name}: {msg.get('reason')}")

    def register_worker(self, proc: WorkerProcess, hello: dict) -> None:
        if proc.state is not ProcessState.STARTING or proc.slot_ids:
            raise ProtocolError("a second hello")
        if proc.pid is None:  # the template's answer is still on its way
            self._learn_pid(proc, int(hello["pid"]))
        if hello.get("incarnation") != proc.incarnation:
            raise ProtocolError(f"hello for incarnation {hello.get('incarnation')!r}, "
                                f"expected {proc.incarnation!r}")
        types = [t for t in proc.spec.types if t in set(hello["types"])]
        extra = set(hello["types"]) - set(proc.spec.types)
        if extra or not types:
            log.warning("worker %s announced types %s; using those configured for it: %s",
                        proc.name, hello["types"], types)
        slots = min(int(hello["slots"]), proc.spec.slots)
        if slots < 1 or not types:
            raise ProtocolError("hello announces no usable slot")
        type_ids = [self.type_ids[t] for t in types]
        proc.types = tuple(types)
        proc.slot_ids = []
        for index in range(slots):
            sid = self.next_slot_id
            self.next_slot_id += 1
            self.pool.add_slot(sid, proc.generation, type_ids)
            proc.slot_ids.append(sid)
            self.slot_owner[sid] = (proc, index)
        proc.set_state(ProcessState.RUNNING)
        self._changed()
        log.info("worker %s ready (pid %d, %d slot%s, types %s)", proc.name, proc.pid, slots,
                 "" if slots == 1 else "s",
                 ",".join(types))
        self.schedule()

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
        if self.shutting_down or self.pool.n_free == 0:
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
        for qj in () if self.lease.fenced else self.cache.values():
            tid = type_ids.get(qj.type)
            if tid is not None:
                entries.append(qj)
                types.append(tid)
                priorities.append(qj.priority)
                eligible.append(qj.eligible_at)
                on_demand.append(0)
                ids.append(qj.id)
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
                    del self.cache[entry.id]
                    claims.append((entry, slot_id))
            if claims:
                self.queue.claim(claims)
        if self._wants_fetch():
            self.queue.request_fetch()

    def _wants_fetch(self) -> bool:
        cached = {qj.type for qj in self.cache.values()}
        return any(t not in cached for t in self.free_by_type())

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
        self.cache = {qj.id: qj for qj in rows if qj.id not in busy}
        counts: dict[str, int] = {}
        for qj in rows:
            counts[qj.type] = counts.get(qj.type, 0) + 1
        for t, free in wanted.items():
            if counts.get(t, 0) < 2 * free:
                self.exhausted.add(t)
            else:
                self.exhausted.discard(t)
        self.schedule()

    def on_claimed(self, claims: list, won: dict) -> None:
        lost = 0
        for qj, slot_id in claims:
            job = won.get(qj.id)
            owner = self.slot_owner.get(slot_id)
            if job is None:
                lost += 1
                self.pool.release(slot_id)
                continue
            proc = owner[0] if owner else None
            if (proc is None or proc.state is not ProcessState.RUNNING or self.shutting_down
                    or self.lease.fenced or not self.pool.is_busy(slot_id)):
                # The slot's worker died or is stopping while the claim was in flight, or
                # this supervisor is giving its jobs back.
                self.queue.release(job.id, job.attempts)
                self.pool.release(slot_id)
                continue
            self.start_job(job, slot_id, attempt=job.attempts)
        if lost:
            self.counters["claim_losses"] += lost
            self.observer.claims_lost(lost)
            self.losses_in_row += lost
            if self.losses_in_row >= LOSSES_BEFORE_REFETCH:
                self.cache.clear()
                self.losses_in_row = 0
            self.exhausted.clear()
        elif claims:
            self.losses_in_row = 0
        self._flush_all()
        self.schedule()

    def on_jobs_notified(self, type_name: str) -> None:
        self.exhausted.discard(type_name)
        if type_name in self.type_ids and self.pool.free_count(self.type_ids[type_name]):
            self.queue.request_fetch()

    def on_poll(self) -> None:
        self.exhausted.clear()

    def wake_at(self, at: float) -> None:
        delay = max(0.0, at - time.time())
        if self._wake_handle is not None:
            if self._wake_handle.when() <= self.loop.time() + delay:
                return
            self._wake_handle.cancel()
        self._wake_handle = self.loop.call_later(delay + 0.001, self._on_wake)

    def _on_wake(self) -> None:
        self._wake_handle = None
        self.exhausted.clear()
        self.queue.request_fetch()

    def on_cancel_requested(self, job_id) -> None:
        try:
            rj = self.running_by_job.get(int(job_id))
        except (TypeError, ValueError):
            return
        if rj is not None:
            self.cancel_job(rj, "user")

    # -- jobs -----------------------------------------------------------------------------------

    def start_job(self, entry, slot_id: int, attempt: int) -> None:
        proc, index = self.slot_owner[slot_id]
        if isinstance(entry, Request):
            rj = RunningJob(job_id=entry.job_id, type=entry.type, priority=entry.priority,
                            payload=entry.payload, attempt=attempt, max_attempts=entry.max_attempts,
                            proc=proc, slot_id=slot_id, slot_index=index,
                            eligible_at=entry.eligible_at, request=entry)
        else:
            rj = RunningJob(job_id=entry.id, type=entry.type, priority=entry.priority,
                            payload=entry.payload, attempt=attempt,
                            max_attempts=entry.max_attempts or proc.spec.max_attempts,
                            proc=proc, slot_id=slot_id, slot_index=index,
                            eligible_at=entry.eligible_at)
        self.running[slot_id] = rj
        self.running_by_job[rj.job_id] = rj
        if proc.spec.timeout is not None:
            rj.timer = self.loop.call_later(proc.spec.timeout, self._on_job_timeout, rj)
        waited = max(0.0, time.time() - rj.eligible_at)
        self.observer.job_started(rj.type, waited)
        if log.isEnabledFor(logging.INFO):  # the hot path: build the fields only when shown
            log.info("job %s started: type %s, worker %s, slot %d, attempt %d/%d, waited %.3f s",
                     rj.job_id, rj.type, proc.name, index, attempt, rj.max_attempts, waited,
                     extra=fields(event="job_started", job_id=rj.job_id, type=rj.type,
                                  worker=proc.name, slot=index, attempt=attempt,
                                  max_attempts=rj.max_attempts, waited=round(waited, 6),
                                  on_demand=rj.on_demand))
        self.send(proc, {"t": "run", "incarnation": proc.incarnation, "slot": index,
                         "job": rj.frame()}, defer=True)  # the caller flushes the batch

    def _on_job_timeout(self, rj: RunningJob) -> None:
        rj.timer = None
        if self.running.get(rj.slot_id) is not rj:
            return
        rj.failure = f"timed out after {rj.proc.spec.timeout:g} s"
        log.warning("job %s on worker %s %s; stopping the worker", rj.job_id, rj.proc.name,
                    rj.failure)
        self.kill_worker(rj.proc, signal.SIGTERM, grace=STOP_GRACE)

    def cancel_job(self, rj: RunningJob, reason: str) -> None:
        if rj.cancel_reason is None or reason == "user":
            rj.cancel_reason = reason
        self.send(rj.proc, {"t": "cancel", "incarnation": rj.proc.incarnation,
                            "slot": rj.slot_index, "job_id": rj.job_id})

    def finish_job(self, rj: RunningJob, outcome: str, *, result=None, error: str | None = None,
                   permanent: bool = False) -> None:
        if self.running.get(rj.slot_id) is not rj:
            return
        del self.running[rj.slot_id]
        self.running_by_job.pop(rj.job_id, None)
        if rj.timer is not None:
            rj.timer.cancel()
        self.pool.release(rj.slot_id)  # a no-op when the worker (and its slots) is gone
        self._changed()
        duration = time.monotonic() - rj.started_mono
        where = f"type {rj.type}, worker {rj.proc.name}, slot {rj.slot_index}, attempt {rj.attempt}"
        if rj.request is not None:
            self._finish_on_demand(rj, outcome, result, error, permanent, duration, where)
        else:
            self._finish_queued(rj, outcome, result, error, permanent, duration, where)
        self.schedule()

    def _finish_queued(self, rj, outcome, result, error, permanent, duration, where) -> None:
        if rj.cancel_reason == "user":
            self._record(rj, "cancelled", duration)
            self.queue.cancel_finish(rj.job_id, rj.attempt)
            log.info("job %s cancelled: %s, %.3f s", rj.job_id, where, duration,
                     extra=job_fields(rj, "cancelled", duration))
        elif outcome == "succeeded":
            self._record(rj, "succeeded", duration)
            self.queue.complete(rj.job_id, rj.attempt, result)
            if log.isEnabledFor(logging.INFO):
                log.info("job %s succeeded: %s, %.3f s", rj.job_id, where, duration,
                         extra=job_fields(rj, "succeeded", duration))
        elif outcome == "refused" or rj.cancel_reason in ("shutdown", "restart", "lease"):
            self._record(rj, "returned", duration)
            self.queue.release(rj.job_id, rj.attempt)
            log.info("job %s returned to the queue (%s): %s", rj.job_id,
                     rj.cancel_reason or "refused", where,
                     extra=job_fields(rj, "returned", duration))
        else:
            last = permanent or rj.attempt >= rj.max_attempts
            delay = 0.0 if last else retry_delay(rj.attempt, base=rj.proc.spec.retry_backoff)
            self._record(rj, "failed" if last else "retried", duration)
            if last:
                log.warning("job %s failed for good: %s, %.3f s: %s", rj.job_id, where, duration,
                            error, extra=job_fields(rj, "failed", duration, error=error))
            else:
                log.warning("job %s failed: %s, %.3f s: %s; retry in %.1f s", rj.job_id, where,
                            duration, error, delay,
                            extra=job_fields(rj, "retried", duration, error=error,
                                             retry_in=round(delay, 3)))
            self.queue.fail(Failure(rj.job_id, rj.attempt, error or outcome, permanent, delay))

    def _finish_on_demand(self, rj, outcome, result, error, permanent, duration, where) -> None:
        req = rj.request
        if outcome == "succeeded" and rj.cancel_reason is None:
            self._record(rj, "succeeded", duration)
            if log.isEnabledFor(logging.INFO):
                log.info("job %s succeeded: %s, %.3f s", rj.job_id, where, duration,
                         extra=job_fields(rj, "succeeded", duration))
            self._finish_request(req, {"event": "result", "job_id": req.job_id, "result": result})
            return
        if rj.cancel_reason is not None or req.cancelled:
            self._record(rj, "cancelled", duration)
            reason = {"shutdown": "the supervisor is shutting down",
                      "restart": "the worker was restarted"}.get(rj.cancel_reason, "cancelled")
            if rj.cancel_reason == "restart" and not req.cancelled:
                self.requests[req.number] = req  # not the job's fault: run it elsewhere
                req.attempts -= 1
                return
            self._finish_request(req, {"event": "error", "job_id": req.job_id, "error": reason})
            return
        if outcome == "refused":
            req.attempts -= 1
            self.requests[req.number] = req
            return
        if permanent or req.attempts >= req.max_attempts:
            self._record(rj, "failed", duration)
            log.warning("job %s failed for good: %s, %.3f s: %s", rj.job_id, where, duration, error,
                        extra=job_fields(rj, "failed", duration, error=error))
            self._finish_request(req, {"event": "error", "job_id": req.job_id, "error": error,
                                       "attempts": req.attempts})
            return
        self._record(rj, "retried", duration)
        log.warning("job %s failed: %s, %.3f s: %s; retrying now", rj.job_id, where, duration, error,
                    extra=job_fields(rj, "retried", duration, error=error, retry_in=0.0))
        if req.notify is not None:
            req.notify({"event": "retry", "job_id": req.job_id, "error": error,
                        "attempt": req.attempts})
        self.requests[req.number] = req

    def _record(self, rj: RunningJob, outcome: str, duration: float) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + 1
        self.observer.job_finished(rj.type, outcome, duration)

    def _finish_request(self, req: Request, event: dict) -> None:
        if req.done:
            return
        req.done = True
        self.requests.pop(req.number, None)
        req.notify(event)

    # -- on-demand requests ---------------------------------------------------------------------

    def submit_on_demand(self, type_name: str, payload, priority: int, notify) -> Request | None:
        """Accept an on-demand request; None when no configured worker supports the type."""
        tid = self.type_ids.get(type_name)
        if tid is None:
            return None
        attempts = max(w.max_attempts for w in self.config.workers if type_name in w.types)
        req = Request(number=self.next_request, type=type_name, type_id=tid, payload=payload,
                      priority=priority, max_attempts=attempts, notify=notify)
        self.next_request += 1
        if self.shutting_down:
            self._finish_request(req, {"event": "error", "job_id": req.job_id,
                                       "error": "the supervisor is shutting down"})
            return req
        self.requests[req.number] = req
        self.schedule()
        return req

    def abandon_request(self, req: Request) -> None:
        """The caller gave up (timeout or disconnect): drop it, or cancel it where it runs."""
        req.cancelled = True
        if self.requests.pop(req.number, None) is not None:
            req.done = True
            return
        rj = self.running_by_job.get(req.job_id)
        if rj is not None:
            self.cancel_job(rj, "caller")
