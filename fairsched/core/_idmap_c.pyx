"""A table from job id (any 64-bit integer) to a place number, for the compiled candidate
cache: open addressing with linear probing, at most half full, and backward-shift deletion.
C functions only, with no Python API of their own, so no pure-Python twin: _cache_py keys a
dict by job id where _cache_c uses this table.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int64_t, uint64_t


cdef inline Py_ssize_t _home(const IdMap *m, int64_t key) noexcept:
    # splitmix64's finaliser: ids in a run spread over the whole table.
    cdef uint64_t x = <uint64_t>key
    x ^= x >> 30
    x *= <uint64_t>0xbf58476d1ce4e5b9ULL
    x ^= x >> 27
    x *= <uint64_t>0x94d049bb133111ebULL
    x ^= x >> 31
    return <Py_ssize_t>(x & <uint64_t>m.mask)


cdef int map_init(IdMap *m, Py_ssize_t places) except -1:
    cdef int64_t *keys = <int64_t *>PyMem_Malloc(places * sizeof(int64_t))
    cdef Py_ssize_t *values = <Py_ssize_t *>PyMem_Malloc(places * sizeof(Py_ssize_t))
    cdef Py_ssize_t p
    if keys == NULL or values == NULL:
        PyMem_Free(keys)
        PyMem_Free(values)
        raise MemoryError()
    for p in range(places):
        values[p] = -1
    m.keys, m.values, m.mask, m.used = keys, values, places - 1, 0
    return 0


cdef void map_free(IdMap *m) noexcept:
    PyMem_Free(m.keys)
    PyMem_Free(m.values)
    m.keys = NULL
    m.values = NULL


cdef Py_ssize_t map_find(const IdMap *m, int64_t key) noexcept:
    # The place holding key, or -1.
    cdef Py_ssize_t p = _home(m, key)
    while m.values[p] >= 0:
        if m.keys[p] == key:
            return p
        p = (p + 1) & m.mask
    return -1


cdef void map_insert(IdMap *m, int64_t key, Py_ssize_t value) noexcept:
    # key is absent and _map_reserve made room for it.
    cdef Py_ssize_t p = _home(m, key)
    while m.values[p] >= 0:
        p = (p + 1) & m.mask
    m.keys[p] = key
    m.values[p] = value
    m.used += 1


cdef int map_reserve(IdMap *m, Py_ssize_t more) except -1:
    # Room for `more` new keys at most half full, so that probes stay short.
    cdef Py_ssize_t places = m.mask + 1, p
    cdef IdMap bigger
    if (m.used + more) * 2 <= places:
        return 0
    while (m.used + more) * 2 > places:
        places *= 2
    map_init(&bigger, places)
    for p in range(m.mask + 1):
        if m.values[p] >= 0:
            map_insert(&bigger, m.keys[p], m.values[p])
    map_free(m)
    m[0] = bigger
    return 0


cdef bint map_delete(IdMap *m, int64_t key) noexcept:
    # The keys after the hole that probed past it move back into it, so no lookup needs
    # tombstones.
    cdef Py_ssize_t hole = map_find(m, key), p, home
    if hole < 0:
        return False
    p = hole
    while True:
        p = (p + 1) & m.mask
        if m.values[p] < 0:
            break
        home = _home(m, m.keys[p])
        # The key at p may move back unless its home lies cyclically in (hole, p].
        if (home <= hole or home > p) if p > hole else (home <= hole and home > p):
            m.keys[hole] = m.keys[p]
            m.values[hole] = m.values[p]
            hole = p
    m.values[hole] = -1
    m.used -= 1
    return True
