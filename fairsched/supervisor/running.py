"""The jobs component: the jobs running on slots and the on-demand requests' callers. It starts
a job on the slot the planner gave it, times it out, cancels it, and records how it ended
(queued jobs through the queue link's outbox, on-demand ones to their waiting caller)."""

from __future__ import annotations

import functools
import logging
import time

from fairsched.backoff import backoff
from fairsched.errors import path_name
from fairsched.logs import fields, quoted
from fairsched.protocol import ProtocolError, encode_run
from fairsched.store.rows import encode_result
from fairsched.supervisor.in_flight import Request, RunningJob
from fairsched.supervisor.outbox import Failure
from fairsched.supervisor.states import ProcessState

log = logging.getLogger("fairsched.supervisor")

CRASHED_JOBS_KEPT = 1024  # jobs remembered for having crashed a worker (blame)
# A failed job is tried again after retry_backoff x 2^(attempt-1) s, at most this long, with
# jitter so that jobs failed together do not come back in lockstep.
RETRY_DELAY_MAX = 300.0


def where(rj: RunningJob) -> str:
    """Where a job ran, for its log lines."""
    return f"type {rj.type}, worker {rj.proc.name}, slot {rj.slot_index}, attempt {rj.attempt}"


def job_fields(rj: RunningJob, outcome: str, duration: float, **more) -> dict:
    return fields(event="job_finished", job_id=rj.job_id, type=rj.type, worker=rj.proc.name,
                  group=rj.proc.group, slot=rj.slot_index, attempt=rj.attempt, outcome=outcome,
                  duration=round(duration, 6), on_demand=rj.on_demand, **more)


class Jobs:
    """Owns the running jobs (by slot and by job id), the jobs remembered for crashing a
    worker and the request numbers. Wired by the actor to the planner, the queue link, the
    lease and the workers (connect)."""

    def __init__(self, config, loop, run, observer, changed):
        self.config = config
        self.loop = loop
        self.run = run  # RunState: the actor's, read only
        self.counters = {"succeeded": 0, "failed": 0, "retried": 0, "cancelled": 0,
                         "returned": 0, "unrecorded": 0}  # jobs by outcome, for ps
        self.observer = observer
        self._changed = changed  # wakes a shutdown waiting for jobs to end
        self.running: dict[int, RunningJob] = {}  # by pool slot id
        self.running_by_job: dict[int | str, RunningJob] = {}
        self._crashed: dict[int | str, None] = {}  # jobs that crashed a worker, oldest first
        self._next_request = 1

    def connect(self, planner, queue, lease, workers) -> None:
        self.planner, self.queue, self.lease, self.workers = planner, queue, lease, workers

    def reconfigure(self, config) -> None:
        """A reload: requests submitted from now on take the groups' max_attempts and types
        from `config`; those waiting on a type no group runs any more are answered."""
        self.config = config
        self.fail_unrunnable_requests()

    # -- what others ask -------------------------------------------------------------------------

    def on(self, proc) -> list[RunningJob]:
        """The jobs running on `proc`."""
        return [rj for rj in self.running.values() if rj.proc is proc]

    def busy(self, proc) -> bool:
        return any(rj.proc is proc for rj in self.running.values())

    def on_slot(self, slot_id: int) -> RunningJob | None:
        return self.running.get(slot_id)

    def running_ids(self) -> list:
        return [rj.job_id for rj in self.running.values()]

    def running_queued(self) -> list[tuple[int, int]]:
        """(job id, claim) of the queued jobs running here: the queue link's reconcile."""
        return [(rj.job_id, rj.claim) for rj in self.running.values() if rj.request is None]

    def blame(self, jobs: list) -> int | str | None:
        """The first of `jobs`, those a crashed worker ran, that crashed a worker before. A job
        that crashes every worker it runs on (a PDF that makes the renderer segfault, say)
        spends its own attempts, not its group's max_restarts: two such requests would
        otherwise leave the group fatal for everyone. Remembers them all, the latest
        CRASHED_JOBS_KEPT."""
        blamed = next((job_id for job_id in jobs if job_id in self._crashed), None)
        for job_id in jobs:
            self._crashed[job_id] = None
        while len(self._crashed) > CRASHED_JOBS_KEPT:
            del self._crashed[next(iter(self._crashed))]
        return blamed

    # -- starting and stopping jobs ------------------------------------------------------------

    def start_request(self, req: Request, slot_id: int) -> None:
        """Start an on-demand request's next attempt on the slot the planner gave it."""
        req.attempts += 1
        self.start_job(req, slot_id, attempt=req.attempts)

    def start_job(self, entry, slot_id: int, attempt: int) -> None:
        proc, index = self.planner.owner(slot_id)
        if isinstance(entry, Request):
            rj = RunningJob(job_id=entry.job_id, type=entry.type, priority=entry.priority,
                            payload_json=entry.payload_json, attempt=attempt,
                            max_attempts=entry.max_attempts,
                            proc=proc, slot_id=slot_id, slot_index=index,
                            eligible_at=entry.eligible_at, request=entry)
        else:
            rj = RunningJob(job_id=entry.id, type=entry.type, priority=entry.priority,
                            payload_json=entry.payload_json or "null", attempt=attempt,
                            max_attempts=entry.max_attempts or proc.spec.max_attempts,
                            proc=proc, slot_id=slot_id, slot_index=index,
                            eligible_at=entry.eligible_at - self.queue.clock_offset,
                            claim=entry.claim)
        self.running[slot_id] = rj
        self.running_by_job[rj.job_id] = rj
        self.workers.job_started(proc, queued=rj.request is None)
        if proc.spec.timeout is not None:
            rj.timer = self.loop.call_later(proc.spec.timeout, self._on_job_timeout, rj)
        waited = max(0.0, time.time() - rj.eligible_at)
        self.observer.job_started(rj.type, waited)
        if log.isEnabledFor(logging.INFO):  # the hot path: build the fields only when shown
            log.info("job %s started: type %s, worker %s, slot %d, attempt %d/%d, waited %.3f s",
                     rj.job_id, rj.type, proc.name, index, attempt, rj.max_attempts, waited,
                     extra=fields(event="job_started", job_id=rj.job_id, type=rj.type,
                                  worker=proc.name, group=proc.group, slot=index, attempt=attempt,
                                  max_attempts=rj.max_attempts, waited=round(waited, 6),
                                  on_demand=rj.on_demand))
        try:
            frame = encode_run(proc.life.name, index, rj.job_id, rj.type, rj.priority, attempt,
                               rj.on_demand, rj.payload_json, rj.claim)
        except ProtocolError as exc:  # stored by hand (enqueue refuses it): it can never run
            self.finish_job(rj, "failed", error=f"the payload cannot be sent to a worker: {exc}",
                            permanent=True)
            return
        self.workers.send(proc, frame, defer=True)  # the caller flushes the batch

    def _on_job_timeout(self, rj: RunningJob) -> None:
        rj.timer = None
        self.workers.read_pending([rj.proc])  # late after a stall: its result may be waiting there
        if self.running.get(rj.slot_id) is not rj:
            return
        rj.failure = f"timed out after {rj.proc.spec.timeout:g} s"
        if rj.proc.spec.on_timeout == "fail":
            rj.failure += ' (on_timeout = "fail": not tried again)'
            rj.failure_final = True
        log.warning("job %s on worker %s %s; stopping the worker", rj.job_id, rj.proc.name,
                    rj.failure)
        self._stop_worker_for(rj, "its job timed out")

    def _on_cancel_overdue(self, rj: RunningJob) -> None:
        """`fairsched cancel` asked the job to stop cancel_grace seconds ago, and it has not:
        its handler does not check job.cancelled() (or not often enough). The job ends
        cancelled when its worker is gone."""
        rj.cancel_timer = None
        self.workers.read_pending([rj.proc])  # its answer may be waiting there
        if self.running.get(rj.slot_id) is not rj or self.run.shutting_down:
            return
        grace = rj.proc.spec.cancel_grace
        log.warning("job %s on worker %s did not stop within %g s of its cancel (cancel_grace);"
                    " stopping the worker", rj.job_id, rj.proc.name, grace)
        self._stop_worker_for(rj, "its job did not stop when cancelled", kill_reason=(
            f"job {rj.job_id} did not stop within cancel_grace, {grace:g} s after its cancel"))

    def _stop_worker_for(self, rj: RunningJob, why: str, kill_reason: str | None = None) -> None:
        """Stop the worker of `rj` for what `rj` did (SIGTERM, then SIGKILL): not a crash, and
        the jobs beside it go back to the queue unspent."""
        self.spare_jobs_beside(rj)
        self.workers.stop_for_job(rj.proc, why, kill_reason)  # its free slots take no more work

    def spare_jobs_beside(self, rj: RunningJob) -> None:
        """The worker of `rj` is stopped for what `rj` did: its other jobs go back to the queue
        (or run again, on demand) with their attempt unspent, as after a restart."""
        for other in self.running.values():
            if (other.proc is rj.proc and other is not rj and other.cancel_reason is None
                    and other.failure is None):
                other.cancel_reason = "restart"

    def cancel_requested(self, job_id) -> None:
        """`fairsched cancel` (or the table's cancel flag) for a queued job."""
        try:
            job_id = int(job_id)
        except (TypeError, ValueError):
            return
        rj = self.running_by_job.get(job_id)
        if rj is None:
            # Its claim committed and the cancel came before the claim's answer, on another
            # connection: the job is cancelled as the answer comes (Planner.claimed).
            self.planner.cancel_claim(job_id)
        elif rj.cancel_reason != "user":  # asked once is enough
            self.cancel_job(rj, "user")

    def queued(self, only: frozenset | None = None) -> list[RunningJob]:
        """The queued jobs running here (those of `only`, when given)."""
        return [rj for rj in self.running.values()
                if rj.request is None and (only is None or rj.job_id in only)]

    def given_back_on(self) -> set:
        """The workers still running a job given back for the lease."""
        return {rj.proc for rj in self.running.values() if rj.cancel_reason == "lease"}

    def watchdog_killed(self, proc) -> None:
        """The lease watchdog killed `proc`: its jobs may be running elsewhere by now. Its
        queued ones go back to the queue unspent (a release that changes nothing if another
        supervisor took them), its on-demand ones run again."""
        for rj in self.on(proc):
            if rj.cancel_reason is None:
                rj.cancel_reason = "lease" if rj.request is None else "restart"

    def rerun_on_demand(self, proc) -> None:
        """`proc` is killed for a job of the expiring lease: its on-demand jobs run again."""
        for rj in self.on(proc):
            if rj.request is not None:
                rj.cancel_reason = "restart"

    def cancel_all(self, reason: str) -> None:
        for rj in list(self.running.values()):
            self.cancel_job(rj, reason)

    def cancel_on(self, proc, reason: str) -> None:
        for rj in self.on(proc):
            self.cancel_job(rj, reason)

    def drop_requests(self, error: str) -> None:
        """Answer every waiting on-demand request with `error` (shutting down)."""
        for req in self.planner.waiting_requests():
            self.finish_request(req, {"event": "error", "job_id": req.job_id, "error": error})
        self.planner.clear_waiting()

    def crashed_with(self, proc, slot_ids, reason: str) -> None:
        """The worker is gone: the jobs on its slots fail this attempt."""
        for sid in slot_ids:
            rj = self.running.get(sid)
            if rj is not None:
                self.finish_job(rj, "crashed", error=rj.failure or reason)

    def cancel_job(self, rj: RunningJob, reason: str) -> None:
        if rj.cancel_reason is None or reason == "user":
            rj.cancel_reason = reason
        if reason == "user" and rj.cancel_timer is None:
            rj.cancel_timer = self.loop.call_later(rj.proc.spec.cancel_grace,
                                                   self._on_cancel_overdue, rj)
        self.workers.send(rj.proc, {"t": "cancel", "incarnation": rj.proc.life.name,
                                    "slot": rj.slot_index, "job_id": rj.job_id})

    def finish_job(self, rj: RunningJob, outcome: str, *, result=None, error: str | None = None,
                   permanent: bool = False, recorded: bool = False) -> None:
        """`recorded`: the worker marked the job succeeded itself, in the transaction of the
        handler's job.transaction(); its outcome is not written again."""
        if self.running.get(rj.slot_id) is not rj:
            return
        del self.running[rj.slot_id]
        self.running_by_job.pop(rj.job_id, None)
        self.workers.job_ended(rj.proc, queued=rj.request is None,
                               succeeded=outcome == "succeeded", fenced=self.lease.fenced)
        for timer in (rj.timer, rj.cancel_timer):
            if timer is not None:
                timer.cancel()
        if rj.failure_final and outcome != "succeeded":
            permanent = True  # it ran past its timeout, and on_timeout = "fail"
            if error and error != rj.failure:
                error = f"{rj.failure}; then: {error}"
        if outcome == "stopped" and rj.cancel_reason is None and rj.failure is None:
            self.workers.worker_leaving(rj.proc)  # stopped unasked: told to stop by another
        self.planner.release(rj.slot_id)
        if (rj.proc.life.leaving and rj.proc.state is ProcessState.RUNNING
                and not self.busy(rj.proc)):
            self.workers.left_idle(rj.proc)
        self._changed()
        duration = time.monotonic() - rj.started_mono
        if outcome == "stopped" and error is None:
            # The handler saw job.cancelled() and returned early: not a success. Asked by a
            # shutdown, restart or lost lease, the job goes back to the queue; otherwise
            # (timeout, a SIGTERM from elsewhere) the attempt failed.
            error = rj.failure or (
                f"stopped early: worker {rj.proc.name} was told to stop"
                if rj.cancel_reason is not None or rj.proc.state is ProcessState.STOPPING else
                f"stopped early: worker {rj.proc.name} stopped it unasked by this supervisor "
                f"(a SIGTERM from elsewhere?)")
        if rj.request is not None:
            if rj.request.hold is not None:  # [limits]: its place is free again
                self.queue.release_hold(rj.request.hold)
                rj.request.hold = None
            self._finish_on_demand(rj, outcome, result, error, permanent, duration)
        else:
            self._finish_queued(rj, outcome, result, error, permanent, duration, recorded)
        if outcome != "crashed":  # it ran to its end on a worker still there
            self.workers.ran_job(rj.proc)
        self.planner.schedule()

    def _finish_queued(self, rj, outcome, result, error, permanent, duration,
                       recorded=False) -> None:
        if recorded:  # the job's own transaction marked it succeeded, fenced by its claim
            self._record(rj, "succeeded", duration)
            if log.isEnabledFor(logging.INFO):
                log.info("job %s succeeded: %s, %.3f s (recorded in its transaction)", rj.job_id,
                         where(rj), duration, extra=job_fields(rj, "succeeded", duration))
            return
        if outcome == "succeeded":
            try:
                text = encode_result(result)
            except ValueError as exc:  # no JSON (NaN): a worker's frame never holds one
                outcome, error = "failed", f"the result could not be stored: {exc}"
                permanent = True
        # A job that did its work succeeded, whatever cancel came too late to stop it.
        if outcome == "succeeded":
            self._record(rj, "succeeded", duration)
            self.queue.complete(rj.job_id, rj.claim, text, counted=(rj.type, "succeeded"))
            if log.isEnabledFor(logging.INFO):
                log.info("job %s succeeded: %s, %.3f s", rj.job_id, where(rj), duration,
                         extra=job_fields(rj, "succeeded", duration))
        elif rj.cancel_reason == "user":
            self._record(rj, "cancelled", duration)
            self.queue.cancel_finish(rj.job_id, rj.claim)
            log.info("job %s cancelled: %s, %.3f s", rj.job_id, where(rj), duration,
                     extra=job_fields(rj, "cancelled", duration))
        elif rj.failure is None and (outcome == "refused" or (
                outcome != "failed" and rj.cancel_reason in ("shutdown", "restart", "lease"))):
            # Stopped or killed for a reason not the job's (or refused): back to the queue, its
            # attempt unspent. A job that failed on its own meanwhile (a handler's error, a
            # PermanentError) or ran past its timeout (rj.failure) has spent it all the same.
            # Said and counted once the table has taken it back: with the lease in doubt another
            # supervisor may run it by now, and a cancel that reached the table first ends it.
            self.queue.release(rj.job_id, rj.claim,
                               said=functools.partial(self._handed_back, rj, duration))
        else:
            last = permanent or rj.attempt >= rj.max_attempts
            delay = 0.0 if last else backoff(rj.attempt - 1, rj.proc.spec.retry_backoff,
                                             RETRY_DELAY_MAX, jitter="equal")
            self._record(rj, "failed" if last else "retried", duration)
            said = quoted(error)
            if last:
                log.warning("job %s failed for good: %s, %.3f s: %s", rj.job_id, where(rj),
                            duration, said, extra=job_fields(rj, "failed", duration, error=said))
            else:
                log.warning("job %s failed: %s, %.3f s: %s; retry in %.1f s", rj.job_id, where(rj),
                            duration, said, delay,
                            extra=job_fields(rj, "retried", duration, error=said,
                                             retry_in=round(delay, 3)))
            self.queue.fail(Failure(rj.job_id, rj.claim, error or outcome, permanent, delay),
                            counted=(rj.type, "failed" if last else "retried"))

    def _handed_back(self, rj: RunningJob, duration: float, status: str) -> None:
        if status == "cancelled":
            self._record(rj, "cancelled", duration)
            log.info("job %s cancelled: %s, %.3f s (its cancel reached the job table as it was "
                     "being returned to the queue (%s))", rj.job_id, where(rj), duration,
                     rj.cancel_reason or "refused", extra=job_fields(rj, "cancelled", duration))
        else:
            self._record(rj, "returned", duration)
            log.info("job %s returned to the queue (%s): %s", rj.job_id,
                     rj.cancel_reason or "refused", where(rj),
                     extra=job_fields(rj, "returned", duration))

    def _finish_on_demand(self, rj, outcome, result, error, permanent, duration) -> None:
        req = rj.request
        if (outcome == "succeeded" and rj.cancel_reason in (None, "restart", "shutdown")
                and not req.cancelled):  # its caller still waits, through a shutdown too
            self._record(rj, "succeeded", duration)
            if log.isEnabledFor(logging.INFO):
                log.info("job %s succeeded: %s, %.3f s", rj.job_id, where(rj), duration,
                         extra=job_fields(rj, "succeeded", duration))
            self.finish_request(req, {"event": "result", "job_id": req.job_id, "result": result})
            return
        timed_out_anyway = rj.cancel_reason == "restart" and rj.failure is not None
        # A handler's own error counts, whatever stop was asked of it meanwhile.
        interrupted = rj.cancel_reason is not None and not timed_out_anyway and outcome != "failed"
        if outcome == "succeeded" and req.cancelled:  # it ran to its end all the same
            self._record(rj, "succeeded", duration)
            log.info("job %s succeeded after its caller left (the result is dropped): %s, "
                     "%.3f s", rj.job_id, where(rj), duration,
                     extra=job_fields(rj, "succeeded", duration))
            return
        if interrupted or req.cancelled:
            if rj.cancel_reason == "restart" and not req.cancelled and not self.run.shutting_down:
                self._record(rj, "returned", duration)
                self.planner.wait(req)  # not the job's fault: run it elsewhere
                req.attempts -= 1
                log.info("job %s runs again (its worker restarted): %s", rj.job_id, where(rj),
                         extra=job_fields(rj, "returned", duration))
                return
            self._record(rj, "cancelled", duration)
            reason = ("the supervisor is shutting down" if self.run.shutting_down else
                      {"restart": "the worker was restarted"}.get(rj.cancel_reason, "cancelled"))
            log.info("job %s cancelled (%s): %s, %.3f s", rj.job_id,
                     "its caller left" if req.cancelled else reason, where(rj), duration,
                     extra=job_fields(rj, "cancelled", duration))
            self.finish_request(req, {"event": "error", "job_id": req.job_id, "error": reason})
            return
        if outcome == "refused":  # not the job's fault, as for a queued job: its attempt unspent
            self._record(rj, "returned", duration)
            req.attempts -= 1
            self.planner.wait(req)
            log.info("job %s runs again (refused by its worker): %s", rj.job_id, where(rj),
                     extra=job_fields(rj, "returned", duration))
            return
        said = quoted(error)
        if permanent or req.attempts >= req.max_attempts or self.run.shutting_down:
            self._record(rj, "failed", duration)
            log.warning("job %s failed for good: %s, %.3f s: %s", rj.job_id, where(rj), duration,
                        said, extra=job_fields(rj, "failed", duration, error=said))
            self.finish_request(req, {"event": "error", "job_id": req.job_id, "error": error,
                                      "attempts": req.attempts})
            return
        self._record(rj, "retried", duration)
        log.warning("job %s failed: %s, %.3f s: %s; retrying now", rj.job_id, where(rj), duration,
                    said, extra=job_fields(rj, "retried", duration, error=said, retry_in=0.0))
        if req.notify is not None:
            req.notify({"event": "retry", "job_id": req.job_id, "error": error,
                        "attempt": req.attempts})
        req.eligible_at = time.time()  # a retry's age counts from the retry, as a queued one's
        self.planner.wait(req)

    def _record(self, rj: RunningJob, outcome: str, duration: float) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + 1
        self.observer.job_finished(rj.type, outcome, duration)

    def progress(self, rj: RunningJob, fraction: float | None, message: str) -> None:
        """The worker said how far `rj` has come: shown in ps, and sent to a waiting caller."""
        rj.progress, rj.message = fraction, message
        if rj.request is not None:
            rj.request.notify({"event": "progress", "job_id": rj.job_id,
                               "fraction": fraction, "message": message})

    def outcome_unrecorded(self, job_type: str, outcome: str) -> None:
        """An outcome counted by _record that the job table refused: the job is no longer this
        supervisor's (its lease expired while the job ran), and whoever took it counts its own."""
        self.counters["unrecorded"] = self.counters.get("unrecorded", 0) + 1
        self.observer.job_unrecorded(job_type, outcome)

    def finish_request(self, req: Request, event: dict) -> None:
        if req.done:
            return
        req.done = True
        self.planner.stop_waiting(req)
        req.notify(event)

    # -- on-demand requests ---------------------------------------------------------------------

    def submit_on_demand(self, type_name: str, payload_json: str, priority: int,
                         notify) -> Request | None:
        """Accept an on-demand request (its payload as protocol.payload_json); None when no
        configured worker supports the type."""
        tid = self.planner.type_ids.get(type_name)
        if tid is None or type_name not in self.config.types:  # (or no more: a reload)
            return None
        attempts = max(w.max_attempts for w in self.config.workers if type_name in w.types)
        req = Request(number=self._next_request, type=type_name, type_id=tid,
                      payload_json=payload_json, priority=priority, max_attempts=attempts,
                      notify=notify)
        self._next_request += 1
        if self.run.shutting_down:
            self.finish_request(req, {"event": "error", "job_id": req.job_id,
                                      "error": "the supervisor is shutting down"})
            return req
        no_worker = self.no_live_worker(type_name)
        if no_worker is not None:
            self.finish_request(req, {"event": "error", "job_id": req.job_id,
                                      "error": no_worker})
            return req
        self.planner.wait(req)
        self.planner.schedule()
        return req

    def no_live_worker(self, type_name: str) -> str | None:
        """Why no worker will ever run a `type_name` job until an operator acts (all of them
        fatal, or its groups left workers.toml in a reload), or None."""
        if type_name not in self.config.types:
            return (f"no worker group runs {type_name!r} jobs any more: "
                    f"{path_name(self.config.path)} was reloaded without it")
        procs = [p for p in self.workers.procs if type_name in p.spec.types]
        if any(p.state is not ProcessState.FATAL for p in procs):
            return None
        names = ", ".join(p.name for p in procs)
        # The reason after a colon, not in parentheses: it may hold some of its own.
        return (f"no worker can run {type_name!r} jobs: {names} "
                f"{'is' if len(procs) == 1 else 'are'} fatal: {procs[0].fatal_reason}; "
                f"see `fairsched ps`, and `fairsched restart {procs[0].group}` once fixed")

    def fail_unrunnable_requests(self) -> None:
        """Answer the waiting on-demand requests no worker is left to run (all fatal, or
        their type gone in a reload)."""
        for req in self.planner.waiting_requests():
            no_worker = self.no_live_worker(req.type)
            if no_worker is not None:
                self.finish_request(req, {"event": "error", "job_id": req.job_id,
                                          "error": no_worker})

    def abandon_request(self, req: Request) -> str:
        """The caller gave up (timeout or disconnect): drop it, or cancel it where it runs;
        returns what became of it, for the caller."""
        req.cancelled = True
        if self.planner.stop_waiting(req):
            req.done = True
            what = "withdrawn before its next attempt" if req.attempts else "withdrawn before it started"
            log.info("job %s %s: its caller gave up (a timeout, or it left)", req.job_id, what)
            return what
        rj = self.running_by_job.get(req.job_id)
        if rj is None:
            return "it had just finished"
        self.cancel_job(rj, "caller")
        return (f"its handler on worker {rj.proc.name} was asked to stop (one that does not "
                "check job.cancelled() runs to its end)")
