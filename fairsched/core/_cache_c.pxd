cimport cython

from fairsched.core._idmap_c cimport IdMap


@cython.final
cdef class CandidateCache:
    # Every job id known (waiting, or being claimed) has an entry that keeps its place while
    # the job is known; the waiting jobs also have a row. Rows 0 .. n-1 are planned column by
    # column; a removed row's place takes the last row, so moving a row rewrites one entry's
    # row, never the id table. A queued job placed keeps its row, of type -1 (placed nowhere),
    # until its claim's answer: n_dead such rows. A claim's state is kept with the job's row
    # while it has one, else with its entry.
    cdef long long *types
    cdef long long *priorities
    cdef double *eligible_at        # as given: a queued job's on the queue's clock
    cdef unsigned char *on_demand
    cdef long long *job_ids
    cdef long long *tenants         # tenant id, -1: none (no tenant term)
    cdef Py_ssize_t *row_entry      # the entry of each row
    cdef unsigned char *row_claim   # its job's claim: 0 none, 1 on its way, 2 and cancelled
    cdef Py_ssize_t n
    cdef Py_ssize_t n_dead
    cdef Py_ssize_t cap
    # Scratch for planning, cap long each, kept from one cycle to the next.
    cdef double *shifted            # eligible_at on this host's clock
    cdef long long *masked          # types, with the queued rows' made unplaceable (-1)
    cdef double *scores
    cdef long long *order
    cdef long long *placed_idx
    cdef long long *placed_slots
    # Entries, by place.
    cdef Py_ssize_t *entry_row      # -1: not waiting
    cdef unsigned char *entry_claim  # as row_claim, for an entry without a row
    cdef long long *entry_job_id
    cdef list objects               # the caller's object for the job (None for a free entry)
    cdef Py_ssize_t *spare          # entries free for reuse
    cdef Py_ssize_t n_spare
    cdef Py_ssize_t n_entries       # entries made so far (used or spare)
    cdef Py_ssize_t entry_cap
    cdef IdMap by_id                # job id -> entry
    cdef Py_ssize_t claiming
    cdef long long *queued_per_type  # queued rows by type id
    cdef Py_ssize_t n_types         # entries in queued_per_type
    cdef Py_ssize_t on_demand_rows

    cdef int reserve(self, Py_ssize_t rows, Py_ssize_t more) except -1
    cdef int reserve_type(self, long long type_id) except -1
    cdef int put(self, long long job_id, long long type_id, long long priority,
                 double eligible_at, bint on_demand, object job, long long tenant) except -1
    cdef inline void uncount(self, Py_ssize_t r) noexcept
    cdef Py_ssize_t take_row(self, Py_ssize_t r) noexcept
    cdef inline unsigned char *claim_of(self, Py_ssize_t e) noexcept
    cdef int free_entry(self, Py_ssize_t e) except -1
    cdef int drop_row(self, Py_ssize_t r) except -1
    cdef Py_ssize_t drop_queued(self, long long type_id) except -1
    cdef Py_ssize_t row_of(self, job_id) except -2
    cdef Py_ssize_t entry_of(self, job_id) except -2
