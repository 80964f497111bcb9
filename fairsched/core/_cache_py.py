"""Pure-Python twin of _cache_c: the jobs waiting for a slot, by job id, planned in place."""

from array import array

from fairsched.core._checks import (
    as_job_id,
    check_matching,
    check_now,
    check_offset,
    check_row,
    check_rows,
    check_shares,
    check_tenants,
    check_weights,
)
from fairsched.core._matching_py import plan_cycle
from fairsched.core._pool_py import SlotPool
from fairsched.core.candidates import Candidates


class CandidateCache:
    """The jobs waiting for a slot, by job id: type id, priority, eligible_at, whether on
    demand, and the caller's object for the job (given back when an on-demand job is placed).

    A queued job's eligible_at is on the queue's clock, an on-demand one's on this host's:
    plan() takes the difference. Type ids are the pool's interned ids (0 .. 2**20 - 1).
    """

    __slots__ = ("_row", "_types", "_priorities", "_eligible_at", "_on_demand", "_job_ids",
                 "_tenants", "_jobs", "_dead", "_queued", "_on_demand_rows", "_claiming")

    def __init__(self):
        # Rows 0 .. n-1, column by column, in the places _cache_c gives them: a removed
        # row's place takes the last row. A queued job placed keeps its row, of type -1
        # (placed nowhere), until its claim's answer.
        self._row = {}  # job id -> row
        self._types = []
        self._priorities = []
        self._eligible_at = []  # as given: a queued job's on the queue's clock
        self._on_demand = []
        self._job_ids = []
        self._tenants = []
        self._jobs = []
        self._dead = 0  # rows of type -1
        self._queued = {}  # type id -> queued rows
        self._on_demand_rows = 0
        self._claiming = {}  # job id -> whether a cancel came for it

    # -- rows ----------------------------------------------------------------------------------

    def add(self, job_id, type_id, priority, eligible_at, on_demand, job, tenant=-1):
        """Add a row, or replace the row of the same job id; True when it was added. `tenant`
        indexes plan()'s tenant_shares (-1: no tenant term)."""
        row = check_row(job_id, type_id, priority, eligible_at)
        ten = check_tenants([tenant], 1)[0]
        return self._put(*row, bool(on_demand), job, ten)

    def add_many(self, job_ids, type_ids, priorities, eligible_at, jobs, on_demand=False,
                 tenants=None):
        """Add rows given column by column, all on demand or all queued, each replacing the
        row of its job id; how many were added."""
        columns = check_rows(job_ids, type_ids, priorities, eligible_at, jobs)
        tens = check_tenants(tenants, len(columns[4]))
        od = bool(on_demand)
        put = self._put
        return sum(put(i, t, p, e, od, job, k)
                   for i, t, p, e, job, k in zip(*columns, tens, strict=True))

    def remove(self, job_id):
        """Remove the row of job_id; False when there is none."""
        r = self._row_of(job_id)
        if r < 0:
            return False
        self._drop_row(r)
        return True

    def forget_type(self, type_id):
        """Remove the queued rows of one type (on-demand rows stay); how many went."""
        tid = as_job_id(type_id)
        if not self._queued.get(tid):
            return 0
        return self._drop_queued(tid)

    def forget_queued(self):
        """Remove every queued row (on-demand rows stay); how many went."""
        if len(self._jobs) - self._dead == self._on_demand_rows:
            return 0
        return self._drop_queued(None)

    def clear(self):
        """Remove every row (the claims on their way stay)."""
        for r in range(len(self._jobs) - 1, -1, -1):
            if self._types[r] >= 0:
                self._drop_row(r)

    def get(self, job_id, default=None):
        """The object of job_id's row, or default."""
        r = self._row_of(job_id)
        return default if r < 0 else self._jobs[r]

    def __contains__(self, job_id):
        return self._row_of(job_id) >= 0

    def __len__(self):
        return len(self._jobs) - self._dead

    @property
    def n_on_demand(self):
        return self._on_demand_rows

    @property
    def n_queued(self):
        return len(self._jobs) - self._dead - self._on_demand_rows

    def queued_of(self, type_id):
        """How many queued rows the type has, in O(1)."""
        return self._queued.get(as_job_id(type_id), 0)

    def jobs_of(self, on_demand):
        """The objects of the on-demand rows (on_demand true) or of the queued ones."""
        od = bool(on_demand)
        return [job for job, t, flag in zip(self._jobs, self._types, self._on_demand, strict=True)
                if t >= 0 and flag == od]

    def rows_list(self):
        """Every row as (job_id, type_id, priority, eligible_at, on_demand), by job id."""
        return sorted((i, t, p, e, bool(od)) for i, t, p, e, od in zip(
            self._job_ids, self._types, self._priorities, self._eligible_at, self._on_demand,
            strict=True) if t >= 0)

    # -- planning and claims ---------------------------------------------------------------

    def plan(self, pool, now, weights, offset=0.0, queued=True, matching="greedy",
             tenant_shares=None):
        """Plan one cycle over the rows, as plan_cycle would over them as Candidates (queued
        rows' eligible_at minus `offset`, the queue's clock minus this host's; without
        `queued`, only the on-demand rows; `tenant_shares` by tenant id), and take the placed
        rows out.

        Returns (on-demand jobs, their slot ids, queued job ids, their slot ids), each in
        score order: the on-demand jobs as the objects given, ids and slot ids as array('q').
        The slots are left reserved in the pool; the queued jobs placed are being claimed
        until end_claim().
        """
        if not isinstance(pool, SlotPool):
            raise TypeError(f"pool must be a {SlotPool.__module__}.SlotPool, "
                            f"got {type(pool).__module__}.{type(pool).__name__}")
        check_matching(matching)
        now = check_now(now)
        check_weights(weights)
        offset = check_offset(offset)
        shares = check_shares(tenant_shares)
        on_demand = self._on_demand
        cands = Candidates()
        # A row being claimed is of type -1: placed nowhere.
        cands.types = array("q", self._types if queued else
                            [t if od else -1 for t, od in zip(self._types, on_demand, strict=True)])
        cands.priorities = array("q", self._priorities)
        # x - 0.0 is x: nothing to shift.
        cands.eligible_at = array("d", self._eligible_at if offset == 0.0 else
                                  [e if od else e - offset
                                   for e, od in zip(self._eligible_at, on_demand, strict=True)])
        cands.on_demand = array("B", on_demand)
        cands.job_ids = array("q", self._job_ids)
        cands.tenants = array("q", self._tenants)
        cands.tenant_shares = shares
        idx, slots = plan_cycle(pool, cands, now, weights, matching)
        od_jobs, od_slots, od_rows, q_ids, q_slots = [], array("q"), [], array("q"), array("q")
        for i, slot_id in zip(idx, slots, strict=True):
            if on_demand[i]:
                od_jobs.append(self._jobs[i])
                od_slots.append(slot_id)
                od_rows.append(i)
            else:
                q_ids.append(self._job_ids[i])
                q_slots.append(slot_id)
                # Its row stays, unplaceable, until end_claim.
                self._uncount(i)
                self._types[i] = -1
                self._dead += 1
                self._claiming[self._job_ids[i]] = False
        # Highest first, so that the last row, moved into a freed place, is never one still
        # to take.
        for r in sorted(od_rows, reverse=True):
            self._drop_row(r)
        return od_jobs, od_slots, q_ids, q_slots

    def cancel_claim(self, job_id):
        """A cancel came for job_id: remembered if its claim is on its way (True), else
        nothing happens (False)."""
        key = as_job_id(job_id)
        if key not in self._claiming:
            return False
        self._claiming[key] = True
        return True

    def end_claim(self, job_id):
        """job_id's claim has its answer: forget it; whether a cancel came meanwhile."""
        key = as_job_id(job_id)
        if key not in self._claiming:
            return False
        r = self._row.get(key)
        if r is not None and self._types[r] < 0:  # the row it was placed from goes now
            self._drop_row(r)
        return self._claiming.pop(key)

    @property
    def n_claiming(self):
        return len(self._claiming)

    def claiming_list(self):
        """The claims on their way as (job_id, cancelled), by job id."""
        return sorted(self._claiming.items())

    def __repr__(self):
        return (f"<CandidateCache (python): {self.n_queued} queued, {self._on_demand_rows} on "
                f"demand, {len(self._claiming)} being claimed>")

    # -- internals -----------------------------------------------------------------------------

    def _put(self, job_id, type_id, priority, eligible_at, on_demand, job, tenant=-1):
        r = self._row.get(job_id)
        added = r is None or self._types[r] < 0
        if r is None:
            r = len(self._jobs)
            self._row[job_id] = r
            for column in (self._types, self._priorities, self._eligible_at, self._on_demand,
                           self._job_ids, self._tenants, self._jobs):
                column.append(None)
        else:
            self._uncount(r)  # a row being claimed: waiting again there
        self._types[r] = type_id
        self._priorities[r] = priority
        self._eligible_at[r] = eligible_at
        self._on_demand[r] = 1 if on_demand else 0
        self._job_ids[r] = job_id
        self._tenants[r] = tenant
        self._jobs[r] = job
        if on_demand:
            self._on_demand_rows += 1
        else:
            self._queued[type_id] = self._queued.get(type_id, 0) + 1
        return added

    def _uncount(self, r):
        if self._types[r] < 0:
            self._dead -= 1
        elif self._on_demand[r]:
            self._on_demand_rows -= 1
        else:
            self._queued[self._types[r]] -= 1

    def _drop_row(self, r):
        del self._row[self._job_ids[r]]
        self._uncount(r)
        columns = (self._types, self._priorities, self._eligible_at, self._on_demand,
                   self._job_ids, self._tenants, self._jobs)
        last = len(self._jobs) - 1
        if r != last:
            for column in columns:
                column[r] = column[last]
            self._row[self._job_ids[r]] = r
        for column in columns:
            del column[last]

    def _drop_queued(self, type_id):
        # The queued rows of type_id (of every type when None). Highest row first, so the
        # row moved into a freed place has been looked at already.
        dropped = 0
        for r in range(len(self._jobs) - 1, -1, -1):
            t = self._types[r]
            if not self._on_demand[r] and t >= 0 and (type_id is None or t == type_id):
                self._drop_row(r)
                dropped += 1
        return dropped

    def _row_of(self, job_id):
        r = self._row.get(as_job_id(job_id))
        return -1 if r is None or self._types[r] < 0 else r
