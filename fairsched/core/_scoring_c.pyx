"""Compiled scoring: score a batch of candidate jobs and order them, in bulk.

The arithmetic matches _scoring_py operation for operation (and setup.py forbids fused
multiply-add), so both produce bit-identical scores.
"""

cimport cython
from cpython.array cimport array, clone
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.math cimport INFINITY
from libc.stdint cimport UINT32_MAX, UINT64_MAX, uint32_t, uint64_t
from libc.stdlib cimport qsort
from libc.string cimport memcpy, memset

from fairsched.core._checks import (
    as_free_counts,
    check_candidates,
    check_now,
    check_shares,
    check_weights,
)

cdef array _DOUBLE_ARRAY = array("d")
cdef array _INT64_ARRAY = array("q")


cdef enum:
    # Buckets up to this size are put in order by insertion sort, larger ones by qsort.
    _SMALL = 16


cdef ScoreWeights weights_of(weights) except *:
    cdef ScoreWeights w
    (w.priority, w.age, w.rarity, w.on_demand, w.on_demand_age,
     w.tenant) = check_weights(weights)
    return w


def score_candidates(cands, now, free_counts, weights):
    """Return (scores array('d'), order array('q')) for the candidates at time `now`.

    order lists candidate indices by score descending, then eligible_at ascending (older
    first), then job id ascending, then index.
    """
    cdef Py_ssize_t n = check_candidates(cands)
    cdef double t = check_now(now)
    cdef array free = as_free_counts(free_counts)
    cdef ScoreWeights w = weights_of(weights)
    cdef Columns columns = columns_of(cands, n)
    cdef array scores = clone(_DOUBLE_ARRAY, n, zero=False)
    cdef array order = clone(_INT64_ARRAY, n, zero=False)
    score_and_order(&columns.rows, t, free, w, scores.data.as_doubles, order.data.as_longlongs)
    return scores, order


@cython.final
cdef class Columns:
    pass


cdef Columns columns_of(cands, Py_ssize_t n):
    # n is check_candidates(cands): every column has n entries.
    cdef Columns c = Columns.__new__(Columns)
    c.types = cands.types
    c.priorities = cands.priorities
    c.eligible_at = cands.eligible_at
    c.on_demand = cands.on_demand
    c.job_ids = cands.job_ids
    c.tenants = cands.tenants
    cdef array shares = check_shares(cands.tenant_shares)
    c.shares = shares
    c.rows.n = n
    c.rows.n_shares = len(shares)
    c.rows.shares = shares.data.as_doubles if len(shares) else NULL
    if n == 0:
        c.rows.types = c.rows.priorities = c.rows.job_ids = c.rows.tenants = NULL
        c.rows.eligible_at = NULL
        c.rows.on_demand = NULL
    else:
        c.rows.types = &c.types[0]
        c.rows.priorities = &c.priorities[0]
        c.rows.eligible_at = &c.eligible_at[0]
        c.rows.on_demand = &c.on_demand[0]
        c.rows.job_ids = &c.job_ids[0]
        c.rows.tenants = &c.tenants[0]
    return c


cdef int score_and_order(const Rows *rows, double now, const long long[::1] free_counts,
                         ScoreWeights w, double *scores, long long *order) except -1:
    score_into(rows, now, free_counts, w, scores)
    order_into(rows, scores, order)
    return 0


cdef double tenant_floor(const Rows *rows) noexcept:
    # The lowest share among the rows' tenants (0.0 when none has one), as the twin's
    # tenant_floor: the tenant term is measured from it.
    cdef Py_ssize_t i
    cdef long long k
    cdef double low = 2.0
    for i in range(rows.n):
        k = rows.tenants[i]
        if 0 <= k < rows.n_shares and rows.shares[k] < low:
            low = rows.shares[k]
    return 0.0 if low > 1.0 else low


cdef int score_into(const Rows *rows, double now, const long long[::1] free_counts,
                    ScoreWeights w, double *scores) except -1:
    cdef Py_ssize_t i, n = rows.n, n_free = free_counts.shape[0], n_shares = rows.n_shares
    cdef const long long *tenants = rows.tenants
    cdef const double *shares = rows.shares
    cdef double low = tenant_floor(rows)
    cdef long long k
    cdef const long long *types = rows.types
    cdef const long long *priorities = rows.priorities
    cdef const double *eligible_at = rows.eligible_at
    cdef const unsigned char *on_demand = rows.on_demand
    cdef long long t, f
    cdef double age, s
    for i in range(n):
        age = now - eligible_at[i]
        if age < 0.0:
            age = 0.0
        s = <double>priorities[i] * w.priority + age * w.age
        t = types[i]
        if 0 <= t < n_free:
            f = free_counts[t]
            if f > 0:
                s = s + w.rarity / <double>f
        if on_demand[i]:
            s = s + (w.on_demand + age * w.on_demand_age)
        k = tenants[i]
        if 0 <= k < n_shares:
            s = s - w.tenant * (shares[k] - low)
        scores[i] = s
    return 0


cdef inline uint64_t _rank_bits(double score) noexcept:
    # An unsigned key that sorts like -score: the IEEE bits with the sign handled. NaN goes
    # last (as +inf) and -0.0 counts as 0.0, as in the twin's comparison of floats.
    cdef double key = -score if score == score else INFINITY
    cdef uint64_t bits
    if key == 0.0:
        key = 0.0
    memcpy(&bits, &key, sizeof(bits))
    return ~bits if bits >> 63 else bits | (<uint64_t>1 << 63)


cdef inline bint _before(const Entry *a, const Entry *b, const double *eligible_at,
                         const long long *job_ids) noexcept:
    # The full order: higher score (lower key), then older, then lower job id, then index.
    if a.key != b.key:
        return a.key < b.key
    if eligible_at[a.idx] != eligible_at[b.idx]:
        return eligible_at[a.idx] < eligible_at[b.idx]
    if job_ids[a.idx] != job_ids[b.idx]:
        return job_ids[a.idx] < job_ids[b.idx]
    return a.idx < b.idx


cdef int _full_cmp(const void *pa, const void *pb) noexcept nogil:
    cdef const FullKey *a = <const FullKey *>pa
    cdef const FullKey *b = <const FullKey *>pb
    if a.key != b.key:
        return -1 if a.key < b.key else 1
    if a.eligible_at != b.eligible_at:
        return -1 if a.eligible_at < b.eligible_at else 1
    if a.job_id != b.job_id:
        return -1 if a.job_id < b.job_id else 1
    return -1 if a.idx < b.idx else (1 if a.idx > b.idx else 0)


cdef int _sort_run(Entry *run, Py_ssize_t n, const double *eligible_at,
                   const long long *job_ids) except -1:
    # Put run[0..n) in the full order: insertion sort when short, else qsort.
    cdef Py_ssize_t i, j
    cdef Entry x
    cdef FullKey *full
    if n <= _SMALL:
        for i in range(1, n):
            x = run[i]
            j = i
            while j > 0 and _before(&x, &run[j - 1], eligible_at, job_ids):
                run[j] = run[j - 1]
                j -= 1
            run[j] = x
        return 0
    full = <FullKey *>PyMem_Malloc(n * sizeof(FullKey))
    if full == NULL:
        raise MemoryError()
    for i in range(n):
        full[i].key = run[i].key
        full[i].eligible_at = eligible_at[run[i].idx]
        full[i].job_id = job_ids[run[i].idx]
        full[i].idx = run[i].idx
    qsort(full, n, sizeof(FullKey), _full_cmp)
    for i in range(n):
        run[i].key = full[i].key
        run[i].idx = full[i].idx
    PyMem_Free(full)
    return 0


# Scratch space for order_into, kept from one cycle to the next: glibc hands large freed
# blocks back to the kernel, and faulting them in again cost more than the sort itself.
# Only ever used with the GIL held and without calling back into Python.
cdef Entry *_entries = NULL
cdef uint32_t *_starts = NULL
cdef uint64_t *_keys = NULL
cdef Py_ssize_t _capacity = 0


cdef int _reserve(Py_ssize_t n) except -1:
    global _entries, _starts, _keys, _capacity
    cdef Entry *entries
    cdef uint32_t *starts
    cdef uint64_t *keys
    if n <= _capacity:
        return 0
    entries = <Entry *>PyMem_Realloc(_entries, n * sizeof(Entry))
    if entries == NULL:
        raise MemoryError()
    _entries = entries
    starts = <uint32_t *>PyMem_Realloc(_starts, (n + 1) * sizeof(uint32_t))
    if starts == NULL:
        raise MemoryError()
    _starts = starts
    keys = <uint64_t *>PyMem_Realloc(_keys, n * sizeof(uint64_t))
    if keys == NULL:
        raise MemoryError()
    _keys = keys
    _capacity = n
    return 0


cdef int order_into(const Rows *rows, const double *scores, long long *order) except -1:
    # A bucket sort on the rank keys: key - lowest key, shifted right until at most n
    # buckets remain, is monotonic in the key, so the buckets come in order and only
    # candidates sharing one need comparing. The keys are a double's bits, so the buckets
    # are spaced like floating point numbers: finer near zero, coarser for the far outliers
    # (on-demand bonuses, long waits) that would stretch evenly spaced buckets and crowd
    # the bulk of the scores into a few. One pass for the keys, one counting pass, one
    # scatter, short sorts.
    cdef Py_ssize_t i, b, end, n = rows.n, n_buckets
    cdef uint64_t k, low = UINT64_MAX, high = 0, span
    cdef int shift = 0
    cdef uint32_t *starts
    cdef uint64_t *keys
    cdef Entry *entries
    if n == 0:
        return 0
    if n >= <Py_ssize_t>UINT32_MAX:
        raise ValueError(f"too many candidates for one cycle: {n}")
    _reserve(n)
    starts, entries, keys = _starts, _entries, _keys
    for i in range(n):
        k = _rank_bits(scores[i])
        keys[i] = k
        if k < low:
            low = k
        if k > high:
            high = k
    span = high - low
    while (span >> shift) >= <uint64_t>n:
        shift += 1
    n_buckets = <Py_ssize_t>(span >> shift) + 1
    # Counting pass: starts[b + 1] counts bucket b, then becomes where bucket b + 1 starts.
    memset(starts, 0, (n_buckets + 1) * sizeof(uint32_t))
    for i in range(n):
        starts[((keys[i] - low) >> shift) + 1] += 1
    for b in range(n_buckets):
        starts[b + 1] += starts[b]
    # Keys travel with their index so that sorting a bucket reads memory in order.
    for i in range(n):
        k = keys[i]
        b = <Py_ssize_t>((k - low) >> shift)
        entries[starts[b]].key = k
        entries[starts[b]].idx = i
        starts[b] += 1
    # starts[b] is now where bucket b ends, and so where bucket b + 1 begins.
    b = 0
    for i in range(n_buckets):
        end = starts[i]
        if end - b > 1:
            _sort_run(&entries[b], end - b, rows.eligible_at, rows.job_ids)
        b = end
    for i in range(n):
        order[i] = entries[i].idx
    return 0
