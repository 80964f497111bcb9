cimport cython
from libc.stdint cimport uint64_t


cdef struct ScoreWeights:
    double priority
    double age
    double rarity
    double on_demand
    double on_demand_age
    double tenant


cdef struct Rows:
    # One cycle's candidates, column by column: n rows (the columns are NULL when n is 0).
    const long long *types
    const long long *priorities
    const double *eligible_at
    const unsigned char *on_demand
    const long long *job_ids
    const long long *tenants
    Py_ssize_t n
    # Each tenant id's usage share (0 .. 1); a row whose tenant id is not below n_shares
    # gets no tenant term.
    const double *shares
    Py_ssize_t n_shares


cdef struct Entry:
    uint64_t key            # sorts like -score (see _rank_bits)
    long long idx


cdef struct FullKey:
    uint64_t key
    double eligible_at
    long long job_id
    long long idx


@cython.final
cdef class Columns:
    # A Candidates' columns as typed views, and the Rows pointing into them (valid while the
    # Columns lives and the Candidates is not resized).
    cdef const long long[::1] types
    cdef const long long[::1] priorities
    cdef const double[::1] eligible_at
    cdef const unsigned char[::1] on_demand
    cdef const long long[::1] job_ids
    cdef const long long[::1] tenants
    cdef object shares  # the checked array('d') rows.shares points into
    cdef Rows rows


cdef Columns columns_of(cands, Py_ssize_t n)

cdef ScoreWeights weights_of(weights) except *

cdef double tenant_floor(const Rows *rows) noexcept

cdef int score_into(const Rows *rows, double now, const long long[::1] free_counts,
                    ScoreWeights w, double *scores) except -1

cdef int order_into(const Rows *rows, const double *scores, long long *order) except -1

cdef int score_and_order(const Rows *rows, double now, const long long[::1] free_counts,
                         ScoreWeights w, double *scores, long long *order) except -1
