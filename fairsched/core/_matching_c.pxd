from libc.stdint cimport int64_t

from fairsched.core._pool_c cimport SlotPool
from fairsched.core._scoring_c cimport Rows, ScoreWeights


cdef struct Graph:
    # The bipartite graph of one optimal-matching cycle. Nodes are the slots free at the
    # start of the cycle; jobs are counted by type, since jobs of one type are
    # interchangeable for slots. Arrays are indexed by type id or node id, owned by the caller.
    int64_t *adj_start      # per type: first entry in adj
    int64_t *adj_len        # per type: its free slots (0: not a candidate type this cycle)
    int64_t *adj            # per type, its nodes, most specialised first
    int64_t *occ            # per node: type of the job planned on it, -1 while spare
    int64_t *via_slot       # per node: type whose job moves in on the path being built
    int64_t *slot_seen      # per node: last search that reached it
    int64_t *type_seen      # per type: last search that reached it
    int64_t *via_type       # per type: node its moving job leaves, -1 for the new job
    int64_t *queue          # types to expand, breadth first
    int64_t stamp


cdef Py_ssize_t plan_into(SlotPool pool, const Rows *rows, double now, ScoreWeights w,
                          bint optimal, double *scores, long long *order, long long *idx_out,
                          long long *slot_out) except -1

cdef bint _augment(Graph *g, int64_t start) noexcept nogil
