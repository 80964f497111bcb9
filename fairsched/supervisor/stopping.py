"""Stopping workers on purpose: SIGTERM then SIGKILL after a grace, a worker that closed its
pipe or stopped its jobs unasked, and the operator's `fairsched restart`. A mixin of Supervisor
(actor.py), which owns the state these methods change; spawning and reaping are workers.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

from fairsched.supervisor.process import WorkerProcess
from fairsched.supervisor.states import EXITED, ProcessState
from fairsched.supervisor.workers import EXIT_GRACE, STOP_GRACE

log = logging.getLogger("fairsched.supervisor")


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        # No group of that id: the worker is dead (SIGCHLD is on its way), or a template
        # forked it so recently that it has not made its own session yet.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class WorkerStopping:
    def expect_exit(self, proc: WorkerProcess) -> None:
        """The worker's pipe is gone: it exits now (a crash, as SIGCHLD will tell), or it is
        killed after EXIT_GRACE, having nothing more to do without its pipe."""
        if proc.pid is None or proc.kill_timer is not None or self.shutting_down:
            return
        proc.kill_timer = self.loop.call_later(EXIT_GRACE, self._kill_pipeless, proc)

    def _kill_pipeless(self, proc: WorkerProcess) -> None:
        proc.kill_timer = None
        if proc.pid is not None and proc.sock is None and not self.reap_worker(proc, wait=0):
            log.warning("worker %s closed its pipe but kept running; killing it", proc.name)
            proc.kill_reason = proc.kill_reason or "it closed its pipe but kept running"
            self.kill_worker(proc, signal.SIGKILL)

    def kill_worker(self, proc: WorkerProcess, sig: int, grace: float | None = None) -> None:
        if proc.pid is None:
            return
        proc.signalled.add(sig)
        _signal_group(proc.pid, sig)
        if sig == signal.SIGTERM:
            # One a signal has stopped (SIGSTOP, Ctrl-Z) takes SIGTERM only once continued, as
            # systemd continues what it stops: it ends in good order, not with SIGKILL.
            _signal_group(proc.pid, signal.SIGCONT)
        if grace is not None and proc.kill_timer is None:
            proc.kill_timer = self.loop.call_later(grace, self._kill_after_grace, proc, grace)

    def _kill_after_grace(self, proc: WorkerProcess, grace: float) -> None:
        proc.kill_timer = None
        if proc.pid is None or self.reap_worker(proc, wait=0):
            return  # it exited in time; its SIGCHLD had yet to be heard
        jobs = ", ".join(str(rj.job_id) for rj in self.running.values() if rj.proc is proc)
        if jobs:  # it took the SIGTERM, and waits for handlers that do not check job.cancelled()
            log.warning("worker %s still runs job %s %g s after it was told to stop; killing it",
                        proc.name, jobs, grace)
            why = f"job {jobs} did not stop within {grace:g} s"
        else:
            log.warning("worker %s still runs %g s after SIGTERM; killing it", proc.name, grace)
            why = f"it ignored SIGTERM for {grace:g} s"
        if proc.kill_reason is None:
            proc.kill_reason = why
        self.kill_worker(proc, signal.SIGKILL)

    def worker_leaving(self, proc: WorkerProcess) -> None:
        """`proc` stopped a job it was not asked to stop: it was told to stop by someone else
        (a SIGTERM), and exits once its jobs have returned. Its slots take no more work, which
        it would refuse or, exiting, fail unrun; its exit is a crash, restarted as usual."""
        if proc.state is ProcessState.RUNNING:
            self.pool.remove_worker(proc.generation)
            proc.leaving = True

    def left_idle(self, proc: WorkerProcess) -> None:
        """The last job of a worker that is leaving (worker_leaving) has ended: it exits now,
        or it is stopped STOP_GRACE later, not left holding its place with no work."""
        self.loop.call_later(STOP_GRACE, self._still_leaving, proc, proc.generation)

    def _still_leaving(self, proc: WorkerProcess, generation: int) -> None:
        if proc.generation != generation or proc.state is not ProcessState.RUNNING:
            return  # it left, or was stopped or restarted meanwhile (its slots take no work)
        log.warning("worker %s stopped its jobs as if told to stop, but still runs %g s "
                    "after the last one; stopping it", proc.name, STOP_GRACE)
        self.stop_worker(proc)

    def stop_worker(self, proc: WorkerProcess, *, kill_now: bool = False) -> None:
        """Take the worker's slots out of the index, then SIGTERM (or SIGKILL) it."""
        if proc.state is ProcessState.STOPPING and proc.kill_timer is not None and not kill_now:
            return  # told already (a second job timing out, say): its SIGKILL is on its way
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
        for spec in {p.spec.name: p.spec for p in procs}.values():
            self.reload_template(spec)
        for proc in procs:
            proc.crash_times.clear()
            proc.fatal_reason = None
            if (proc.state is ProcessState.DOWN and proc.restart_timer is None
                    and proc.group in self.warming):
                continue  # not started yet: it starts when the new template has imported
            if proc.state in EXITED:
                self._cancel_timers(proc)
                log.info("worker %s restarted by the operator", proc.name)
                self._respawn(proc)
            elif proc.state in (ProcessState.STARTING, ProcessState.RUNNING):
                log.info("worker %s restarted by the operator (stopping pid %s)", proc.name,
                         proc.pid)
                for rj in list(self.running.values()):
                    if rj.proc is proc:
                        self.cancel_job(rj, "restart")
                self.stop_worker(proc)
        return [p.name for p in procs]
