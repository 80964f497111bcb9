"""Compiled candidate cache: the jobs waiting for a slot, column by column, planned in place.

Rows stay packed (a removed row's place takes the last row) and each job id has an entry,
found through an open-addressing table, that keeps its place while the job is known: adding,
replacing and removing a row cost O(1), and a cycle plans straight from the columns. A queued
job it places keeps its entry, and its row, made unplaceable, until its claim's answer comes
(end_claim): a cycle's work beyond scoring touches neither the table, nor a row but the
placed ones, nor a Python object but the on-demand jobs it hands back.
"""

cimport cython
from cpython.array cimport array, clone, resize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int64_t
from libc.string cimport memset

from fairsched.core._idmap_c cimport (
    map_delete,
    map_find,
    map_free,
    map_init,
    map_insert,
    map_reserve,
)
from fairsched.core._matching_c cimport plan_into
from fairsched.core._pool_c cimport SlotPool
from fairsched.core._scoring_c cimport Rows, ScoreWeights, weights_of

from fairsched.core._checks import (
    as_job_id,
    check_matching,
    check_now,
    check_offset,
    check_row,
    check_rows,
    check_shares,
    check_tenants,
)

cdef array _INT64_ARRAY = array("q")


cdef int _grow(void **buffer, Py_ssize_t size) except -1:
    cdef void *grown = PyMem_Realloc(buffer[0], size)
    if grown == NULL:
        raise MemoryError()
    buffer[0] = grown
    return 0


@cython.final
cdef class CandidateCache:
    """The jobs waiting for a slot, by job id: type id, priority, eligible_at, whether on
    demand, and the caller's object for the job (given back when an on-demand job is placed).

    A queued job's eligible_at is on the queue's clock, an on-demand one's on this host's:
    plan() takes the difference. Type ids are the pool's interned ids (0 .. 2**20 - 1).
    """

    def __cinit__(self):
        self.objects = []
        map_init(&self.by_id, 16)

    def __dealloc__(self):
        map_free(&self.by_id)
        PyMem_Free(self.types)
        PyMem_Free(self.priorities)
        PyMem_Free(self.eligible_at)
        PyMem_Free(self.on_demand)
        PyMem_Free(self.job_ids)
        PyMem_Free(self.tenants)
        PyMem_Free(self.row_entry)
        PyMem_Free(self.row_claim)
        PyMem_Free(self.shifted)
        PyMem_Free(self.masked)
        PyMem_Free(self.scores)
        PyMem_Free(self.order)
        PyMem_Free(self.placed_idx)
        PyMem_Free(self.placed_slots)
        PyMem_Free(self.entry_row)
        PyMem_Free(self.entry_claim)
        PyMem_Free(self.entry_job_id)
        PyMem_Free(self.spare)
        PyMem_Free(self.queued_per_type)

    # -- rows ----------------------------------------------------------------------------------

    def add(self, job_id, type_id, priority, eligible_at, on_demand, job, tenant=-1):
        """Add a row, or replace the row of the same job id; True when it was added. `tenant`
        indexes plan()'s tenant_shares (-1: no tenant term)."""
        jid, tid, prio, t = check_row(job_id, type_id, priority, eligible_at)
        cdef array ten = check_tenants([tenant], 1)
        return self.put(jid, tid, prio, t, bool(on_demand), job, ten.data.as_longlongs[0]) == 1

    def add_many(self, job_ids, type_ids, priorities, eligible_at, jobs, on_demand=False,
                 tenants=None):
        """Add rows given column by column, all on demand or all queued, each replacing the
        row of its job id; how many were added."""
        cdef array ids, types, prios, times, tens
        cdef list objs
        ids, types, prios, times, objs = check_rows(job_ids, type_ids, priorities,
                                                    eligible_at, jobs)
        cdef bint od = bool(on_demand)
        cdef Py_ssize_t i, added = 0, n = len(objs)
        tens = check_tenants(tenants, n)
        self.reserve(self.n + n, n)
        for i in range(n):
            added += self.put(ids.data.as_longlongs[i], types.data.as_longlongs[i],
                              prios.data.as_longlongs[i], times.data.as_doubles[i], od, objs[i],
                              tens.data.as_longlongs[i])
        return added

    def remove(self, job_id):
        """Remove the row of job_id; False when there is none."""
        cdef Py_ssize_t r = self.row_of(job_id)
        if r < 0:
            return False
        self.drop_row(r)
        return True

    def forget_type(self, type_id):
        """Remove the queued rows of one type (on-demand rows stay); how many went."""
        tid = as_job_id(type_id)
        if tid is None or tid < 0 or tid >= self.n_types or self.queued_per_type[tid] == 0:
            return 0
        return self.drop_queued(tid)

    def forget_queued(self):
        """Remove every queued row (on-demand rows stay); how many went."""
        if self.n - self.n_dead == self.on_demand_rows:
            return 0
        return self.drop_queued(-1)

    def clear(self):
        """Remove every row (the claims on their way stay)."""
        cdef Py_ssize_t r
        for r in range(self.n - 1, -1, -1):
            if self.types[r] >= 0:
                self.drop_row(r)

    def get(self, job_id, default=None):
        """The object of job_id's row, or default."""
        cdef Py_ssize_t r = self.row_of(job_id)
        return default if r < 0 else self.objects[self.row_entry[r]]

    def __contains__(self, job_id):
        return self.row_of(job_id) >= 0

    def __len__(self):
        return self.n - self.n_dead

    @property
    def n_on_demand(self):
        return self.on_demand_rows

    @property
    def n_queued(self):
        return self.n - self.n_dead - self.on_demand_rows

    def queued_of(self, type_id):
        """How many queued rows the type has, in O(1)."""
        tid = as_job_id(type_id)
        if tid is None or tid < 0 or tid >= self.n_types:
            return 0
        return self.queued_per_type[tid]

    def jobs_of(self, on_demand):
        """The objects of the on-demand rows (on_demand true) or of the queued ones."""
        cdef bint od = bool(on_demand)
        return [self.objects[self.row_entry[r]] for r in range(self.n)
                if self.types[r] >= 0 and self.on_demand[r] == od]

    def rows_list(self):
        """Every row as (job_id, type_id, priority, eligible_at, on_demand), by job id."""
        return sorted([(self.job_ids[r], self.types[r], self.priorities[r], self.eligible_at[r],
                        bool(self.on_demand[r])) for r in range(self.n) if self.types[r] >= 0])

    # -- planning and claims ---------------------------------------------------------------

    def plan(self, SlotPool pool not None, now, weights, offset=0.0, queued=True,
             matching="greedy", tenant_shares=None):
        """Plan one cycle over the rows, as plan_cycle would over them as Candidates (queued
        rows' eligible_at minus `offset`, the queue's clock minus this host's; without
        `queued`, only the on-demand rows; `tenant_shares` by tenant id), and take the placed
        rows out.

        Returns (on-demand jobs, their slot ids, queued job ids, their slot ids), each in
        score order: the on-demand jobs as the objects given, ids and slot ids as array('q').
        The slots are left reserved in the pool; the queued jobs placed are being claimed
        until end_claim().
        """
        check_matching(matching)
        cdef double t = check_now(now)
        cdef ScoreWeights w = weights_of(weights)
        cdef double off = check_offset(offset)
        cdef bint with_queued = bool(queued)
        cdef array shares = check_shares(tenant_shares)
        cdef Py_ssize_t i, j, k, n = self.n, placed, n_od = 0, n_q = 0
        cdef Rows rows
        rows.n = n
        rows.tenants = self.tenants
        rows.n_shares = len(shares)
        rows.shares = shares.data.as_doubles if len(shares) else NULL
        rows.priorities = self.priorities
        rows.on_demand = self.on_demand
        rows.job_ids = self.job_ids
        rows.types = self.types  # a row being claimed is of type -1: placed nowhere
        rows.eligible_at = self.eligible_at
        if off != 0.0:  # x - 0.0 is x: nothing to shift
            # Without a branch: an on-demand row's time minus off x 0 is its time, exactly.
            for i in range(n):
                self.shifted[i] = self.eligible_at[i] - off * <double>(1 - self.on_demand[i])
            rows.eligible_at = self.shifted
        if not with_queued:
            for i in range(n):
                self.masked[i] = self.types[i] if self.on_demand[i] else -1
            rows.types = self.masked
        placed = plan_into(pool, &rows, t, w, matching == "optimal", self.scores, self.order,
                           self.placed_idx, self.placed_slots)
        cdef list od_jobs = []
        cdef array od_slots = clone(_INT64_ARRAY, placed, zero=False)
        cdef array q_ids = clone(_INT64_ARRAY, placed, zero=False)
        cdef array q_slots = clone(_INT64_ARRAY, placed, zero=False)
        for j in range(placed):
            i = self.placed_idx[j]
            if self.on_demand[i]:
                od_jobs.append(self.objects[self.row_entry[i]])
                od_slots.data.as_longlongs[n_od] = self.placed_slots[j]
                self.order[n_od] = i  # free now: the rows to take out
                n_od += 1
            else:
                q_ids.data.as_longlongs[n_q] = self.job_ids[i]
                q_slots.data.as_longlongs[n_q] = self.placed_slots[j]
                n_q += 1
                # Its row stays, unplaceable, until end_claim: nothing moves now, and its
                # entry is not even read.
                self.uncount(i)
                self.types[i] = -1
                self.n_dead += 1
                if not self.row_claim[i]:
                    self.claiming += 1
                self.row_claim[i] = 1
        resize(od_slots, n_od)
        resize(q_ids, n_q)
        resize(q_slots, n_q)
        # The on-demand rows go now, highest first, so that the last row, moved into a freed
        # place, is never one still to take. They are few: an insertion sort.
        for j in range(1, n_od):
            i = self.order[j]
            k = j
            while k > 0 and self.order[k - 1] < i:
                self.order[k] = self.order[k - 1]
                k -= 1
            self.order[k] = i
        for j in range(n_od):
            self.drop_row(self.order[j])
        return od_jobs, od_slots, q_ids, q_slots

    def cancel_claim(self, job_id):
        """A cancel came for job_id: remembered if its claim is on its way (True), else
        nothing happens (False)."""
        cdef unsigned char *claim = self.claim_of(self.entry_of(job_id))
        if claim == NULL or not claim[0]:
            return False
        claim[0] = 2
        return True

    def end_claim(self, job_id):
        """job_id's claim has its answer: forget it; whether a cancel came meanwhile."""
        cdef Py_ssize_t e = self.entry_of(job_id), r
        cdef unsigned char *claim = self.claim_of(e)
        if claim == NULL or not claim[0]:
            return False
        cancelled = claim[0] == 2
        claim[0] = 0
        self.claiming -= 1
        r = self.entry_row[e]
        if r >= 0 and self.types[r] < 0:  # the row it was placed from goes now
            self.take_row(r)
        if self.entry_row[e] < 0:
            self.free_entry(e)
        return cancelled

    @property
    def n_claiming(self):
        return self.claiming

    def claiming_list(self):
        """The claims on their way as (job_id, cancelled), by job id."""
        return sorted([(self.entry_job_id[e], self.claim_of(e)[0] == 2)
                       for e in range(self.n_entries)
                       if self.claim_of(e) != NULL and self.claim_of(e)[0]])

    def __repr__(self):
        return (f"<CandidateCache (c): {self.n - self.n_dead - self.on_demand_rows} queued, "
                f"{self.on_demand_rows} on demand, {self.claiming} being claimed>")

    # -- internals -----------------------------------------------------------------------------

    cdef int reserve(self, Py_ssize_t rows, Py_ssize_t more) except -1:
        # Room for `rows` rows, and for `more` job ids than are known now.
        cdef Py_ssize_t cap = self.cap, entries
        if rows > cap:
            cap = max(rows, cap * 2, 16)
            # Each buffer grows on its own: one that fails leaves the others larger.
            _grow(<void **>&self.types, cap * sizeof(long long))
            _grow(<void **>&self.priorities, cap * sizeof(long long))
            _grow(<void **>&self.eligible_at, cap * sizeof(double))
            _grow(<void **>&self.on_demand, cap * sizeof(unsigned char))
            _grow(<void **>&self.job_ids, cap * sizeof(long long))
            _grow(<void **>&self.tenants, cap * sizeof(long long))
            _grow(<void **>&self.row_entry, cap * sizeof(Py_ssize_t))
            _grow(<void **>&self.row_claim, cap * sizeof(unsigned char))
            _grow(<void **>&self.shifted, cap * sizeof(double))
            _grow(<void **>&self.masked, cap * sizeof(long long))
            _grow(<void **>&self.scores, cap * sizeof(double))
            _grow(<void **>&self.order, cap * sizeof(long long))
            _grow(<void **>&self.placed_idx, cap * sizeof(long long))
            _grow(<void **>&self.placed_slots, cap * sizeof(long long))
            self.cap = cap
        entries = self.n_entries + max(0, more - self.n_spare)
        if entries > self.entry_cap:
            cap = max(entries, self.entry_cap * 2, 16)
            _grow(<void **>&self.entry_row, cap * sizeof(Py_ssize_t))
            _grow(<void **>&self.entry_claim, cap * sizeof(unsigned char))
            _grow(<void **>&self.entry_job_id, cap * sizeof(long long))
            _grow(<void **>&self.spare, cap * sizeof(Py_ssize_t))
            self.entry_cap = cap
        map_reserve(&self.by_id, more)
        return 0

    cdef int reserve_type(self, long long type_id) except -1:
        cdef Py_ssize_t n
        if type_id < self.n_types:
            return 0
        n = max(type_id + 1, self.n_types * 2, 16)
        _grow(<void **>&self.queued_per_type, n * sizeof(long long))
        memset(&self.queued_per_type[self.n_types], 0, (n - self.n_types) * sizeof(long long))
        self.n_types = n
        return 0

    cdef int put(self, long long job_id, long long type_id, long long priority,
                 double eligible_at, bint on_demand, object job, long long tenant) except -1:
        # 1 when the row was added, 0 when it replaced job_id's row.
        cdef Py_ssize_t p = map_find(&self.by_id, job_id), e, r
        cdef bint added
        # Everything that may fail comes before the first change.
        if not on_demand:
            self.reserve_type(type_id)
        if p < 0:
            self.reserve(self.n + 1, 1)
            if self.n_spare:
                self.n_spare -= 1
                e = self.spare[self.n_spare]
            else:
                self.objects.append(None)
                e = self.n_entries
                self.n_entries += 1
            map_insert(&self.by_id, job_id, e)
            self.entry_row[e] = -1
            self.entry_claim[e] = 0
            self.entry_job_id[e] = job_id
        else:
            e = self.by_id.values[p]
            if self.entry_row[e] < 0:  # being claimed, its row gone, and waiting again
                self.reserve(self.n + 1, 0)
        r = self.entry_row[e]
        added = r < 0 or self.types[r] < 0
        if r < 0:
            r = self.n
            self.n += 1
            self.row_entry[r] = e
            self.entry_row[e] = r
            self.row_claim[r] = self.entry_claim[e]  # its claim's state, if one is on its way
        elif self.types[r] < 0:  # the row it is being claimed from: waiting again there
            self.n_dead -= 1
        else:
            self.uncount(r)
        self.objects[e] = job
        self.types[r] = type_id
        self.priorities[r] = priority
        self.eligible_at[r] = eligible_at
        self.on_demand[r] = on_demand
        self.job_ids[r] = job_id
        self.tenants[r] = tenant
        if on_demand:
            self.on_demand_rows += 1
        else:
            self.queued_per_type[type_id] += 1
        return added

    cdef inline void uncount(self, Py_ssize_t r) noexcept:
        if self.types[r] < 0:  # being claimed: counted nowhere
            self.n_dead -= 1
        elif self.on_demand[r]:
            self.on_demand_rows -= 1
        else:
            self.queued_per_type[self.types[r]] -= 1

    cdef Py_ssize_t take_row(self, Py_ssize_t r) noexcept:
        # Take row r out of the columns; its entry, which stays, is returned.
        cdef Py_ssize_t e = self.row_entry[r], last = self.n - 1
        cdef unsigned char claim = self.row_claim[r]
        self.uncount(r)
        if r != last:
            self.types[r] = self.types[last]
            self.priorities[r] = self.priorities[last]
            self.eligible_at[r] = self.eligible_at[last]
            self.on_demand[r] = self.on_demand[last]
            self.job_ids[r] = self.job_ids[last]
            self.tenants[r] = self.tenants[last]
            self.row_entry[r] = self.row_entry[last]
            self.row_claim[r] = self.row_claim[last]
            self.entry_row[self.row_entry[r]] = r
        self.n = last
        self.entry_row[e] = -1
        self.entry_claim[e] = claim  # with no row, the entry holds its claim's state
        return e

    cdef inline unsigned char *claim_of(self, Py_ssize_t e) noexcept:
        # Where the state of entry e's claim is kept: with its row while it has one (so that
        # a cycle placing the row needs no look at the entry), else with the entry.
        if e < 0:
            return NULL
        if self.entry_row[e] >= 0:
            return &self.row_claim[self.entry_row[e]]
        return &self.entry_claim[e]

    cdef int free_entry(self, Py_ssize_t e) except -1:
        map_delete(&self.by_id, self.entry_job_id[e])
        self.spare[self.n_spare] = e
        self.n_spare += 1
        self.objects[e] = None  # last: its object may go, and run code as it goes
        return 0

    cdef int drop_row(self, Py_ssize_t r) except -1:
        cdef Py_ssize_t e = self.take_row(r)
        if not self.entry_claim[e]:
            self.free_entry(e)
        return 0

    cdef Py_ssize_t drop_queued(self, long long type_id) except -1:
        # The queued rows of type_id (of every type when it is -1). Highest row first, so
        # the row moved into a freed place has been looked at already.
        cdef Py_ssize_t r, dropped = 0
        for r in range(self.n - 1, -1, -1):
            if (not self.on_demand[r] and self.types[r] >= 0
                    and (type_id < 0 or self.types[r] == type_id)):
                self.drop_row(r)
                dropped += 1
        return dropped

    cdef Py_ssize_t row_of(self, job_id) except -2:
        # job_id's row, or -1 when it has none waiting.
        cdef Py_ssize_t e = self.entry_of(job_id), r
        if e < 0:
            return -1
        r = self.entry_row[e]
        return r if r >= 0 and self.types[r] >= 0 else -1

    cdef Py_ssize_t entry_of(self, job_id) except -2:
        # job_id's entry, or -1 (also for anything that is no 64-bit integer, as a dict would
        # say).
        cdef Py_ssize_t p
        if type(job_id) is not int:
            job_id = as_job_id(job_id)
            if job_id is None:
                return -1
        try:
            p = map_find(&self.by_id, <int64_t>job_id)
        except OverflowError:
            return -1
        return -1 if p < 0 else self.by_id.values[p]
