"""Pure-Python twin of _matching_c: plan one scheduling cycle (which job goes to which slot)."""

from array import array
from collections import deque

from fairsched.core._checks import check_candidates, check_matching, check_now, check_weights
from fairsched.core._pool_py import SlotPool
from fairsched.core._scoring_py import order, score


def plan_cycle(pool, cands, now, weights, matching="greedy"):
    """Reserve slots for the best candidates; return (cand_idx, slot_ids) in score order.

    Candidates are scored once against the pool's free counts at the start of the cycle
    and walked in score order; each takes the most specialised free slot of its type, if
    any. The returned slots are left reserved: the caller dispatches them, or releases the
    slot of a job whose claim was lost.
    """
    check_matching(matching)
    if matching == "optimal":
        return plan_optimal(pool, cands, now, weights)
    if not isinstance(pool, SlotPool):
        raise TypeError(f"pool must be a {SlotPool.__module__}.SlotPool, "
                        f"got {type(pool).__module__}.{type(pool).__name__}")
    n = check_candidates(cands)
    now = check_now(now)
    w = check_weights(weights)
    scores = score(cands, now, pool.free_counts(pool.n_type_ids), w)
    cand_idx = array("q")
    slot_ids = array("q")
    types = cands.types
    take = pool._take
    for i in order(cands, scores, n):
        if not pool.n_free:
            break
        slot_id = take(types[i])
        if slot_id >= 0:
            cand_idx.append(i)
            slot_ids.append(slot_id)
    return cand_idx, slot_ids


# -- optimal matching -------------------------------------------------------------------------

def plan_optimal(pool, cands, now, weights):
    """Like plan_cycle, but placing the most high-score jobs a cycle can place at once.

    Greedy matching can strand a job: with free slots [A,B] and [A,C] and jobs A then B,
    the A job takes [A,B] (equally specialised, lower id) and the B job finds nothing,
    while A on [A,C] and B on [A,B] places both. Here each candidate, in score order, is
    admitted if an augmenting path exists: a chain of planned jobs that can each move to
    another free-at-start slot of their type, ending at a slot still spare. That is the
    greedy algorithm of the transversal matroid, so the placed set is a maximum matching
    and, among those, the best by score (a maximum-weight matching for any weights that grow
    with the score). Paths are searched breadth first and each type's slots are tried most
    specialised first, so when no job is in the way a candidate gets exactly greedy's slot.

    Jobs of one type are interchangeable for slots: once a type finds no path it never
    will this cycle, and at most free_count(type) of its candidates are placed, so the
    search runs at most (free slots + types) times, on the top free_count(T) candidates of
    each type T. The returned slots are left reserved, pairs in score order.
    """
    if not isinstance(pool, SlotPool):
        raise TypeError(f"pool must be a {SlotPool.__module__}.SlotPool, "
                        f"got {type(pool).__module__}.{type(pool).__name__}")
    n = check_candidates(cands)
    now = check_now(now)
    w = check_weights(weights)
    cand_idx = array("q")
    slot_ids = array("q")
    n_free = pool.n_free
    if not n or not n_free:
        return cand_idx, slot_ids
    free = pool.free_counts(pool.n_type_ids)
    scores = score(cands, now, free, w)
    types = cands.types
    n_types = len(free)
    # Free slots of each candidate type, most specialised first (the pool's own order).
    adj = {}
    for t in set(types):
        if 0 <= t < n_types and free[t]:
            adj[t] = [s.slot_id for s in pool._index[t] if not s.busy]
    occ = {}  # slot id -> type of the job planned on it
    placed = []
    dead = set()
    for i in order(cands, scores, n):
        t = types[i]
        if t in dead or t not in adj:
            continue
        if augment(t, adj, occ):
            placed.append(i)
            if len(placed) == n_free:
                break
        else:
            dead.add(t)
    # Jobs of a type take its planned slots most specialised first, best score first.
    cursor = dict.fromkeys(adj, 0)
    for i in placed:
        t = types[i]
        slots = adj[t]
        k = cursor[t]
        while occ.get(slots[k]) != t:
            k += 1
        cursor[t] = k + 1
        pool.acquire_slot(slots[k])
        cand_idx.append(i)
        slot_ids.append(slots[k])
    return cand_idx, slot_ids


def augment(start, adj, occ):
    """Plan one more job of type `start` if an augmenting path exists; True when it did.

    adj maps a type to its candidate slots in preference order (any mapping; only types
    reached are looked up); occ maps a planned slot to the type of its job and is updated.
    """
    via_slot = {}  # slot -> the type whose job moves into it
    via_type = {start: None}  # type -> the slot its moving job leaves (None: the new job)
    queue = deque((start,))
    while queue:
        u = queue.popleft()
        for s in adj[u]:
            if s in via_slot:
                continue
            via_slot[s] = u
            v = occ.get(s)
            if v is None:
                while s is not None:
                    u = via_slot[s]
                    occ[s] = u
                    s = via_type[u]
                return True
            if v not in via_type:
                via_type[v] = s
                queue.append(v)
    return False
