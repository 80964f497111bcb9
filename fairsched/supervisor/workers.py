"""The actor's worker processes: spawn (cold or from a template, see templates.py), reap, and
restart with backoff after a crash (stopping, killing and restarting on purpose: stopping.py).
A mixin of Supervisor (actor.py), which owns the state these methods change."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import stat
import sys
import time

from fairsched.backoff import backoff
from fairsched.logs import fields, tail_lines, unstamped
from fairsched.protocol import EXIT_CANNOT_START, WORKER_MESSAGES, FrameDecoder
from fairsched.supervisor.lease import WATCHDOG_AT
from fairsched.supervisor.process import (
    WorkerProcess,
    describe_exit,
    log_tells_why,
    oom_kill_count,
)
from fairsched.supervisor.states import ProcessState
from fairsched.supervisor.templates import launch_spec
from fairsched.worker.launch import LaunchError, launch

log = logging.getLogger("fairsched.supervisor")

STOP_GRACE = 2.0  # SIGTERM to SIGKILL for a worker that is stopped or timed out
EXIT_GRACE = 2.0  # a worker that closed its pipe gets this long to exit before SIGKILL
CRASHED_JOBS_KEPT = 1024  # jobs remembered for having crashed a worker (_job_to_blame)
# A crash after a calm period restarts at once, the next ones after 0.1 s doubling to 30 s.
RESTART_DELAY_FIRST = 0.1
RESTART_DELAY_MAX = 30.0
REAP_WAIT = 0.002  # seconds the loop waits, at most, for a worker whose pipe closed to exit
# wait4's flag (linux/wait.h) to wait for the calling thread's children only.
_WNOTHREAD = 0x20000000 if sys.platform.startswith("linux") else 0


class WorkerLifecycle:
    def _learn_pid(self, proc: WorkerProcess, pid: int) -> None:
        if proc.pid is None:
            proc.pid = pid
            self.by_pid[pid] = proc
            if self.watchdog is not None:
                self.watchdog.born(pid)
            log.info("worker %s spawned (pid %d)", proc.name, pid,
                     extra=fields(event="worker_spawned", worker=proc.name, group=proc.group, pid=pid))
        # Whether it exited before we knew whose it was: a zombie waiting for us, or reaped
        # already (early_exits). Asked of the process first: a stored exit is an earlier
        # process's that had the same pid when this one lives, or is a zombie still.
        earlier = self.early_exits.pop(pid, None)
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
        elif proc.sock is None:  # its pipe closed before the template's answer came
            self.expect_exit(proc)
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
        if not cold and proc.group in self.warming:
            proc.set_state(ProcessState.DOWN)  # its template starts it once it has imported
            return
        proc.generation = self.next_generation
        self.next_generation += 1
        proc.incarnation = f"{proc.name}.{proc.generation}.{secrets.token_hex(4)}"
        proc.signalled.clear()
        proc.stopped_for_job = None
        proc.lease_killed = proc.fenced_kill = False
        proc.write_failed = None
        proc.refused_work = proc.leaving = False
        proc.kill_reason = proc.said_fatal = proc.incompatible = None
        proc.jobs_succeeded = 0
        proc.warned_progress = proc.warned_stale = proc.warned_log_lost = False
        spec = launch_spec(proc, self.log_dir, self.config.supervisor)
        template = None if cold else self.templates.get(proc.group)
        pid = None
        try:
            sock = None
            if template is not None:
                try:
                    sock = template.begin_spawn(spec, proc.incarnation)
                    self.pending_spawns[proc.group].append((proc, proc.incarnation))
                except LaunchError as exc:  # the template's own failure; any other OSError
                    # (the worker's log cannot be opened, say) would stop a cold start too
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
        proc.oom_kills_at_start = oom_kill_count()
        proc.set_state(ProcessState.STARTING)
        if proc.hello_timer is not None:  # an earlier try's, relaunched cold since
            proc.hello_timer.cancel()
        proc.hello_timer = self.loop.call_later(proc.spec.start_timeout, self._no_hello, proc)
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
        self.fail_unrunnable_requests()

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
        elif pid in self.template_pids:
            group = self.template_pids.pop(pid)
            # What its handler's import started (a helper process, say) goes with it, as
            # what a job starts goes with its worker: the workers it forked lead their own.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            template = self.templates.get(group)
            if template is not None and template.pid == pid:
                self._drop_template(template)
        elif any(self.pending_spawns.values()):
            # A template-forked worker can exit before its pid reaches us. (Other unknown
            # children are orphans re-parented here: nothing to keep of them.)
            self.early_exits[pid] = status
            while len(self.early_exits) > 256:
                self.early_exits.pop(next(iter(self.early_exits)))

    def reap_worker(self, proc: WorkerProcess, wait: float = REAP_WAIT) -> bool:
        """Reap `proc` if it exits within `wait` seconds; whether it did.

        A dying process closes its files a moment before it can be reaped: waiting that
        moment out, once its pipe closed, tells its running jobs how it ended ("killed by
        SIGKILL, perhaps out of memory") instead of only that its pipe closed.
        """
        if proc.pid is None or self.by_pid.get(proc.pid) is not proc:
            return False
        deadline = time.monotonic() + wait
        while True:
            try:
                pid, status = os.waitpid(proc.pid, os.WNOHANG)
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
            os.killpg(proc.pid, signal.SIGKILL)
        self.read_last_words(proc)
        before_hello = proc.state is ProcessState.STARTING
        lease_ran_out = self.killed_by_watchdog(proc)
        if self.watchdog is not None:
            self.watchdog.gone(proc.pid)
        how = ("killed by the lease watchdog" if lease_ran_out
               else describe_exit(status, proc.signalled,
                                  (proc.oom_kills_at_start, oom_kill_count()),
                                  started=not before_hello))
        if proc.refused_work:
            how += " after refusing work"
        elif proc.kill_reason is not None and not lease_ran_out:
            how += f" ({proc.kill_reason})"
        elif proc.said_fatal is not None and not lease_ran_out:
            if how.endswith(" (could not start)"):
                how = how.removesuffix(")") + f": {proc.said_fatal})"
            else:
                how += f" (it said: {proc.said_fatal})"
        elif not lease_ran_out and not proc.signalled and log_tells_why(status, before_hello):
            # It died saying nothing on the pipe: its log may say why.
            how += (f"{' before its hello' if before_hello else ''} (its log ends: "
                    f"{self._last_log_line(proc)[:300]})")
        proc.last_exit = how
        jobs = [rj.job_id for rj in self.running.values() if rj.proc is proc]
        self.unregister_worker(proc, f"worker {proc.name} {how}")
        self._cancel_timers(proc)
        proc.pid = None
        self._changed()
        if self.shutting_down:
            proc.set_state(ProcessState.STOPPED)
            log.info("worker %s stopped: %s", proc.name, how,
                     extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                                  exit=how, restart_in=None))
            return
        fenced = lease_ran_out or proc.fenced_kill
        if fenced or proc.stopped_for_job:
            # This supervisor stalled or could not renew its lease, or the worker was stopped
            # under a job past its timeout or deaf to its cancel (the job failed or was
            # cancelled, not the worker): back at once, not counted as a crash, nor taken for
            # an operator's restart.
            after = "" if fenced else f" after {proc.stopped_for_job}"
            if not fenced:
                proc.last_exit = f"{how}{after}"
            log.log(logging.WARNING if fenced else logging.INFO, "worker %s %s%s; restarting",
                    proc.name, how, after,
                    extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                                 exit=how, restart_in=0.0))
            proc.set_state(ProcessState.DOWN)
            self._respawn(proc)
            return
        if proc.state is ProcessState.STOPPING and not proc.refused_work:  # an operator's restart
            proc.last_exit = f"{how} (restarted by the operator)"
            log.info("worker %s %s; restarting", proc.name, how,
                     extra=fields(event="worker_exited", worker=proc.name, group=proc.group,
                                  exit=proc.last_exit, restart_in=0.0))
            proc.set_state(ProcessState.DOWN)
            self._respawn(proc)
            return
        if proc.incompatible is not None:
            self._make_fatal(proc, f"could not start: {proc.incompatible}")
            return
        if before_hello and os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_CANNOT_START:
            why = proc.said_fatal
            if why is None:
                line = self._last_log_line(proc)  # the runtime's "... could not start: why"
                why = line.partition(' could not start: ')[2] or line
            self._make_fatal(proc, f"could not start: {why}")
            return
        blamed = self._job_to_blame(jobs)
        recent = len(proc.crash_times) if blamed is not None else proc.record_crash()
        if proc.crash_loop(recent):
            proc.set_state(ProcessState.DOWN)
            times = "once" if recent == 1 else f"{recent} times"  # max_restarts = 0
            self._make_fatal(proc, f"{how}; crashed {times} within "
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

    def _job_to_blame(self, jobs: list) -> int | str | None:
        """The first of `jobs`, those a crashed worker ran, that crashed a worker before. A job
        that crashes every worker it runs on (a PDF that makes the renderer segfault, say)
        spends its own attempts, not its group's max_restarts: two such requests would
        otherwise leave the group fatal for everyone. Remembers them all, the latest
        CRASHED_JOBS_KEPT."""
        blamed = next((job_id for job_id in jobs if job_id in self.crashed_jobs), None)
        for job_id in jobs:
            self.crashed_jobs[job_id] = None
        while len(self.crashed_jobs) > CRASHED_JOBS_KEPT:
            del self.crashed_jobs[next(iter(self.crashed_jobs))]
        return blamed

    def killed_by_watchdog(self, proc: WorkerProcess) -> bool:
        """Whether the lease watchdog killed `proc` because this supervisor stalled past its
        lease. The jobs that made it do so may be running elsewhere by now: they go back to
        the queue unspent (a release that changes nothing if another supervisor took them),
        and its on-demand jobs run again."""
        if proc.lease_killed:
            return True
        if self.watchdog is None or not self.watchdog.took(proc.pid):
            return False
        proc.lease_killed = True
        log.error("worker %s was killed by the lease watchdog: this supervisor did not renew "
                  "its lease for %g s (stalled or stopped?)", proc.name,
                  self.lease.lease * WATCHDOG_AT)
        for rj in self.running.values():
            if rj.proc is proc and rj.cancel_reason is None:
                rj.cancel_reason = "lease" if rj.request is None else "restart"
        return True

    def _respawn(self, proc: WorkerProcess) -> None:
        proc.restarts += 1
        self.counters["restarts"] += 1
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
        proc.hello_timer = None
        if proc.state is ProcessState.STARTING and proc.pid is None:
            # Its template never answered the spawn: stuck (stopped, say). Its workers start
            # cold from here on.
            template = self.templates.get(proc.group)
            log.warning("template for %s did not start worker %s within %g s (start_timeout); "
                        "killing it, its workers start cold", proc.group, proc.name,
                        proc.spec.start_timeout)
            if template is None:
                self._relaunch_cold(proc)
                return
            template.kill()
            self._drop_template(template, why_said=True)  # its pending spawns start cold
        elif proc.state is ProcessState.STARTING:
            log.warning("worker %s did not start within %g s (start_timeout); killing it",
                        proc.name, proc.spec.start_timeout)
            proc.kill_reason = f"no hello within {proc.spec.start_timeout:g} s"
            self.kill_worker(proc, signal.SIGKILL)

    def _cancel_timers(self, proc: WorkerProcess) -> None:
        for name in ("restart_timer", "kill_timer", "hello_timer"):
            timer = getattr(proc, name)
            if timer is not None:
                timer.cancel()
                setattr(proc, name, None)

    def unregister_worker(self, proc: WorkerProcess, reason: str) -> None:
        """Drop the worker's pipe and slots at once; its running jobs fail this attempt."""
        self._drop_pipe(proc)
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

    def _drop_pipe(self, proc: WorkerProcess) -> None:
        if proc.sock is not None:
            fd = proc.sock.fileno()
            self.loop.remove_reader(fd)
            self.loop.remove_writer(fd)
            proc.sock.close()
            proc.sock = None
        proc.writing = False
        self._unflushed.discard(proc)
