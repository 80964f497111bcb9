from libc.stdint cimport int64_t


cdef struct IdMap:
    # Open addressing with linear probing, keyed by job id; at most half full.
    int64_t *keys
    Py_ssize_t *values      # -1 marks an empty place
    Py_ssize_t mask         # places - 1, places a power of two
    Py_ssize_t used


cdef int map_init(IdMap *m, Py_ssize_t places) except -1
cdef void map_free(IdMap *m) noexcept
cdef Py_ssize_t map_find(const IdMap *m, int64_t key) noexcept
cdef void map_insert(IdMap *m, int64_t key, Py_ssize_t value) noexcept
cdef int map_reserve(IdMap *m, Py_ssize_t more) except -1
cdef bint map_delete(IdMap *m, int64_t key) noexcept
