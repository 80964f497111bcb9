"""Optimal matching per cycle (plan_optimal): never fewer jobs than greedy, twins agree."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairsched import core
from fairsched.core import _matching_py, _pool_py

W = core.Weights()
NOW = 1000.0


def _compiled():
    from fairsched.core import _matching_c, _pool_c

    return _pool_c.SlotPool, _matching_c


IMPLS = {
    "py": lambda: (_pool_py.SlotPool, _matching_py),
    "c": _compiled,
}


@pytest.fixture(params=["c", "py"])
def impl(request):
    """(SlotPool class, matching module) of one implementation."""
    return IMPLS[request.param]()


def make_pool(pool_cls, slots, busy=()):
    pool = pool_cls()
    for sid, types in enumerate(slots):
        pool.add_slot(sid, sid, types)
    for sid in busy:
        assert pool.acquire_slot(sid)
    return pool


def cands_of(jobs):
    """jobs: (type, priority, age) triples."""
    return core.Candidates.from_lists([j[0] for j in jobs], [j[1] for j in jobs],
                                      [NOW - j[2] for j in jobs], [False] * len(jobs),
                                      list(range(len(jobs))))


A, B, C, D = 0, 1, 2, 3


def test_greedy_strands_a_job_that_optimal_places(impl):
    pool_cls, matching = impl
    # Free slots [A,B] (id 0) and [A,C] (id 1): equally specialised, so greedy gives the A
    # job (the better score) the lower id, [A,B], and the B job finds no free slot.
    jobs = [(A, 5, 0.0), (B, 0, 0.0)]
    greedy_pool = make_pool(pool_cls, [(A, B), (A, C)])
    idx, slots = matching.plan_cycle(greedy_pool, cands_of(jobs), NOW, W)
    assert (list(idx), list(slots)) == ([0], [0])

    pool = make_pool(pool_cls, [(A, B), (A, C)])
    idx, slots = matching.plan_optimal(pool, cands_of(jobs), NOW, W)
    assert (list(idx), list(slots)) == ([0, 1], [1, 0])
    assert pool.n_free == 0 and pool.is_busy(0) and pool.is_busy(1)


def test_a_job_two_moves_away_is_placed(impl):
    pool_cls, matching = impl
    # Slots [A,D] (0), [A,B] (1), [B,C] (2); jobs A, B, D in score order. Greedy: A takes
    # [A,D] (lowest id of its equally specialised slots), B takes [A,B], D is stranded while
    # [B,C] stays free. Optimal finds D -> [A,D], A moves to [A,B], B moves to [B,C].
    slots = [(A, D), (A, B), (B, C)]
    jobs = [(A, 9, 0.0), (B, 8, 0.0), (D, 0, 0.0)]
    greedy = matching.plan_cycle(make_pool(pool_cls, slots), cands_of(jobs), NOW, W)
    assert [list(a) for a in greedy] == [[0, 1], [0, 1]]
    optimal = matching.plan_optimal(make_pool(pool_cls, slots), cands_of(jobs), NOW, W)
    assert [list(a) for a in optimal] == [[0, 1, 2], [1, 2, 0]]


def test_optimal_equals_greedy_when_nothing_is_in_the_way(impl):
    pool_cls, matching = impl
    slots = [(A,), (A, B), (A, B, C), (B,), (C,)]
    jobs = [(A, 3, 10.0), (A, 0, 5.0), (B, 1, 0.0), (C, 0, 1.0)]
    greedy = matching.plan_cycle(make_pool(pool_cls, slots), cands_of(jobs), NOW, W)
    optimal = matching.plan_optimal(make_pool(pool_cls, slots), cands_of(jobs), NOW, W)
    assert [list(a) for a in optimal] == [list(a) for a in greedy]


def test_unknown_types_empty_inputs_and_a_full_pool(impl):
    pool_cls, matching = impl
    pool = make_pool(pool_cls, [(A,)])
    assert [list(a) for a in matching.plan_optimal(pool, cands_of([]), NOW, W)] == [[], []]
    assert [list(a) for a in matching.plan_optimal(pool, cands_of([(7, 0, 0.0), (-1, 0, 0.0)]),
                                                   NOW, W)] == [[], []]
    assert pool.n_free == 1
    full = make_pool(pool_cls, [(A,)], busy=[0])
    assert [list(a) for a in matching.plan_optimal(full, cands_of([(A, 0, 0.0)]), NOW, W)] \
        == [[], []]


def test_bad_arguments_fail_the_same_way_as_plan_cycle(impl):
    pool_cls, matching = impl
    pool = make_pool(pool_cls, [(A,)])
    with pytest.raises(TypeError):
        matching.plan_optimal(object(), cands_of([]), NOW, W)
    with pytest.raises(TypeError):
        matching.plan_optimal(pool, [(A, 0, 0.0)], NOW, W)
    with pytest.raises(TypeError):
        matching.plan_optimal(pool, cands_of([]), NOW, {"priority": 1})
    with pytest.raises(ValueError):
        matching.plan_optimal(pool, cands_of([]), float("nan"), W)


# -- random cycles ------------------------------------------------------------------------------

N_TYPES = 4


@st.composite
def cycles(draw):
    n_slots = draw(st.integers(0, 9))
    slots = [tuple(draw(st.lists(st.integers(0, N_TYPES - 1), min_size=1, max_size=3,
                                 unique=True)))
             for _ in range(n_slots)]
    busy = [sid for sid in range(n_slots) if draw(st.booleans()) and draw(st.booleans())]
    jobs = draw(st.lists(st.tuples(st.integers(0, N_TYPES), st.integers(0, 10),
                                   st.floats(0, 600, allow_nan=False)), max_size=12))
    return slots, busy, jobs


def max_matching(slots, free, jobs):
    """Size of a maximum matching of jobs to free compatible slots (Kuhn's algorithm)."""
    owner = {}

    def try_job(j, seen):
        for s in free:
            if jobs[j][0] in slots[s] and s not in seen:
                seen.add(s)
                if s not in owner or try_job(owner[s], seen):
                    owner[s] = j
                    return True
        return False

    return sum(try_job(j, set()) for j in range(len(jobs)))


def check_plan(slots, busy, jobs, pool, idx, placed_slots, scores_order):
    free = [s for s in range(len(slots)) if s not in busy]
    assert len(set(placed_slots)) == len(placed_slots)
    for i, s in zip(idx, placed_slots, strict=True):
        assert s in free and jobs[i][0] in slots[s]
        assert pool.is_busy(s)
    assert pool.n_free == len(free) - len(idx)
    # Pairs come in score order.
    rank = {i: r for r, i in enumerate(scores_order)}
    assert [rank[i] for i in idx] == sorted(rank[i] for i in idx)
    # Specialist first: no placed job could move to a free compatible slot with fewer types.
    left = [s for s in free if s not in placed_slots]
    for i, s in zip(idx, placed_slots, strict=True):
        assert not any(jobs[i][0] in slots[f] and len(slots[f]) < len(slots[s]) for f in left)


@settings(max_examples=300, deadline=None)
@given(cycles())
def test_optimal_places_a_maximum_matching_never_fewer_than_greedy(cycle):
    slots, busy, jobs = cycle
    free = [s for s in range(len(slots)) if s not in busy]
    best = max_matching(slots, free, jobs)
    impls = [IMPLS["py"](), IMPLS["c"]()]
    results = []
    for pool_cls, matching in impls:
        greedy_pool = make_pool(pool_cls, slots, busy)
        greedy = matching.plan_cycle(greedy_pool, cands_of(jobs), NOW, W)
        pool = make_pool(pool_cls, slots, busy)
        cands = cands_of(jobs)
        order = core.score_candidates(cands, NOW, pool.free_counts(N_TYPES + 1), W)[1]
        idx, placed = matching.plan_optimal(pool, cands, NOW, W)
        assert len(idx) == best >= len(greedy[0])
        if len(greedy[0]) == len(jobs):  # nothing in the way: exactly greedy's plan
            assert (list(idx), list(placed)) == (list(greedy[0]), list(greedy[1]))
        check_plan(slots, busy, jobs, pool, list(idx), list(placed), list(order))
        results.append((list(idx), list(placed)))
    assert results[0] == results[1]  # the compiled module and its twin agree exactly


@settings(max_examples=200, deadline=None)
@given(cycles())
def test_placed_jobs_are_the_best_by_score(cycle):
    # Matroid greedy: a job is left out only if it could not be added to the better jobs
    # placed before it, so swapping any left-out job for a worse placed one is infeasible.
    slots, busy, jobs = cycle
    pool_cls, matching = IMPLS["c"]()
    pool = make_pool(pool_cls, slots, busy)
    cands = cands_of(jobs)
    order = list(core.score_candidates(cands, NOW, pool.free_counts(N_TYPES + 1), W)[1])
    idx = set(matching.plan_optimal(pool, cands, NOW, W)[0])
    free = [s for s in range(len(slots)) if s not in busy]
    for r, j in enumerate(order):
        if j in idx:
            continue
        better = [i for i in order[:r] if i in idx]
        assert max_matching(slots, free, [jobs[i] for i in better + [j]]) == len(better)
