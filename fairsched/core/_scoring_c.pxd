from libc.stdint cimport uint64_t


cdef struct ScoreWeights:
    double priority
    double age
    double rarity
    double on_demand
    double on_demand_age


cdef struct Entry:
    uint64_t key            # sorts like -score (see _rank_bits)
    long long idx


cdef struct FullKey:
    uint64_t key
    double eligible_at
    long long job_id
    long long idx


cdef ScoreWeights weights_of(weights) except *

cdef int score_into(const long long[::1] types, const long long[::1] priorities,
                    const double[::1] eligible_at, const unsigned char[::1] on_demand,
                    double now, const long long[::1] free_counts, ScoreWeights w,
                    double[::1] scores) except -1

cdef int order_into(const double[::1] scores, const double[::1] eligible_at,
                    const long long[::1] job_ids, long long[::1] order) except -1

cdef int score_and_order(cands, double now, const long long[::1] free_counts,
                         ScoreWeights w, double[::1] scores, long long[::1] order) except -1
