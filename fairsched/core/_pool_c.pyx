"""Compiled slot pool: the execution slots of live workers, indexed by job type.

Per type id the pool keeps that type's slots ordered by specialisation (fewest types,
then lowest slot id), a hint below which every slot is busy, and a free counter.
Acquiring only moves a hint forward, so a whole planning cycle scans each type's slots at
most once; releasing moves the hint back to the released slot. Adding and removing slots
(worker start and exit) are the rare operations that reorder the per-type arrays.
"""

cimport cython
from cpython.array cimport array, clone
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int64_t
from libc.string cimport memmove, memset

from fairsched.core._checks import as_int64, check_slot_id, check_type_ids

cdef array _INT64_ARRAY = array("q")


cdef inline bint _before(const SlotRec *a, const SlotRec *b) noexcept:
    # Most specialised first: fewer types, then the lower slot id.
    if a.n_types != b.n_types:
        return a.n_types < b.n_types
    return a.slot_id < b.slot_id


cdef inline Py_ssize_t _type_pos(const SlotRec *rec, int64_t type_id) noexcept:
    cdef Py_ssize_t k
    for k in range(rec.n_types):
        if rec.types[k] == type_id:
            return k
    return -1


@cython.final
cdef class SlotPool:
    """Execution slots of live workers; which are free, per job type."""

    def __cinit__(self):
        self.by_id = {}

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.recs != NULL:
            for i in range(self.n_recs):
                PyMem_Free(self.recs[i].types)
                PyMem_Free(self.recs[i].where)
        if self.index != NULL:
            for i in range(self.n_index):
                PyMem_Free(self.index[i].recs)
        PyMem_Free(self.recs)
        PyMem_Free(self.spare)
        PyMem_Free(self.index)

    def add_slot(self, slot_id, worker_id, type_ids):
        """Add a free slot of a worker, able to run the given (interned) type ids."""
        cdef int64_t sid = check_slot_id(slot_id)
        cdef int64_t wid = as_int64(worker_id, "worker id")
        cdef tuple types = check_type_ids(type_ids)
        cdef Py_ssize_t n = len(types), k, r
        cdef int64_t *tbuf
        cdef Py_ssize_t *wbuf
        cdef SlotRec *rec
        if sid in self.by_id:
            raise ValueError(f"slot {sid} already exists")
        # Allocate everything first so that running out of memory leaves the pool intact.
        self.grow_index(max(types) + 1)
        for t in types:
            self.reserve_type(t)
        tbuf = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
        wbuf = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t))
        if tbuf == NULL or wbuf == NULL:
            PyMem_Free(tbuf)
            PyMem_Free(wbuf)
            raise MemoryError()
        try:
            r = self.new_record()
        except MemoryError:
            PyMem_Free(tbuf)
            PyMem_Free(wbuf)
            raise
        rec = &self.recs[r]
        rec.slot_id = sid
        rec.worker_id = wid
        rec.types = tbuf
        rec.where = wbuf
        rec.n_types = n
        rec.busy = False
        rec.live = True
        for k in range(n):
            tbuf[k] = types[k]
        for k in range(n):
            self.insert(r, k)
        self.by_id[sid] = r
        self.free_total += 1

    def acquire(self, type_id):
        """Reserve the most specialised free slot supporting type_id; its id, or -1."""
        # Checked as the twin checks it: a C integer argument would take 1.9 for 1.
        return self.take(as_int64(type_id, "type id"))

    def acquire_slot(self, slot_id):
        """Reserve this slot if it exists and is free."""
        cdef Py_ssize_t r = self.record_of(slot_id)
        if r < 0 or self.recs[r].busy:
            return False
        self.occupy(r)
        return True

    def release(self, slot_id):
        """Free a busy slot; False, changing nothing, when it vanished or is already free."""
        cdef Py_ssize_t r = self.record_of(slot_id)
        if r < 0 or not self.recs[r].busy:
            return False
        self.vacate(r)
        return True

    def remove_worker(self, worker_id_arg):
        """Remove all the worker's slots, free or busy; return the busy ones' ids, ascending."""
        cdef int64_t worker_id = as_int64(worker_id_arg, "worker id")
        cdef Py_ssize_t r, k
        cdef SlotRec *rec
        cdef list gone = []
        cdef list busy = []
        for r in range(self.n_recs):
            rec = &self.recs[r]
            if rec.live and rec.worker_id == worker_id:
                rec.live = False
                gone.append(r)
                if rec.busy:
                    busy.append(rec.slot_id)
                else:
                    self.free_total -= 1
                    for k in range(rec.n_types):
                        self.index[rec.types[k]].n_free -= 1
        if not gone:
            return busy
        touched = set()
        for r in gone:
            rec = &self.recs[r]
            for k in range(rec.n_types):
                touched.add(rec.types[k])
        for t in touched:
            self.compact(t)
        for r in gone:
            rec = &self.recs[r]
            del self.by_id[rec.slot_id]
            PyMem_Free(rec.types)
            PyMem_Free(rec.where)
            rec.types = NULL
            rec.where = NULL
            rec.n_types = 0
            rec.busy = False
            self.spare[self.n_spare] = r
            self.n_spare += 1
        busy.sort()
        return busy

    def free_count(self, type_id_arg):
        """Free slots supporting type_id, in O(1)."""
        cdef int64_t type_id = as_int64(type_id_arg, "type id")
        if type_id < 0 or type_id >= self.n_index:
            return 0
        return self.index[type_id].n_free

    def free_counts(self, n_types_arg):
        """array('q') of free slot counts for type ids 0 .. n_types-1."""
        cdef Py_ssize_t n_types = as_int64(n_types_arg, "n_types")
        cdef Py_ssize_t t
        cdef array out
        cdef int64_t *data
        if n_types < 0:
            raise ValueError(f"n_types must be >= 0, got {n_types}")
        out = clone(_INT64_ARRAY, n_types, zero=True)
        data = <int64_t *>out.data.as_voidptr
        for t in range(min(n_types, self.n_index)):
            data[t] = self.index[t].n_free
        return out

    def has_slot(self, slot_id):
        return slot_id in self.by_id

    def is_busy(self, slot_id):
        # A slot that vanished with its worker is not busy: releasing it is a no-op.
        cdef Py_ssize_t r = self.record_of(slot_id)
        return r >= 0 and self.recs[r].busy

    def slot_types(self, slot_id):
        cdef Py_ssize_t r = self.get_record(slot_id)
        cdef SlotRec *rec = &self.recs[r]
        return tuple([rec.types[k] for k in range(rec.n_types)])

    def worker_of(self, slot_id):
        return self.recs[self.get_record(slot_id)].worker_id

    def slot_ids(self):
        return sorted(self.by_id)

    def __len__(self):
        return len(self.by_id)

    @property
    def n_free(self):
        return self.free_total

    @property
    def n_type_ids(self):
        """Highest type id the pool has seen, plus one: the length free_counts() needs."""
        return self.n_index

    def __repr__(self):
        return f"<SlotPool (c): {len(self)} slots, {self.free_total} free>"

    cdef int64_t take(self, int64_t type_id) noexcept:
        cdef TypeIndex *ix
        cdef Py_ssize_t pos
        if type_id < 0 or type_id >= self.n_index:
            return -1
        ix = &self.index[type_id]
        if ix.n_free <= 0:
            return -1
        pos = ix.hint
        while pos < ix.n and self.recs[ix.recs[pos]].busy:
            pos += 1
        if pos == ix.n:  # unreachable while n_free is kept in step
            ix.hint = pos
            return -1
        ix.hint = pos + 1
        self.occupy(ix.recs[pos])
        return self.recs[ix.recs[pos]].slot_id

    cdef inline void occupy(self, Py_ssize_t r) noexcept:
        cdef SlotRec *rec = &self.recs[r]
        cdef Py_ssize_t k
        rec.busy = True
        self.free_total -= 1
        for k in range(rec.n_types):
            self.index[rec.types[k]].n_free -= 1

    cdef void vacate(self, Py_ssize_t r) noexcept:
        cdef SlotRec *rec = &self.recs[r]
        cdef TypeIndex *ix
        cdef Py_ssize_t k
        rec.busy = False
        self.free_total += 1
        for k in range(rec.n_types):
            ix = &self.index[rec.types[k]]
            ix.n_free += 1
            if rec.where[k] < ix.hint:
                ix.hint = rec.where[k]

    cdef int grow_index(self, Py_ssize_t n_types) except -1:
        cdef TypeIndex *grown
        if n_types <= self.n_index:
            return 0
        grown = <TypeIndex *>PyMem_Realloc(self.index, n_types * sizeof(TypeIndex))
        if grown == NULL:
            raise MemoryError()
        memset(&grown[self.n_index], 0, (n_types - self.n_index) * sizeof(TypeIndex))
        self.index = grown
        self.n_index = n_types
        return 0

    cdef int reserve_type(self, int64_t type_id) except -1:
        cdef TypeIndex *ix = &self.index[type_id]
        cdef Py_ssize_t cap
        cdef Py_ssize_t *grown
        if ix.n < ix.cap:
            return 0
        cap = ix.cap * 2 if ix.cap else 8
        grown = <Py_ssize_t *>PyMem_Realloc(ix.recs, cap * sizeof(Py_ssize_t))
        if grown == NULL:
            raise MemoryError()
        ix.recs = grown
        ix.cap = cap
        return 0

    cdef Py_ssize_t new_record(self) except -1:
        cdef Py_ssize_t cap
        cdef SlotRec *recs
        cdef Py_ssize_t *spare
        if self.n_spare > 0:
            self.n_spare -= 1
            return self.spare[self.n_spare]
        if self.n_recs == self.cap_recs:
            cap = self.cap_recs * 2 if self.cap_recs else 16
            recs = <SlotRec *>PyMem_Realloc(self.recs, cap * sizeof(SlotRec))
            if recs == NULL:
                raise MemoryError()
            self.recs = recs
            # A record is spare at most once, so the spare stack never outgrows the records.
            spare = <Py_ssize_t *>PyMem_Realloc(self.spare, cap * sizeof(Py_ssize_t))
            if spare == NULL:
                raise MemoryError()
            self.spare = spare
            self.cap_recs = cap
        memset(&self.recs[self.n_recs], 0, sizeof(SlotRec))
        self.n_recs += 1
        return self.n_recs - 1

    cdef void insert(self, Py_ssize_t r, Py_ssize_t k) noexcept:
        # Insert record r into the index of its k-th type, keeping specialisation order.
        cdef SlotRec *rec = &self.recs[r]
        cdef int64_t type_id = rec.types[k]
        cdef TypeIndex *ix = &self.index[type_id]
        cdef Py_ssize_t lo = 0, hi = ix.n, mid, q, x
        while lo < hi:
            mid = (lo + hi) // 2
            if _before(&self.recs[ix.recs[mid]], rec):
                lo = mid + 1
            else:
                hi = mid
        memmove(&ix.recs[lo + 1], &ix.recs[lo], (ix.n - lo) * sizeof(Py_ssize_t))
        ix.recs[lo] = r
        ix.n += 1
        for q in range(lo + 1, ix.n):
            x = ix.recs[q]
            self.recs[x].where[_type_pos(&self.recs[x], type_id)] = q
        rec.where[k] = lo
        ix.n_free += 1
        if lo < ix.hint:
            ix.hint = lo

    cdef void compact(self, int64_t type_id) noexcept:
        # Drop removed slots from one type's index; slots below the hint stay busy.
        cdef TypeIndex *ix = &self.index[type_id]
        cdef Py_ssize_t pos, kept = 0, hint = 0, x
        for pos in range(ix.n):
            x = ix.recs[pos]
            if not self.recs[x].live:
                continue
            if pos < ix.hint:
                hint += 1
            ix.recs[kept] = x
            self.recs[x].where[_type_pos(&self.recs[x], type_id)] = kept
            kept += 1
        ix.n = kept
        ix.hint = hint

    cdef Py_ssize_t get_record(self, slot_id) except -1:
        cdef Py_ssize_t r
        try:
            r = self.record_of(slot_id)
        except TypeError:
            r = -1
        if r < 0:
            raise KeyError(f"no slot {slot_id!r} in the pool")
        return r

    cdef Py_ssize_t record_of(self, slot_id) except -2:
        r = self.by_id.get(slot_id)
        return -1 if r is None else r
