"""The planner: the slot pool, the jobs waiting for a slot (the compiled core's candidate
cache), and the cycles that place them. It knows which types may have jobs it has not seen
(notified, or never fetched) and asks the queue link to fetch or claim; a cycle's placements
go to the jobs component, which starts them."""

from __future__ import annotations

import functools
import logging
import time

from fairsched import core
from fairsched.supervisor.in_flight import Claims
from fairsched.supervisor.states import ProcessState
from fairsched.supervisor.waiting import WaitingJobs

LOSSES_BEFORE_REFETCH = 5
# [limits]: a type found at its limit is planned again when a job of it ends somewhere (its
# completion notifies) or after this many seconds, whichever comes first (a job that fails for
# good or is cancelled frees its place without a notification).
LIMIT_RECHECK = 1.0

log = logging.getLogger("fairsched.supervisor")


class Planner:
    """Owns the slot pool and which worker each slot is on, the waiting jobs and what is known
    of the queue by type. Wired by the actor to the queue link, the lease, the jobs and the
    workers (connect)."""

    def __init__(self, config, loop, run, observer):
        self.config = config
        self.loop = loop
        self.run = run  # RunState: the actor's, read only
        self.claim_losses = 0  # claims lost to other supervisors, for ps
        self.observer = observer
        self.weights = config.scoring
        self.type_ids = {t: i for i, t in enumerate(sorted(config.types))}
        self.pool = core.SlotPool()
        self._slot_owner: dict[int, tuple[object, int]] = {}  # slot id: (process, index)
        self._next_slot_id = 1
        # On-demand requests and fetched queued candidates waiting for a slot, and the queued
        # jobs whose claim is on its way.
        self.waiting = WaitingJobs(self.type_ids)
        self._exhausted: set[str] = set()  # types whose last fetch came back short
        self._notified: set[str] = set()  # types with new jobs notified since the last fetch began
        self._fetched = False  # a fetch answered since the last cycle
        self._stale_types: set[str] = set()  # types notified while that fetch ran
        self._losses_in_row = 0
        self._schedule_pending = False
        self._wake_handle = None
        self._at_limit: dict[str, object] = {}  # [limits]: type -> its recheck timer

    def connect(self, queue, lease, jobs, workers) -> None:
        self.queue, self.lease, self.jobs, self.workers = queue, lease, jobs, workers

    def reconfigure(self, config) -> None:
        """A reload: its [scoring] from the next cycle, and ids for the types new to it. The
        ids of known types never change (the pool and the waiting jobs hold them): new ones
        are appended, those no group runs any more keep theirs, with no slot."""
        self.config = config
        self.weights = config.scoring
        for t in sorted(config.types - self.type_ids.keys()):
            self.type_ids[t] = len(self.type_ids)  # the same dict WaitingJobs reads
        self.schedule()

    # -- slots ---------------------------------------------------------------------------------

    def add_slots(self, proc, generation: int, types, count: int) -> list[int]:
        """Put `count` slots of a worker that said hello in the pool; their ids, by index."""
        type_ids = [self.type_ids[t] for t in types]
        slot_ids = []
        for index in range(count):
            sid = self._next_slot_id
            self._next_slot_id += 1
            self.pool.add_slot(sid, generation, type_ids)
            slot_ids.append(sid)
            self._slot_owner[sid] = (proc, index)
        return slot_ids

    def close_slots(self, generation: int) -> None:
        """The worker's slots take no more work (it is stopping, leaving or gone); those busy
        keep their ids until their jobs end."""
        self.pool.remove_worker(generation)

    def drop_slots(self, slot_ids) -> None:
        """The worker is gone: its slots are no one's."""
        for sid in slot_ids:
            self._slot_owner.pop(sid, None)

    def any_busy(self, slot_ids) -> bool:
        """Whether one of these slots runs a job or is reserved for one being claimed."""
        return any(self.pool.is_busy(sid) for sid in slot_ids)

    def full_types(self) -> set[str]:
        """The types with no free slot (no worker running them takes more work now)."""
        counts = self.pool.free_counts(len(self.type_ids))
        return {t for t, tid in self.type_ids.items() if not counts[tid]}

    def owner(self, slot_id: int):
        """(process, slot index) of a slot, or None once its worker is gone."""
        return self._slot_owner.get(slot_id)

    def release(self, slot_id: int) -> None:
        self.pool.release(slot_id)  # a no-op when the worker (and its slots) is gone

    def slot_state(self, slot_id: int) -> tuple[bool, bool]:
        """(in the pool, busy) for `ps`."""
        return self.pool.has_slot(slot_id), self.pool.is_busy(slot_id)

    # -- on-demand requests waiting ------------------------------------------------------------

    def wait(self, req) -> None:
        """An on-demand request waits for a slot (again: a retry's eligible_at is read anew)."""
        self.waiting.add_request(req)

    def stop_waiting(self, req) -> bool:
        """It waits no more; False when it was not waiting."""
        return self.waiting.drop_request(req)

    def waiting_requests(self) -> list:
        """The requests waiting for a slot, oldest first."""
        return self.waiting.requests()

    @property
    def n_waiting_requests(self) -> int:
        return self.waiting.n_requests

    def clear_waiting(self) -> None:
        """Shutting down: nothing waits any more (the claims on their way stay)."""
        self.waiting.clear()

    def cancel_claim(self, job_id: int) -> None:
        """A cancel for a job whose claim is on its way: it ends cancelled when the claim's
        answer comes."""
        self.waiting.cancel_claim(job_id)

    # -- cycles --------------------------------------------------------------------------------

    def schedule(self) -> None:
        """Ask for a scheduling cycle; every request made in one loop pass folds into one cycle."""
        if not self._schedule_pending:
            self._schedule_pending = True
            self.loop.call_soon(self._run_schedule)

    def _run_schedule(self) -> None:
        self._schedule_pending = False
        self._cycle()
        self.workers.flush_all()

    def _cycle(self) -> None:
        fetched, self._fetched = self._fetched, False
        stale, self._stale_types = self._stale_types, set()
        if self.run.shutting_down or self.pool.n_free == 0:
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
            queued=not self.lease.fenced, matching=self.config.matching,
            half_life=self.config.usage_half_life)
        for t in stale:
            self.waiting.forget(t)  # planned in this cycle only
        limits = self.config.limits
        for req, slot_id in zip(reqs, req_slots, strict=True):
            if req.type in limits:
                self.queue.hold(req, slot_id)  # its slot stays reserved until the answer
            else:
                self.jobs.start_request(req, slot_id)
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
        """Free slots by type, those of types known drained left out: what a fetch asks for."""
        if self.run.shutting_down or self.lease.fenced or not self.pool.n_free:
            return {}
        counts = self.pool.free_counts(len(self.type_ids))  # type ids are 0 .. types - 1
        exhausted, at_limit = self._exhausted, self._at_limit
        return {t: counts[tid] for t, tid in self.type_ids.items()
                if counts[tid] and t not in exhausted and t not in at_limit}

    # -- what the queue link tells -------------------------------------------------------------

    def fetch_began(self) -> None:
        self._notified.clear()  # rows notified before this fetch are in its answer

    def fetched(self, rows: list, wanted: dict[str, int]) -> None:
        # Rows the actor reserved while this fetch was in flight are still pending in the
        # table: without this they would be claimed twice, and lost the second time.
        busy = set(self.jobs.running_ids())
        busy.update(self.queue.claims.job_ids)
        # The types it did not ask for (no free slot then) keep what was known of them.
        for t in wanted:
            self.waiting.forget(t)
        self.waiting.add_fetched(rows, busy, {t: 2 * free for t, free in wanted.items()})
        # A type notified while the fetch ran may have a better job than it found: the next
        # cycle takes what it found all the same (or a stream of new jobs would starve the
        # type of cycles), and forgets the rest.
        self._stale_types = self._notified & wanted.keys()
        counts: dict[str, int] = {}
        for qj in rows:
            counts[qj.type] = counts.get(qj.type, 0) + 1
        for t, free in wanted.items():
            # Jobs notified while it ran may have come too late for it: not drained yet.
            if counts.get(t, 0) < 2 * free and t not in self._notified:
                self._exhausted.add(t)
            else:
                self._exhausted.discard(t)
        self._fetched = True
        self.schedule()

    def claimed(self, claims: Claims, won: dict, contested: bool = True,
                refused: dict | None = None) -> None:
        """The answer to a claim: `won` by job id. Not `contested`: the claim never reached
        the database (it was lost with the connection), which is no loss to another
        supervisor. `refused`: the jobs not claimed because their type was at its [limits]
        limit (by id, their type), no loss either: the type waits for a place."""
        lost = 0
        for t in set((refused or {}).values()):
            self.type_at_limit(t)
        for job_id, slot_id in claims:  # in the order planned: a win ends a row of losses
            cancelled = self.waiting.end_claim(job_id)
            job = won.get(job_id)
            owner = self._slot_owner.get(slot_id)
            if job is None and refused and job_id in refused:
                self.pool.release(slot_id)
                continue
            if job is None:
                if contested:
                    lost += 1
                    self._losses_in_row += 1
                self.pool.release(slot_id)
                continue
            self._losses_in_row = 0
            proc = owner[0] if owner else None
            if (proc is None or proc.state is not ProcessState.RUNNING or self.run.shutting_down
                    or self.lease.fenced or not self.pool.is_busy(slot_id) or cancelled):
                # The slot's worker died or is stopping while the claim was in flight, or
                # this supervisor is giving its jobs back, or the job was cancelled: handed
                # back unstarted, a row with its cancel requested ends cancelled.
                self.queue.release(job.id, job.claim, said=functools.partial(_unstarted, job.id))
                self.pool.release(slot_id)
                continue
            self.jobs.start_job(job, slot_id, attempt=job.attempts)
        if lost:
            self.claim_losses += lost
            self.observer.claims_lost(lost)
            if self._losses_in_row >= LOSSES_BEFORE_REFETCH:
                self.waiting.forget()
                self._losses_in_row = 0
            self._exhausted.clear()
        self.workers.flush_all()
        self.schedule()

    def held(self, req, slot_id: int, hold: int | None) -> None:
        """[limits]: the answer to an on-demand request's hold: run it on its slot with its
        place taken, or, at the limit (or with its slot gone meanwhile), wait again."""
        owner = self._slot_owner.get(slot_id)
        proc = owner[0] if owner else None
        usable = (proc is not None and proc.state is ProcessState.RUNNING
                  and not self.run.shutting_down and self.pool.is_busy(slot_id))
        if hold is not None and usable and not req.done:
            req.hold = hold
            self.jobs.start_request(req, slot_id)
            self.workers.flush_all()
            return
        if hold is not None:
            self.queue.release_hold(hold)
        self.pool.release(slot_id)
        if hold is None:
            self.type_at_limit(req.type)
        if not req.done:
            self.wait(req)
        self.schedule()

    def type_at_limit(self, type_name: str) -> None:
        """[limits]: the type has no place left across the supervisors; its jobs wait (none
        cached, none fetched) until a job of it ends or LIMIT_RECHECK passes."""
        handle = self._at_limit.pop(type_name, None)
        if handle is not None:
            handle.cancel()
        self._at_limit[type_name] = self.loop.call_later(LIMIT_RECHECK, self._limit_recheck,
                                                         type_name)
        self.waiting.forget(type_name)

    def _limit_recheck(self, type_name: str) -> None:
        if self._at_limit.pop(type_name, None) is not None:
            self._exhausted.discard(type_name)
            self.queue.request_fetch()
            self.schedule()

    def types_at_limit(self) -> list[str]:
        """The limited types found at their limit, waiting for a place (for ps)."""
        return sorted(self._at_limit)

    def jobs_notified(self, type_name: str) -> None:
        handle = self._at_limit.pop(type_name, None)  # a job of it ended: a place may be free
        if handle is not None:
            handle.cancel()
        type_id = self.type_ids.get(type_name)
        if type_id is None:  # a type only other supervisors on this database run
            return
        self._notified.add(type_name)
        self._exhausted.discard(type_name)
        self.waiting.forget(type_name)
        if self.pool.free_count(type_id):
            self.queue.request_fetch()

    def forget_queued(self) -> None:
        """What is known of the queue may be stale (a poll, a lost notification, a lease in
        doubt): look afresh."""
        self._exhausted.clear()
        self.waiting.forget()

    def forget_fetched(self) -> None:
        """Drop the queued candidates fetched (the lease is in doubt: none is claimed)."""
        self.waiting.forget()

    def wake_in(self, delay: float) -> None:
        """The next delayed job comes due in `delay` seconds."""
        delay = max(0.0, delay)
        if self._wake_handle is not None:
            if self._wake_handle.when() <= self.loop.time() + delay:
                return
            self._wake_handle.cancel()
        self._wake_handle = self.loop.call_later(delay + 0.001, self._on_wake)

    def _on_wake(self) -> None:
        self._wake_handle = None  # a delayed job comes due: it may outrank what is cached
        self.forget_queued()
        self.queue.request_fetch(due_unknown=True)  # and the next one's time is to be learnt


def _unstarted(job_id: int, status: str) -> None:
    """What the table did with a claimed job handed back unstarted: silent when it went back to
    the queue, said when it ended cancelled."""
    if status == "cancelled":
        log.info("job %s cancelled before it started: the cancel came while its claim was on "
                 "its way", job_id)
