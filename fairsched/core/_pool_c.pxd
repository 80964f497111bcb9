cimport cython
from libc.stdint cimport int64_t


cdef struct SlotRec:
    int64_t slot_id
    int64_t worker_id
    int64_t *types          # the slot's type ids, as given
    Py_ssize_t *where       # where[k]: this slot's position in the index of types[k]
    Py_ssize_t n_types
    bint busy
    bint live


cdef struct TypeIndex:
    Py_ssize_t *recs        # records of this type's slots, most specialised first
    Py_ssize_t n
    Py_ssize_t cap
    Py_ssize_t hint         # every position below hint holds a busy slot
    int64_t n_free


@cython.final
cdef class SlotPool:
    cdef SlotRec *recs
    cdef Py_ssize_t n_recs
    cdef Py_ssize_t cap_recs
    cdef Py_ssize_t *spare  # records of removed slots, for reuse
    cdef Py_ssize_t n_spare
    cdef TypeIndex *index
    cdef Py_ssize_t n_index
    cdef dict by_id         # slot id -> record
    cdef Py_ssize_t free_total

    cdef int64_t take(self, int64_t type_id) noexcept
    cdef inline void occupy(self, Py_ssize_t r) noexcept
    cdef void vacate(self, Py_ssize_t r) noexcept
    cdef int grow_index(self, Py_ssize_t n_types) except -1
    cdef int reserve_type(self, int64_t type_id) except -1
    cdef Py_ssize_t new_record(self) except -1
    cdef void insert(self, Py_ssize_t r, Py_ssize_t k) noexcept
    cdef void compact(self, int64_t type_id) noexcept
    cdef Py_ssize_t record_of(self, slot_id) except -2
    cdef Py_ssize_t get_record(self, slot_id) except -1
