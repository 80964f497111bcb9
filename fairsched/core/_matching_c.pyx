"""Compiled planning of one scheduling cycle: which candidate job goes to which slot."""

from cpython.array cimport array, clone, resize
from libc.stdint cimport int64_t

from fairsched.core._pool_c cimport SlotPool, TypeIndex
from fairsched.core._scoring_c cimport (
    Columns,
    Rows,
    ScoreWeights,
    columns_of,
    score_and_order,
    weights_of,
)

from fairsched.core._checks import check_candidates, check_matching, check_now

cdef array _DOUBLE_ARRAY = array("d")
cdef array _INT64_ARRAY = array("q")


def plan_cycle(SlotPool pool not None, cands, now, weights, matching="greedy"):
    """Reserve slots for the best candidates; return (cand_idx, slot_ids) in score order.

    Candidates are scored once against the pool's free counts at the start of the cycle
    and walked in score order; each takes the most specialised free slot of its type, if
    any. The returned slots are left reserved: the caller dispatches them, or releases the
    slot of a job whose claim was lost.
    """
    check_matching(matching)
    if matching == "optimal":
        return plan_optimal(pool, cands, now, weights)
    return _plan(pool, cands, now, weights, False)


cdef tuple _plan(SlotPool pool, cands, now, weights, bint optimal):
    cdef Py_ssize_t n = check_candidates(cands)
    cdef double t = check_now(now)
    cdef ScoreWeights w = weights_of(weights)
    cdef Columns columns = columns_of(cands, n)
    cdef array scores = clone(_DOUBLE_ARRAY, n, zero=False)
    cdef array order = clone(_INT64_ARRAY, n, zero=False)
    cdef Py_ssize_t room = min(n, pool.free_total)
    cdef array cand_idx = clone(_INT64_ARRAY, room, zero=False)
    cdef array slot_ids = clone(_INT64_ARRAY, room, zero=False)
    cdef Py_ssize_t placed = plan_into(pool, &columns.rows, t, w, optimal,
                                       scores.data.as_doubles, order.data.as_longlongs,
                                       cand_idx.data.as_longlongs, slot_ids.data.as_longlongs)
    resize(cand_idx, placed)
    resize(slot_ids, placed)
    return cand_idx, slot_ids


cdef Py_ssize_t plan_into(SlotPool pool, const Rows *rows, double now, ScoreWeights w,
                          bint optimal, double *scores, long long *order, long long *idx_out,
                          long long *slot_out) except -1:
    # The planning of plan_cycle and plan_optimal, on columns and into buffers the caller
    # owns: scores and order of rows.n entries, idx_out and slot_out of min(rows.n, free
    # slots). Returns how many jobs were placed.
    if optimal:
        return _optimal(pool, rows, now, w, scores, order, idx_out, slot_out)
    cdef Py_ssize_t j, i, n = rows.n, placed = 0
    cdef long long slot_id
    cdef array free = pool.free_counts(pool.n_index)
    score_and_order(rows, now, free, w, scores, order)
    for j in range(n):
        if pool.free_total == 0:
            break
        i = order[j]
        slot_id = pool.take(rows.types[i])
        if slot_id >= 0:
            idx_out[placed] = i
            slot_out[placed] = slot_id
            placed += 1
    return placed


# -- optimal matching ---------------------------------------------------------------------------

# The only reads of the pool's slot records (besides its per-type index), kept in one place.
cdef inline bint _is_busy(SlotPool pool, Py_ssize_t r) noexcept:
    return pool.recs[r].busy


cdef inline int64_t _slot_id(SlotPool pool, Py_ssize_t r) noexcept:
    return pool.recs[r].slot_id


cdef inline int64_t *_data(array a) noexcept:
    return <int64_t *>a.data.as_voidptr


cdef inline array _filled(Py_ssize_t n, int64_t value):
    cdef array a = clone(_INT64_ARRAY, n, zero=False)
    cdef int64_t *p = _data(a)
    cdef Py_ssize_t k
    for k in range(n):
        p[k] = value
    return a


cdef bint _augment(Graph *g, int64_t start) noexcept nogil:
    # Breadth-first search for a path start -> slot <- planned job -> other slot ... -> spare
    # slot; apply it and return True, or return False leaving the plan unchanged.
    cdef int64_t stamp, u, v, s, k, end
    cdef Py_ssize_t head = 0, tail = 1
    g.stamp += 1
    stamp = g.stamp
    g.queue[0] = start
    g.type_seen[start] = stamp
    g.via_type[start] = -1
    while head < tail:
        u = g.queue[head]
        head += 1
        end = g.adj_start[u] + g.adj_len[u]
        for k in range(g.adj_start[u], end):
            s = g.adj[k]
            if g.slot_seen[s] == stamp:
                continue
            g.slot_seen[s] = stamp
            g.via_slot[s] = u
            v = g.occ[s]
            if v < 0:
                while s >= 0:
                    u = g.via_slot[s]
                    g.occ[s] = u
                    s = g.via_type[u]
                return True
            if g.type_seen[v] != stamp:
                g.type_seen[v] = stamp
                g.via_type[v] = s
                g.queue[tail] = v
                tail += 1
    return False


def plan_optimal(SlotPool pool not None, cands, now, weights):
    """Like plan_cycle, but placing the most high-score jobs a cycle can place at once.

    Each candidate, in score order, is admitted if an augmenting path exists (planned jobs
    that can each move to another free slot of their type, ending at a spare slot): the
    greedy algorithm of the transversal matroid, so the placed set is a maximum matching
    and the best by score among those. Each type's slots are tried most specialised first.
    A type that finds no path is dropped for the cycle, so the search runs at most
    (free slots + types) times. Slots are left reserved; pairs come in score order.
    """
    return _plan(pool, cands, now, weights, True)


cdef Py_ssize_t _optimal(SlotPool pool, const Rows *rows, double t_now, ScoreWeights w,
                         double *scores, long long *ranked, long long *idx_out,
                         long long *slot_out) except -1:
    cdef Py_ssize_t n = rows.n
    cdef int64_t n_free = pool.free_total
    if n == 0 or n_free == 0:
        return 0
    cdef Py_ssize_t n_types = pool.n_index
    cdef array free = pool.free_counts(n_types)
    score_and_order(rows, t_now, free, w, scores, ranked)
    cdef const long long *types = rows.types

    cdef array adj_start = clone(_INT64_ARRAY, n_types, zero=True)
    cdef array adj_len = clone(_INT64_ARRAY, n_types, zero=True)
    cdef array type_seen = clone(_INT64_ARRAY, n_types, zero=True)
    cdef array via_type = clone(_INT64_ARRAY, n_types, zero=True)
    cdef array queue = clone(_INT64_ARRAY, n_types, zero=True)
    cdef array dead = clone(_INT64_ARRAY, n_types, zero=True)
    cdef array node_of = _filled(pool.n_recs, -1)
    cdef array node_rec = clone(_INT64_ARRAY, pool.n_recs, zero=True)
    cdef Graph g
    g.adj_start = _data(adj_start)
    g.adj_len = _data(adj_len)
    g.type_seen = _data(type_seen)
    g.via_type = _data(via_type)
    g.queue = _data(queue)
    g.stamp = 0
    cdef int64_t *dead_p = _data(dead)
    cdef int64_t *node_of_p = _data(node_of)
    cdef int64_t *node_rec_p = _data(node_rec)

    # Candidate types with a free slot, and room for their free slots in adj.
    cdef Py_ssize_t i, j, p, k
    cdef int64_t t, total = 0, n_nodes = 0, r, node, n_placed = 0, end
    cdef TypeIndex *ix
    for i in range(n):
        t = types[i]
        if 0 <= t < n_types and g.adj_len[t] == 0 and pool.index[t].n_free > 0:
            g.adj_len[t] = pool.index[t].n_free
            g.adj_start[t] = total
            total += g.adj_len[t]
    cdef array adj = clone(_INT64_ARRAY, total, zero=True)
    g.adj = _data(adj)
    for t in range(n_types):
        if g.adj_len[t] == 0:
            continue
        ix = &pool.index[t]
        k = g.adj_start[t]
        end = k + g.adj_len[t]
        for p in range(ix.hint, ix.n):
            if k == end:  # n_free free slots found: the rest are busy
                break
            r = ix.recs[p]
            if _is_busy(pool, r):
                continue
            node = node_of_p[r]
            if node < 0:
                node = n_nodes
                n_nodes += 1
                node_of_p[r] = node
                node_rec_p[node] = r
            g.adj[k] = node
            k += 1
        g.adj_len[t] = k - g.adj_start[t]
    cdef array occ = _filled(n_nodes, -1)
    cdef array via_slot = clone(_INT64_ARRAY, n_nodes, zero=True)
    cdef array slot_seen = clone(_INT64_ARRAY, n_nodes, zero=True)
    g.occ = _data(occ)
    g.via_slot = _data(via_slot)
    g.slot_seen = _data(slot_seen)

    cdef array placed = clone(_INT64_ARRAY, min(<int64_t>n, n_free), zero=False)
    cdef int64_t *placed_p = _data(placed)
    for j in range(n):
        i = ranked[j]
        t = types[i]
        if t < 0 or t >= n_types or g.adj_len[t] == 0 or dead_p[t]:
            continue
        if _augment(&g, t):
            placed_p[n_placed] = i
            n_placed += 1
            if n_placed == n_free:
                break
        else:
            dead_p[t] = 1

    # Jobs of a type take its planned slots most specialised first, best score first.
    cdef int64_t *cursor = g.adj_start  # no longer needed as a start: reused as a cursor
    for j in range(n_placed):
        i = placed_p[j]
        t = types[i]
        k = cursor[t]
        while g.occ[g.adj[k]] != t:
            k += 1
        cursor[t] = k + 1
        r = node_rec_p[g.adj[k]]
        idx_out[j] = i
        slot_out[j] = _slot_id(pool, r)
        pool.acquire_slot(slot_out[j])
    return n_placed
