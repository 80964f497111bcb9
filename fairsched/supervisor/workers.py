"""The workers component: the worker processes, spawned (cold, or forked by their group's
template: templates.py), reaped, restarted with backoff after a crash, and stopped or killed on
purpose (SIGTERM, then SIGKILL after a grace; the operator's `fairsched restart`). Their pipes
are pipes.py's; the lease watchdog, which watches their pids, is owned here too."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import stat
import sys
import time
from collections.abc import Callable

from fairsched.backoff import backoff
from fairsched.config import size_text
from fairsched.logs import fields, quoted, tail_lines, unstamped
from fairsched.protocol import ProtocolError
from fairsched.supervisor.lease import WATCHDOG_AT
from fairsched.supervisor.pipes import EXIT_GRACE, Pipes
from fairsched.supervisor.process import (
    ExitCause,
    Incarnation,
    WorkerProcess,
    decode_exit,
    drawn_max_jobs,
    oom_kill_count,
    rss_of,
)
from fairsched.supervisor.reload import RESIZE_ONLY
from fairsched.supervisor.rolling import Rolling
from fairsched.supervisor.states import EXITED, ProcessState
from fairsched.supervisor.templates import Templates, launch_spec
from fairsched.supervisor.watchdog import Watchdog
from fairsched.worker.launch import launch

log = logging.getLogger("fairsched.supervisor")

STOP_GRACE = 2.0  # SIGTERM to SIGKILL for a worker that is stopped or timed out
# A crash after a calm period restarts at once, the next ones after 0.1 s doubling to 30 s.
RESTART_DELAY_FIRST = 0.1
RESTART_DELAY_MAX = 30.0
RSS_CHECK_EVERY = 0.25  # seconds between looks at the workers' memory, with an rss_limit set
REAP_WAIT = 0.002  # seconds the loop waits, at most, for a worker whose pipe closed to exit
# wait4's flag (linux/wait.h) to wait for the calling thread's children only.
_WNOTHREAD = 0x20000000 if sys.platform.startswith("linux") else 0


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        # No group of that id: the worker is dead (SIGCHLD is on its way), or a template
        # forked it so recently that it has not made its own session yet.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Workers:
    """Owns the worker processes (`procs`, in config order, and by pid), the generations that
    name their slots in the pool, the exits reaped before their pid was known, the templates
    (Templates), the pipes (Pipes) and the lease watchdog. Wired by the actor to the planner,
    the jobs and the lease (connect)."""

    def __init__(self, config, loop, run, observer, changed):
        self.config = config
        self.loop = loop
        self.run = run  # RunState: the actor's, read only
        self.restarts = 0  # of every worker, for ps
        self._limits_timer: asyncio.TimerHandle | None = None
        self.observer = observer
        self._changed = changed  # wakes a shutdown waiting for workers to exit
        self.log_dir = config.supervisor.state_dir / "logs"
        self.procs = [WorkerProcess(spec, i) for spec in config.workers
                      for i in range(1, spec.processes + 1)]
        self.by_pid: dict[int, WorkerProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._next_generation = 1
        self.watchdog: Watchdog | None = None
        self.templates = Templates(self, config, loop, run, self.log_dir)
        self.pipes: Pipes | None = None
        self.rolling = Rolling(self, run)  # a reload's replacements, one at a time
        self._database_url: Callable[[], str | None] = lambda: None  # see use_database

    def connect(self, planner, jobs, lease) -> None:
        self.planner, self.jobs, self.lease = planner, jobs, lease
        self.pipes = Pipes(self, jobs, planner, self.loop, self.run, self.log_dir)

    def use_database(self, url: Callable[[], str | None]) -> None:
        """`url()` is the queue's database URL when a worker starts: a Python worker gets it
        (FAIRSCHED_QUEUE_DATABASE) for job.transaction()."""
        self._database_url = url

    def start_watchdog(self) -> None:
        self.watchdog = Watchdog(self.loop, self.log_dir / "watchdog.log", self.busy_pids,
                                 self.pids)
        self.watchdog.start()

    def start(self, templates: dict | None = None) -> None:
        """Start every worker, from its group's template where it has one (`templates`: those
        start_templates began already)."""
        self.templates.start_all(templates)
        if any(spec.rss_limit is not None for spec in self.config.workers):
            self._limits_timer = self.loop.call_later(RSS_CHECK_EVERY, self._check_limits)

    def _check_limits(self) -> None:
        self._limits_timer = None
        if self.run.shutting_down:
            return
        self.check_rss_limits()
        self._limits_timer = self.loop.call_later(RSS_CHECK_EVERY, self._check_limits)

    def keep_templates(self, templates: dict) -> None:
        """Stopping before any worker started: the templates begun already are stopped with
        the rest."""
        self.templates.keep_for_shutdown(templates)

    def close_templates(self) -> None:
        self.templates.close_all()

    # -- the lease watchdog --------------------------------------------------------------------

    def lease_renewed(self, until: float) -> None:
        """The lease holds until loop time `until`, as far as the watchdog goes."""
        self.watchdog.lease(until)

    def refresh_watchdog(self) -> None:
        """Tell the watchdog who is busy now (the lease is in doubt: no renewal may come)."""
        if self.watchdog is not None:
            self.watchdog.refresh()

    def flush_watchdog(self) -> None:
        if self.watchdog is not None:
            self.watchdog.flush()

    async def stop_watchdog(self, wait_changed) -> None:
        """Close the watchdog's socket, which makes it exit; killed if it has not within
        STOP_GRACE (stopped, or stuck: every worker is gone by now). `wait_changed(timeout)`
        waits for the loop to change something, its exit among them."""
        watchdog = self.watchdog
        if watchdog is None:
            return
        watchdog.close()
        deadline = time.monotonic() + STOP_GRACE
        while watchdog.pid is not None and time.monotonic() < deadline:
            await wait_changed(deadline - time.monotonic())
        if watchdog.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(watchdog.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(watchdog.pid, 0)

    # -- what the jobs tell --------------------------------------------------------------------

    def job_started(self, proc: WorkerProcess, *, queued: bool) -> None:
        proc.life.active_at = time.monotonic()
        if queued:
            proc.life.queued_jobs += 1
            if proc.life.queued_jobs == 1:
                self.watchdog.busy(proc.life.pid)

    def job_ended(self, proc: WorkerProcess, *, queued: bool, succeeded: bool,
                  fenced: bool) -> None:
        proc.life.active_at = time.monotonic()
        if queued:
            proc.life.queued_jobs -= 1
            # Its being idle goes to the lease watchdog with the next line (Watchdog.busy),
            # which the next renewal sends; with the lease in doubt, none may come in time.
            if proc.life.queued_jobs == 0 and fenced:
                self.refresh_watchdog()
        if succeeded:
            proc.life.jobs_succeeded += 1
        if proc.life.retiring and proc.state is ProcessState.RUNNING and not self.jobs.busy(proc):
            self.stop_worker(proc)  # a reload replaces or removes it: its last job ended

    def ran_job(self, proc: WorkerProcess) -> None:
        """A job of `proc` ran to its end (whatever its outcome): replace the process once
        its jobs are done if it has run max_jobs, or is above max_rss now."""
        life = proc.life
        life.jobs_done += 1
        if proc.state is not ProcessState.RUNNING or life.pid is None:
            return
        if life.recycling is None:
            why = None
            if life.max_jobs is not None and life.jobs_done >= life.max_jobs:
                why = f"max_jobs: ran {life.jobs_done} jobs"
            elif proc.spec.max_rss is not None:
                rss = rss_of(life.pid)
                if rss is not None and rss > proc.spec.max_rss:
                    why = f"max_rss: RSS {size_text(rss)} above {size_text(proc.spec.max_rss)}"
            if why is None:
                return
            self._recycle(proc, why)
        if not self.jobs.busy(proc):
            self.stop_worker(proc)  # its last job is done: its replacement comes at its exit

    def _recycle(self, proc: WorkerProcess, why: str) -> None:
        proc.life.recycling = why
        self.observer.worker_recycled(proc.group, why.partition(":")[0])
        self.planner.close_slots(proc.life.generation)  # no more work: its jobs end first
        running = len(self.jobs.on(proc))
        then = ("" if not running else "; it finishes its running job first" if running == 1
                else f"; it finishes its {running} running jobs first")
        log.info("worker %s is recycled (%s)%s", proc.name, why, then,
                 extra=fields(event="worker_recycled", worker=proc.name, group=proc.group,
                              reason=why))

    def check_rss_limits(self) -> None:
        """Kill at once every worker above its group's rss_limit: its jobs fail this attempt,
        their last_error naming the limit (a leak that would otherwise grow until the OOM
        killer takes it, or the whole host)."""
        for proc in self.procs:
            limit, life = proc.spec.rss_limit, proc.life
            if limit is None or life.pid is None or life.over_limit:
                continue
            rss = rss_of(life.pid)
            if rss is None or rss <= limit:
                continue
            life.over_limit = True
            life.kill_reason = f"RSS {size_text(rss)} above rss_limit {size_text(limit)}"
            log.warning("worker %s uses %s, above its rss_limit of %s; killing it", proc.name,
                        size_text(rss), size_text(limit),
                        extra=fields(event="worker_over_limit", worker=proc.name,
                                     group=proc.group, rss=rss, rss_limit=limit))
            self.observer.worker_recycled(proc.group, "rss_limit")
            self.planner.close_slots(life.generation)
            self.kill_worker(proc, signal.SIGKILL)

    def stop_for_job(self, proc: WorkerProcess, why: str, kill_reason: str | None = None) -> None:
        """Stop `proc` for what one of its jobs did (`why`: its job timed out, or did not stop
        when cancelled): not a crash."""
        if kill_reason is not None and proc.life.kill_reason is None:
            proc.life.kill_reason = kill_reason
        proc.life.stopped_for_job = proc.life.stopped_for_job or why
        self.stop_worker(proc)

    def busy_pids(self) -> list[int]:
        """The workers running queued jobs now, for the lease watchdog."""
        return [p.life.pid for p in self.procs if p.life.queued_jobs and p.life.pid is not None]

    def pids(self) -> list[int]:
        return [p.life.pid for p in self.procs if p.life.pid is not None]

    def live(self) -> bool:
        """Whether a worker process is still to be reaped."""
        return bool(self.by_pid)

    def send(self, proc: WorkerProcess, msg: dict | bytes, *, defer: bool = False) -> bool:
        return self.pipes.send(proc, msg, defer=defer)

    def flush_all(self) -> None:
        self.pipes.flush_all()

    def read_pending(self, procs=None) -> None:
        self.pipes.read_pending(self.procs if procs is None else procs)

    def learn_pid(self, proc: WorkerProcess, pid: int) -> None:
        if proc.life.pid is None:
            proc.life.pid = pid
            self.by_pid[pid] = proc
            if self.watchdog is not None:
                self.watchdog.born(pid)
            log.info("worker %s spawned (pid %d)", proc.name, pid,
                     extra=fields(event="worker_spawned", worker=proc.name, group=proc.group, pid=pid))
        # Whether it exited before we knew whose it was: a zombie waiting for us, or reaped
        # already (early_exits). Asked of the process first: a stored exit is an earlier
        # process's that had the same pid when this one lives, or is a zombie still.
        earlier = self._early_exits.pop(pid, None)
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
            status = status if done else None
        except ChildProcessError:
            status = earlier
        if status is not None:  # it exited before we knew whose it was
            self.by_pid.pop(pid, None)
            self.worker_exited(proc, status)
        elif proc.state is ProcessState.STOPPING:
            self.kill_worker(proc, signal.SIGTERM, grace=STOP_GRACE)
        elif proc.life.sock is None:  # its pipe closed before the template's answer came
            self.expect_exit(proc)

    def relaunch_cold(self, proc: WorkerProcess) -> None:
        self.pipes.drop(proc)
        proc.set_state(ProcessState.DOWN)
        self.spawn_worker(proc, cold=True)

    def spawn_worker(self, proc: WorkerProcess, *, cold: bool = False) -> None:
        if self.run.shutting_down or proc.removed:
            return
        proc.restart_timer = None
        if not cold and self.templates.warming(proc.group):
            proc.set_state(ProcessState.DOWN)  # its template starts it once it has imported
            return
        if proc.life.hello_timer is not None:  # an earlier try's, relaunched cold since
            proc.life.hello_timer.cancel()
        generation = self._next_generation
        self._next_generation += 1
        proc.life = Incarnation(name=f"{proc.name}.{generation}.{secrets.token_hex(4)}",
                                generation=generation, max_jobs=drawn_max_jobs(proc.spec))
        spec = launch_spec(proc, self.log_dir, self.config.supervisor)
        spec.database_url = self._database_url()
        pid = None
        try:
            sock = None if cold else self.templates.fork(proc, spec)
            if sock is None:
                launched = launch(spec, proc.life.name)
                sock, pid = launched.sock, launched.pid
        except OSError as exc:
            self.make_fatal(proc, f"could not start: {exc}")
            return
        self.pipes.attach(proc, sock)
        proc.life.started_at = time.time()
        proc.life.started_mono = time.monotonic()
        proc.life.oom_kills_at_start = oom_kill_count()
        proc.set_state(ProcessState.STARTING)
        proc.life.hello_timer = self.loop.call_later(proc.spec.start_timeout, self._no_hello, proc)
        if pid is not None:
            self.learn_pid(proc, pid)

    def register_worker(self, proc: WorkerProcess, hello: dict) -> None:
        if proc.life.slot_ids:
            raise ProtocolError("a second hello")
        if hello.get("incarnation") != proc.life.name:
            raise ProtocolError(f"hello for incarnation {quoted(repr(hello['incarnation']), 100)}, "
                                f"expected {proc.life.name!r}")
        if proc.life.pid is None:  # the template's answer is still on its way
            self.learn_pid(proc, int(hello["pid"]))
            if proc.life.sock is None or proc.life.name != hello["incarnation"]:
                return  # it had exited already, and is gone (or restarted) now
        if proc.state is not ProcessState.STARTING:  # told to stop before it was ready
            return
        types = [t for t in proc.spec.types if t in set(hello["types"])]
        announced = quoted(", ".join(hello["types"]))
        if not types:
            raise ProtocolError(f"hello announces types {announced}, none of "
                                f"those configured for it ({', '.join(proc.spec.types)})")
        if set(hello["types"]) != set(types):
            log.warning("worker %s announced types %s; it gets jobs of %s only", proc.name,
                        announced, ", ".join(types))
        slots = min(int(hello["slots"]), proc.spec.slots)
        if hello["slots"] != proc.spec.slots:
            log.warning("worker %s announced %d slot%s, %d configured: it gets %d", proc.name,
                        hello["slots"], "" if hello["slots"] == 1 else "s", proc.spec.slots,
                        slots)
        proc.life.types = tuple(types)
        proc.life.slot_ids = self.planner.add_slots(proc, proc.life.generation, types, slots)
        if proc.life.hello_timer is not None:
            proc.life.hello_timer.cancel()
            proc.life.hello_timer = None
        proc.set_state(ProcessState.RUNNING)
        proc.life.active_at = time.monotonic()
        self._changed()
        log.info("worker %s ready (pid %d, %d slot%s, types %s)", proc.name, proc.life.pid, slots,
                 "" if slots == 1 else "s", ",".join(types),
                 extra=fields(event="worker_ready", worker=proc.name, group=proc.group,
                              pid=proc.life.pid, slots=slots, types=list(types)))
        why = self.templates.imported_by_worker(proc.group)
        if why is not None:  # a worker imported what its template could not: that one differs
            log.warning("%s; its workers import it all the same (reading at import a variable "
                        "set per worker, such as FAIRSCHED_WORKER?), so they start cold, each "
                        "importing it", why)
        self.planner.schedule()
        self.rolling.step()

    def pipe_closed(self, proc: WorkerProcess) -> None:
        """The worker's pipe closed and it has not exited yet. Its slots take no more work at
        once; its running jobs fail when it exits, EXIT_GRACE later at most, with how it
        ended: a worker whose handler closed its channel still has to find that out, say so
        in its log and exit, which takes longer than reap_worker waits."""
        waits = (proc.life.pid is not None and self.by_pid.get(proc.life.pid) is proc
                 and not self.run.shutting_down)
        if waits and self.jobs.busy(proc):
            self.planner.close_slots(proc.life.generation)  # its jobs keep their slots' ids
            self.pipes.drop(proc)
            self.planner.schedule()
        else:
            self.unregister_worker(proc, f"worker {proc.name} closed its pipe" + (
                f" after saying: {proc.life.said_fatal}" if proc.life.said_fatal else ""))
        self.expect_exit(proc)

    def make_fatal(self, proc: WorkerProcess, reason: str) -> None:
        proc.fatal_reason = reason
        proc.set_state(ProcessState.FATAL)
        log.error("worker %s is fatal: %s; run `fairsched restart %s` once fixed",
                  proc.name, reason, proc.name,
                  extra=fields(event="worker_fatal", worker=proc.name, group=proc.group,
                               reason=reason))
        self.jobs.fail_unrunnable_requests()
        self.rolling.step()

    def reap_workers(self) -> None:
        """Collect every exited child of the loop's thread; several SIGCHLDs fold into one call.

        That is workers, templates, the lease watchdog and orphans re-parented here (this
        process is their subreaper: a job's helper left behind, say), all started by or given
        to this thread. A child another thread started and waits for itself, such as the
        embedded PostgreSQL's pg_ctl run from an executor thread, keeps its exit status for
        its waiter (__WNOTHREAD).
        """
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | _WNOTHREAD)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._reaped(pid, status)

    def _reaped(self, pid: int, status: int) -> None:
        proc = self.by_pid.pop(pid, None)
        if proc is not None:
            self.worker_exited(proc, status)
        elif self.watchdog is not None and pid == self.watchdog.pid:
            self.watchdog.exited(status)
            self._changed()
        elif self.templates.reaped(pid):
            pass
        elif self.templates.spawns_pending():
            # A template-forked worker can exit before its pid reaches us. (Other unknown
            # children are orphans re-parented here: nothing to keep of them.)
            self._early_exits[pid] = status
            while len(self._early_exits) > 256:
                self._early_exits.pop(next(iter(self._early_exits)))

    def reap_worker(self, proc: WorkerProcess, wait: float = REAP_WAIT) -> bool:
        """Reap `proc` if it exits within `wait` seconds; whether it did.

        A dying process closes its files a moment before it can be reaped: waiting that
        moment out, once its pipe closed, tells its running jobs how it ended ("killed by
        SIGKILL, perhaps out of memory") instead of only that its pipe closed.
        """
        if proc.life.pid is None or self.by_pid.get(proc.life.pid) is not proc:
            return False
        deadline = time.monotonic() + wait
        while True:
            try:
                pid, status = os.waitpid(proc.life.pid, os.WNOHANG)
            except ChildProcessError:  # not (yet) this process's child: SIGCHLD will tell
                return False
            if pid:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.0001)
        del self.by_pid[pid]
        self.worker_exited(proc, status)
        return True

    def worker_exited(self, proc: WorkerProcess, status: int) -> None:
        # Whatever its jobs started in its process group (a converter's subprocess, say) goes
        # with it: those jobs may run again elsewhere, and nothing outlives its worker.
        with contextlib.suppress(OSError):  # nothing left in the group: the usual case
            os.killpg(proc.life.pid, signal.SIGKILL)
        self.pipes.read_last_words(proc)
        lease_ran_out = self.killed_by_watchdog(proc)
        if self.watchdog is not None:
            self.watchdog.gone(proc.life.pid)
        ended = decode_exit(proc, status, lease_ran_out=lease_ran_out,
                            shutting_down=self.run.shutting_down,
                            last_log_line=lambda: self._last_log_line(proc))
        how = proc.last_exit = ended.how
        jobs = [rj.job_id for rj in self.jobs.on(proc)]
        self.unregister_worker(proc, f"worker {proc.name} {how}")
        self.cancel_timers(proc)
        proc.life.pid = None
        self._changed()
        if proc.removed and ended.cause is not ExitCause.SHUTDOWN:
            self._gone_for_good(proc, how)
            return
        match ended.cause:
            case ExitCause.SHUTDOWN:
                proc.set_state(ProcessState.STOPPED)
                log.info("worker %s stopped: %s", proc.name, how,
                         extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                                      exit=how, restart_in=None))
            case ExitCause.FENCED:
                # This supervisor stalled or could not renew its lease: back at once, not
                # counted as a crash, nor taken for an operator's restart.
                self._restart_now(proc, logging.WARNING, "worker %s %s; restarting", how)
            case ExitCause.STOPPED_FOR_JOB:
                # Stopped under a job past its timeout or deaf to its cancel: the job failed
                # or was cancelled, not the worker. Back at once, not counted as a crash.
                proc.last_exit = f"{how} after {ended.why}"
                self._restart_now(proc, logging.INFO, "worker %s %s after %s; restarting", how,
                                  ended.why, exit=how)
            case ExitCause.RECYCLED:
                proc.last_exit = f"{how} (recycled: {ended.why})"
                self._restart_now(proc, logging.INFO,
                                  "worker %s recycled (%s): %s; its replacement starts",
                                  ended.why, how)
            case ExitCause.OVER_LIMIT if proc.life.jobs_done or jobs:
                # Its jobs failed this attempt; the process is no crash (one that is above its
                # limit before running anything is, below).
                self._restart_now(proc, logging.WARNING, "worker %s %s; restarting", how)
            case ExitCause.RESTARTED if proc.life.retiring:
                proc.last_exit = f"{how} (replaced in a reload)"
                self._restart_now(proc, logging.INFO, "worker %s %s; starting its replacement",
                                  how)
            case ExitCause.RESTARTED:
                proc.last_exit = f"{how} (restarted by the operator)"
                self._restart_now(proc, logging.INFO, "worker %s %s; restarting", how)
            case ExitCause.SCALED_DOWN:
                proc.set_state(ProcessState.STOPPED)
                self.procs = [p for p in self.procs if p is not proc]  # iterations go on
                log.info("worker %s stopped: %s (its group shrank)", proc.name, how,
                         extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                                      exit=how, restart_in=None))
            case ExitCause.INCOMPATIBLE | ExitCause.CANNOT_START:
                self.make_fatal(proc, f"could not start: {ended.why}")
            case ExitCause.CRASHED | ExitCause.OVER_LIMIT:
                self._crashed(proc, how, jobs)

    def _restart_now(self, proc: WorkerProcess, level: int, message: str, *args,
                     exit: str | None = None) -> None:
        """Say how `proc` ended (`message`, its name first, then `args`; `exit`, the log's
        structured key, is its last_exit unless given) and start it again at once: no crash."""
        log.log(level, message, proc.name, *args,
                extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                             exit=proc.last_exit if exit is None else exit, restart_in=0.0))
        proc.set_state(ProcessState.DOWN)
        self._respawn(proc)

    def _crashed(self, proc: WorkerProcess, how: str, jobs: list) -> None:
        """Restart a crashed worker after a backoff, or make it fatal in a crash loop. A crash
        that a job which crashed a worker before was running is that job's, not the
        worker's: not counted toward max_restarts."""
        blamed = self.jobs.blame(jobs)
        recent = len(proc.crash_times) if blamed is not None else proc.record_crash()
        if proc.crash_loop(recent):
            proc.set_state(ProcessState.DOWN)
            times = "once" if recent == 1 else f"{recent} times"  # max_restarts = 0
            self.make_fatal(proc, f"{how}; crashed {times} within "
                                  f"{proc.spec.restart_window:g} s")
            return
        delay = 0.0 if recent <= 1 else backoff(recent - 2, RESTART_DELAY_FIRST, RESTART_DELAY_MAX)
        proc.set_state(ProcessState.DOWN)
        spared = ("" if blamed is None else
                  f" (not counted toward max_restarts: job {blamed} crashed a worker before)")
        log.warning("worker %s %s; restarting in %g s%s", proc.name, how, delay, spared,
                    extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                                 exit=how, restart_in=delay))
        if delay <= 0:
            self._respawn(proc)
        else:
            proc.restart_timer = self.loop.call_later(delay, self._respawn, proc)

    def killed_by_watchdog(self, proc: WorkerProcess) -> bool:
        """Whether the lease watchdog killed `proc` because this supervisor stalled past its
        lease. The jobs that made it do so may be running elsewhere by now: they go back to
        the queue unspent (a release that changes nothing if another supervisor took them),
        and its on-demand jobs run again."""
        if proc.life.lease_killed:
            return True
        if self.watchdog is None or not self.watchdog.took(proc.life.pid):
            return False
        proc.life.lease_killed = True
        log.error("worker %s was killed by the lease watchdog: this supervisor did not renew "
                  "its lease for %g s (stalled or stopped?)", proc.name,
                  self.lease.lease * WATCHDOG_AT)
        self.jobs.watchdog_killed(proc)
        return True

    def _respawn(self, proc: WorkerProcess) -> None:
        proc.restarts += 1
        self.restarts += 1
        self.observer.worker_restarted(proc.group)
        self.spawn_worker(proc)

    def _last_log_line(self, proc: WorkerProcess) -> str:
        path = self.log_dir / f"{proc.name}.log"
        try:
            # A FIFO in its place (output streamed elsewhere): opening it to read would wait
            # for a writer, and take its reader's lines.
            if not stat.S_ISREG(os.stat(path).st_mode):
                return "not a file"
            lines = tail_lines(path)
            return unstamped(lines[-1]) if lines else "no output"
        except OSError:
            return "no log"

    def _no_hello(self, proc: WorkerProcess) -> None:
        proc.life.hello_timer = None
        if proc.state is ProcessState.STARTING and proc.life.pid is None:
            # Its template never answered the spawn: stuck (stopped, say). Its workers start
            # cold from here on.
            log.warning("template for %s did not start worker %s within %g s (start_timeout); "
                        "killing it, its workers start cold", proc.group, proc.name,
                        proc.spec.start_timeout)
            if not self.templates.kill(proc.group):  # its pending spawns start cold
                self.relaunch_cold(proc)
        elif proc.state is ProcessState.STARTING:
            log.warning("worker %s did not start within %g s (start_timeout); killing it",
                        proc.name, proc.spec.start_timeout)
            proc.life.kill_reason = f"no hello within {proc.spec.start_timeout:g} s"
            self.kill_worker(proc, signal.SIGKILL)

    def cancel_timers(self, proc: WorkerProcess) -> None:
        """Its restart, and its incarnation's SIGKILL after a grace and wait for a hello."""
        life = proc.life
        for timer in (proc.restart_timer, life.kill_timer, life.hello_timer):
            if timer is not None:
                timer.cancel()
        proc.restart_timer = life.kill_timer = life.hello_timer = None

    def unregister_worker(self, proc: WorkerProcess, reason: str) -> None:
        """Drop the worker's pipe and slots at once; its running jobs fail this attempt."""
        self.pipes.drop(proc)
        if not proc.life.slot_ids:
            return
        self.planner.close_slots(proc.life.generation)
        slot_ids, proc.life.slot_ids = proc.life.slot_ids, []
        self.planner.drop_slots(slot_ids)
        self.jobs.crashed_with(proc, slot_ids, reason)
        self.planner.schedule()

    # -- stopping on purpose ---------------------------------------------------------------------

    def kill_for_lease(self, proc: WorkerProcess) -> None:
        """`proc` still runs a job of the expiring lease: killed now. Its slots leave the index
        at once, as with any stop: no on-demand job is placed on them before its exit is read.
        Restarted at once, not counted as a crash."""
        proc.life.fenced_kill = True
        if proc.life.kill_reason is None:
            proc.life.kill_reason = "still running a job of the expiring lease"
        self.stop_worker(proc, kill_now=True)

    def shutting_down(self) -> None:
        """The shutdown began: a worker its template is still forking is stopped when its pid
        comes."""
        for proc in self.procs:
            if proc.life.pid is None and proc.state is ProcessState.STARTING:
                proc.set_state(ProcessState.STOPPING)

    def stop_idle(self) -> None:
        """Shutting down: a worker whose jobs have all reported is told to stop at once."""
        for proc in self.procs:
            if (proc.life.pid is not None and not self.jobs.busy(proc)
                    and proc.state in (ProcessState.STARTING, ProcessState.RUNNING)):
                self.stop_worker(proc)

    def stop_all(self, timeout: float, hurried: bool) -> None:
        """The end of a shutdown: every worker is stopped, those still running a job killed."""
        for proc in self.procs:
            self.cancel_timers(proc)
            if proc.state in (ProcessState.DOWN, ProcessState.FATAL):
                proc.set_state(ProcessState.STOPPED)
            elif proc.life.pid is not None:
                jobs = [str(rj.job_id) for rj in self.jobs.on(proc)]
                if jobs:
                    when = ("when stop was asked again" if hurried else
                            f"at the end of shutdown_timeout ({timeout:g} s)")
                    log.warning("worker %s still runs job %s %s; killing it", proc.name,
                                ", ".join(jobs), when)
                    proc.life.kill_reason = ("still running when stop was asked again" if hurried
                                        else f"still running after shutdown_timeout, {timeout:g} s")
                self.stop_worker(proc, kill_now=bool(jobs))

    def expect_exit(self, proc: WorkerProcess) -> None:
        """The worker's pipe is gone: it exits now (a crash, as SIGCHLD will tell), or it is
        killed after EXIT_GRACE, having nothing more to do without its pipe."""
        if proc.life.pid is None or proc.life.kill_timer is not None or self.run.shutting_down:
            return
        proc.life.kill_timer = self.loop.call_later(EXIT_GRACE, self._kill_pipeless, proc)

    def _kill_pipeless(self, proc: WorkerProcess) -> None:
        proc.life.kill_timer = None
        if proc.life.pid is not None and proc.life.sock is None and not self.reap_worker(proc, wait=0):
            log.warning("worker %s closed its pipe but kept running; killing it", proc.name)
            proc.life.kill_reason = proc.life.kill_reason or "it closed its pipe but kept running"
            self.kill_worker(proc, signal.SIGKILL)

    def kill_worker(self, proc: WorkerProcess, sig: int, grace: float | None = None) -> None:
        if proc.life.pid is None:
            return
        proc.life.signalled.add(sig)
        _signal_group(proc.life.pid, sig)
        if sig == signal.SIGTERM:
            # One a signal has stopped (SIGSTOP, Ctrl-Z) takes SIGTERM only once continued, as
            # systemd continues what it stops: it ends in good order, not with SIGKILL.
            _signal_group(proc.life.pid, signal.SIGCONT)
        if grace is not None and proc.life.kill_timer is None:
            proc.life.kill_timer = self.loop.call_later(grace, self._kill_after_grace, proc, grace)

    def _kill_after_grace(self, proc: WorkerProcess, grace: float) -> None:
        proc.life.kill_timer = None
        if proc.life.pid is None or self.reap_worker(proc, wait=0):
            return  # it exited in time; its SIGCHLD had yet to be heard
        jobs = ", ".join(str(rj.job_id) for rj in self.jobs.on(proc))
        if jobs:  # it took the SIGTERM, and waits for handlers that do not check job.cancelled()
            log.warning("worker %s still runs job %s %g s after it was told to stop; killing it",
                        proc.name, jobs, grace)
            why = f"job {jobs} did not stop within {grace:g} s"
        else:
            log.warning("worker %s still runs %g s after SIGTERM; killing it", proc.name, grace)
            why = f"it ignored SIGTERM for {grace:g} s"
        if proc.life.kill_reason is None:
            proc.life.kill_reason = why
        self.kill_worker(proc, signal.SIGKILL)

    def worker_leaving(self, proc: WorkerProcess) -> None:
        """`proc` stopped a job it was not asked to stop: it was told to stop by someone else
        (a SIGTERM), and exits once its jobs have returned. Its slots take no more work, which
        it would refuse or, exiting, fail unrun; its exit is a crash, restarted as usual."""
        if proc.state is ProcessState.RUNNING:
            self.planner.close_slots(proc.life.generation)
            proc.life.leaving = True

    def left_idle(self, proc: WorkerProcess) -> None:
        """The last job of a worker that is leaving (worker_leaving) has ended: it exits now,
        or it is stopped STOP_GRACE later, not left holding its place with no work."""
        self.loop.call_later(STOP_GRACE, self._still_leaving, proc, proc.life.generation)

    def _still_leaving(self, proc: WorkerProcess, generation: int) -> None:
        if proc.life.generation != generation or proc.state is not ProcessState.RUNNING:
            return  # it left, or was stopped or restarted meanwhile (its slots take no work)
        log.warning("worker %s stopped its jobs as if told to stop, but still runs %g s "
                    "after the last one; stopping it", proc.name, STOP_GRACE)
        self.stop_worker(proc)

    def stop_worker(self, proc: WorkerProcess, *, kill_now: bool = False) -> None:
        """Take the worker's slots out of the index, then SIGTERM (or SIGKILL) it."""
        if proc.state is ProcessState.STOPPING and proc.life.kill_timer is not None and not kill_now:
            return  # told already (a second job timing out, say): its SIGKILL is on its way
        if proc.state in (ProcessState.STARTING, ProcessState.RUNNING):
            proc.set_state(ProcessState.STOPPING)
        self.planner.close_slots(proc.life.generation)
        if kill_now:
            self.kill_worker(proc, signal.SIGKILL)
        else:
            self.send(proc, {"t": "stop"})
            self.kill_worker(proc, signal.SIGTERM, grace=STOP_GRACE)

    def restart(self, name: str) -> list[str]:
        """Restart a group or one process, `fatal` ones included; returns the process names."""
        # (Not one a reload removed: it is on its way out, and its group's template is gone.)
        procs = [p for p in self.procs if name in (p.name, p.group) and not p.removed]
        for spec in {p.spec.name: p.spec for p in procs}.values():
            self.templates.reload(spec)
        for proc in procs:
            proc.crash_times.clear()
            proc.fatal_reason = None
            if (proc.state is ProcessState.DOWN and proc.restart_timer is None
                    and self.templates.warming(proc.group)):
                continue  # not started yet: it starts when the new template has imported
            if proc.state in EXITED:
                self.cancel_timers(proc)
                log.info("worker %s restarted by the operator", proc.name)
                self._respawn(proc)
            elif proc.state in (ProcessState.STARTING, ProcessState.RUNNING):
                log.info("worker %s restarted by the operator (stopping pid %s)", proc.name,
                         proc.life.pid)
                self.jobs.cancel_on(proc, "restart")
                self.stop_worker(proc)
        return [p.name for p in procs]

    # -- autoscaling (autoscale.py decides) ----------------------------------------------------

    def warming(self, group: str) -> bool:
        """Whether the group's template is still importing its handler."""
        return self.templates.warming(group)

    def size(self, group: str) -> int:
        """The group's processes, those on their way up or down (restarting) included, those
        the autoscaler stopped or a reload removed not."""
        return sum(1 for p in self.procs
                   if p.group == group and not p.scaling_down and not p.removed)

    def free_index(self, group: str) -> int:
        """The lowest process number no process of the group has, those on their way out
        included: a new one never takes the name (and log) of another."""
        taken = {p.index for p in self.procs if p.group == group}
        return next(i for i in range(1, len(taken) + 2) if i not in taken)

    def leaving(self, group: str) -> bool:
        """Whether a process of the group that the autoscaler stopped has yet to exit."""
        return any(p.group == group and p.scaling_down for p in self.procs)

    def starting_slots(self, group: str) -> int:
        """Slots of the group's processes on their way up (starting, or down to be restarted):
        the jobs waiting that these will take call for no more processes."""
        return sum(p.spec.slots for p in self.procs if p.group == group and not p.scaling_down
                   and p.state in (ProcessState.STARTING, ProcessState.DOWN))

    def idle_process(self, group: str, idle_for: float, now: float) -> WorkerProcess | None:
        """The highest numbered running process of the group that has run nothing for
        `idle_for` seconds, no slot of it reserved either; None if there is none."""
        for proc in sorted(self.procs, key=lambda p: -p.index):
            if (proc.group == group and not proc.scaling_down and proc.state is ProcessState.RUNNING
                    and not proc.life.leaving and proc.life.slot_ids
                    and now - proc.life.active_at >= idle_for and not self.jobs.busy(proc)
                    and not self.planner.any_busy(proc.life.slot_ids)):
                return proc
        return None

    def grow(self, spec) -> WorkerProcess:
        """Start one more process of the group, numbered with the lowest free index, placed
        after the group's others."""
        index = self.free_index(spec.name)
        # The assignment its group's processes have now (the same as `spec`, unless the group
        # was changed since the autoscaler was given it).
        spec = next((p.spec for p in reversed(self.procs)
                     if p.spec.name == spec.name and not p.scaling_down), spec)
        proc = WorkerProcess(spec, index)
        last = max((i for i, p in enumerate(self.procs) if p.spec.name == spec.name),
                   default=len(self.procs) - 1)
        self.procs = [*self.procs[:last + 1], proc, *self.procs[last + 1:]]
        self.spawn_worker(proc)
        return proc

    def scale_down(self, proc: WorkerProcess) -> None:
        """Stop an idle process for good: the group shrinks. It leaves `procs` once it has
        exited (worker_exited)."""
        proc.scaling_down = True
        self.stop_worker(proc)
    # -- a reload (fairsched reload, SIGHUP) ---------------------------------------------------

    def reconfigure(self, config, change) -> None:
        """Apply a reload's `change` (reload.ConfigChange) with `config` from now on: the
        groups added start, those removed stop once their jobs end, those changed are resized
        and have their processes replaced one at a time (Rolling), with the handler imported
        afresh."""
        self.config = config
        since = self._next_generation  # an incarnation from this one on has the new settings
        specs = {spec.name: spec for spec in config.workers}
        for name in change.removed:
            self.templates.drop_group(name)  # (before its processes: none is forked from it)
            for proc in [p for p in self.procs if p.group == name and not p.removed]:
                self._remove(proc)
        starting = []
        for name, keys in change.changed.items():
            spec = specs[name]
            group = sorted((p for p in self.procs
                            if p.group == name and not p.removed and not p.scaling_down),
                           key=lambda p: p.index)
            for proc in group:
                proc.spec = spec  # what each process's next incarnation starts with
            low, high = spec.process_range
            # An autoscaled group keeps the size its load gave it, within its new range.
            size = min(max(self.size(name), low), high) if spec.autoscaled else spec.processes
            for proc in group[size:]:
                self._remove(proc)
            for _ in range(size - len(group)):
                proc = WorkerProcess(spec, self.free_index(name))
                self.procs.append(proc)
                starting.append(proc)
            if set(keys) - RESIZE_ONLY:
                if spec.handler is None:  # a command now: no template forks its processes
                    self.templates.drop_group(name)
                self.templates.reload(spec)  # the handler imported afresh, for the new ones
                self.rolling.add(group[:size], since)
        for spec in change.added:
            added = [WorkerProcess(spec, i) for i in range(1, spec.processes + 1)]
            self.procs.extend(added)
            starting += added
            self.templates.reload(spec)  # its template, if it runs a handler
        order = {spec.name: i for i, spec in enumerate(config.workers)}
        self.procs.sort(key=lambda p: (order.get(p.group, len(order)), p.index))
        for proc in starting:
            self.spawn_worker(proc)  # (waits for its template, if one is importing)
        if self._limits_timer is None and any(s.rss_limit is not None for s in config.workers):
            self._limits_timer = self.loop.call_later(RSS_CHECK_EVERY, self._check_limits)
        self.rolling.step()

    def retire(self, proc: WorkerProcess) -> None:
        """A reload replaces or removes `proc`: its slots take no more work at once; it stops
        when its jobs have ended, or at shutdown_timeout, when they go back unspent (queued
        ones to the queue, on-demand ones to wait for another slot). One not running now
        is replaced (or removed) at once."""
        if proc.life.pid is None and proc.state is ProcessState.STARTING:
            # Its template is forking it: stopped as soon as its pid comes (learn_pid), its
            # exit then ending it for good, or replacing it.
            proc.life.retiring = True
            proc.set_state(ProcessState.STOPPING)
            return
        if proc.life.pid is None:
            self.cancel_timers(proc)
            if proc.removed:
                self._gone_for_good(proc, "not running")
            elif proc.state in EXITED:
                proc.crash_times.clear()
                proc.fatal_reason = None
                self._respawn(proc)
            return
        proc.life.retiring = True
        self.planner.close_slots(proc.life.generation)
        if proc.state is not ProcessState.RUNNING or not self.jobs.busy(proc):
            self.stop_worker(proc)
            return
        timeout = self.config.supervisor.shutdown_timeout
        if proc.removed:
            log.info("worker %s takes no more work: it stops once its running jobs have ended "
                     "(at most %g s: shutdown_timeout)", proc.name, timeout)
        else:
            log.info("worker %s takes no more work: it is replaced once its running jobs have "
                     "ended (at most %g s: shutdown_timeout)", proc.name, timeout)
        self.loop.call_later(timeout, self._retire_overdue, proc, proc.life.generation)

    def _remove(self, proc: WorkerProcess) -> None:
        proc.removed = True
        self.retire(proc)

    def _retire_overdue(self, proc: WorkerProcess, generation: int) -> None:
        if (proc.life.generation != generation or proc.state is not ProcessState.RUNNING
                or self.run.shutting_down):
            return  # it stopped meanwhile
        jobs = ", ".join(str(rj.job_id) for rj in self.jobs.on(proc))
        log.warning("worker %s still runs job %s at the end of shutdown_timeout (%g s); "
                    "stopping it, its jobs go back unspent", proc.name, jobs,
                    self.config.supervisor.shutdown_timeout)
        self.jobs.cancel_on(proc, "restart")
        self.stop_worker(proc)

    def _gone_for_good(self, proc: WorkerProcess, how: str) -> None:
        """A process a reload removed has ended: it leaves the table."""
        proc.set_state(ProcessState.STOPPED)
        proc.last_exit = how
        # A new list: a loop over the old one (read_pending, say) goes on unharmed.
        self.procs = [p for p in self.procs if p is not proc]
        log.info("worker %s stopped: %s (removed from workers.toml)", proc.name, how,
                 extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                              exit=how, restart_in=None))
        self.jobs.fail_unrunnable_requests()  # a retry had waited on it
        self.rolling.step()
