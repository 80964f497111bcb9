"""The actor's scheduling: cycles planned by the compiled core's candidate cache over
on-demand requests and the queued jobs fetched, the claims they make, and what the queue's
answers and notifications change. A mixin of the actor (actor.Supervisor), whose state it uses.
"""

from __future__ import annotations

import functools
import logging
import time

from fairsched.supervisor.in_flight import Claims
from fairsched.supervisor.states import ProcessState

LOSSES_BEFORE_REFETCH = 5

log = logging.getLogger("fairsched.supervisor")


class Scheduling:
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
                self.waiting.forget(t)
            return
        if not fetched and self.queue.connected and self._unknown_types():
            # A type with a free slot may have pending jobs this supervisor has not seen
            # (property 2): any of them may outscore what is known, an on-demand request
            # included. Plan once a fetch has told (one fetch: a type notified again during
            # it waits no longer); without the database, plan with what is known.
            self.queue.request_fetch()
            return
        # The placed leave the cache; the queued ones are being claimed from now on. Queued
        # jobs' times are the server's, requests' ours: the clock offset is the difference.
        reqs, req_slots, job_ids, slots = self.waiting.plan(
            self.pool, time.time(), self.weights, self.queue.clock_offset,
            queued=not self.lease.fenced, matching=self.config.matching)
        for t in stale:
            self.waiting.forget(t)  # planned in this cycle only
        for req, slot_id in zip(reqs, req_slots, strict=True):
            req.attempts += 1
            self.start_job(req, slot_id, attempt=req.attempts)
        if job_ids:
            self.queue.claim(job_ids, slots)
        if self._unknown_types():
            self.queue.request_fetch()

    def _unknown_types(self) -> bool:
        """Whether a type with a free slot has pending jobs that may be better than any
        known: none of it is cached, and its last fetch did not find it drained. (The cached
        jobs of a type are its best: queued jobs age alike, so their order never changes
        until new ones arrive, and then the type's cache is dropped.)"""
        has_queued = self.waiting.has_queued
        return any(not has_queued(t) for t in self.free_by_type())

    def free_by_type(self) -> dict[str, int]:
        if self.shutting_down or self.lease.fenced or not self.pool.n_free:
            return {}
        counts = self.pool.free_counts(len(self.type_ids))  # type ids are 0 .. types - 1
        exhausted = self.exhausted
        return {t: counts[tid] for t, tid in self.type_ids.items()
                if counts[tid] and t not in exhausted}

    def running_queued_ids(self) -> list[int]:
        ids = [rj.job_id for rj in self.running.values() if rj.request is None]
        ids.extend(self.queue.claims.job_ids)
        return ids

    def on_fetched(self, rows: list, wanted: dict[str, int]) -> None:
        # Rows the actor reserved while this fetch was in flight are still pending in the
        # table: without this they would be claimed twice, and lost the second time.
        busy = {rj.job_id for rj in self.running.values()}
        busy.update(self.queue.claims.job_ids)
        # The types it did not ask for (no free slot then) keep what was known of them.
        for t in wanted:
            self.waiting.forget(t)
        self.waiting.add_fetched(rows, busy)
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

    def on_claimed(self, claims: Claims, won: dict, contested: bool = True) -> None:
        """The answer to a claim: `won` by job id. Not `contested`: the claim never reached
        the database (it was lost with the connection), which is no loss to another
        supervisor."""
        lost = 0
        for job_id, slot_id in claims:  # in the order planned: a win ends a row of losses
            cancelled = self.waiting.end_claim(job_id)
            job = won.get(job_id)
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
                    or self.lease.fenced or not self.pool.is_busy(slot_id) or cancelled):
                # The slot's worker died or is stopping while the claim was in flight, or
                # this supervisor is giving its jobs back, or the job was cancelled: handed
                # back unstarted, a row with its cancel requested ends cancelled.
                self.queue.release(job.id, job.claim, said=functools.partial(_unstarted, job.id))
                self.pool.release(slot_id)
                continue
            self.start_job(job, slot_id, attempt=job.attempts)
        if lost:
            self.counters["claim_losses"] += lost
            self.observer.claims_lost(lost)
            if self.losses_in_row >= LOSSES_BEFORE_REFETCH:
                self.waiting.forget()
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
        self.waiting.forget(type_name)
        self.queue.due_unknown = True  # it may be a delayed job, or a retry
        if self.pool.free_count(type_id):
            self.queue.request_fetch()

    def on_poll(self) -> None:
        # A delayed job that came due, a notification lost: what is known may be stale.
        self.exhausted.clear()
        self.waiting.forget()
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
        self.waiting.forget()
        self.queue.due_unknown = True  # and the next one's time is to be learnt
        self.queue.request_fetch()

    def on_cancel_requested(self, job_id) -> None:
        try:
            job_id = int(job_id)
        except (TypeError, ValueError):
            return
        rj = self.running_by_job.get(job_id)
        if rj is None:
            # Its claim committed and the cancel came before the claim's answer, on another
            # connection: the job is cancelled as the answer comes (on_claimed).
            self.waiting.cancel_claim(job_id)
        elif rj.cancel_reason != "user":  # asked once is enough
            self.cancel_job(rj, "user")


def _unstarted(job_id: int, status: str) -> None:
    """What the table did with a claimed job handed back unstarted: silent when it went back to
    the queue, said when it ended cancelled."""
    if status == "cancelled":
        log.info("job %s cancelled before it started: the cancel came while its claim was on "
                 "its way", job_id)
