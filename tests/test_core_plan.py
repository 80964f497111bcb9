"""Planning a cycle: score order, specialist slots first, reservations, on both cores."""

import pytest

from fairsched.core import compiled_error, implementations
from tests.core_pools import EXCEL, INDEX, PDF, seed_pool

IMPLS = implementations()


def plan(core, pool, now, rows, weights=None, **kw):
    """rows: (type, priority, eligible_at, on_demand, job_id); returns [(job_id, slot_id)]."""
    cands = core.Candidates()
    for row in rows:
        cands.append(*row)
    idx, slots = core.plan_cycle(pool, cands, now, weights or core.Weights(), **kw)
    assert (idx.typecode, slots.typecode) == ("q", "q")
    return [(cands.job_ids[i], s) for i, s in zip(idx, slots, strict=True)]


def test_pdf_job_takes_pdf_slot_over_versatile_ones(core):
    pool = seed_pool(core)
    assert plan(core, pool, 0.0, [(PDF, 0, 0.0, 0, 10)]) == [(10, 3)]
    assert pool.is_busy(3) and not pool.is_busy(2) and not pool.is_busy(1)


def test_planning_keeps_the_versatile_slot_for_the_index_job(core):
    pool = core.SlotPool()
    pool.add_slot(1, 100, [PDF, EXCEL, INDEX])
    pool.add_slot(2, 200, [PDF])
    # The pdf job scores far higher and goes first, yet leaves the only index slot alone.
    rows = [(INDEX, 0, 0.0, 0, 20), (PDF, 9, 0.0, 0, 10)]
    assert plan(core, pool, 0.0, rows) == [(10, 2), (20, 1)]


def test_versatile_slot_taken_only_when_no_specialist_is_free(core):
    pool = seed_pool(core)
    rows = [(PDF, 5, 0.0, 0, 1), (PDF, 4, 0.0, 0, 2), (PDF, 3, 0.0, 0, 3), (PDF, 2, 0.0, 0, 4)]
    assert plan(core, pool, 0.0, rows) == [(1, 3), (2, 2), (3, 1)]
    assert pool.n_free == 0


def test_pairs_come_in_score_order_and_unplaceable_jobs_are_skipped(core):
    pool = seed_pool(core)
    rows = [
        (EXCEL, 1, 0.0, 0, 1),
        (7, 10, 0.0, 0, 2),  # a type no slot supports
        (-3, 10, 0.0, 0, 3),
        (INDEX, 0, 0.0, 1, 4),  # on demand: first
        (INDEX, 3, 0.0, 0, 5),  # its only slot went to job 4
    ]
    assert plan(core, pool, 0.0, rows) == [(4, 1), (1, 2)]
    assert pool.n_free == 1 and pool.free_count(PDF) == 1


def test_rarity_is_judged_on_free_slots_at_cycle_start(core):
    pool = core.SlotPool()
    pool.add_slot(1, 1, [PDF])
    pool.add_slot(2, 1, [EXCEL])
    pool.add_slot(3, 1, [EXCEL])
    # Same priority and age: the pdf job (1 free slot, +500) beats the excel one (+250).
    assert plan(core, pool, 0.0, [(EXCEL, 0, 0.0, 0, 1), (PDF, 0, 0.0, 0, 2)]) == [(2, 1), (1, 2)]


def test_busy_slots_are_not_planned_and_release_returns_them(core):
    pool = seed_pool(core)
    assert pool.acquire_slot(3)
    assert plan(core, pool, 0.0, [(PDF, 0, 0.0, 0, 1)]) == [(1, 2)]
    assert pool.release(2) and pool.release(3)
    assert plan(core, pool, 0.0, [(PDF, 0, 0.0, 0, 2)]) == [(2, 3)]


def test_empty_pool_and_empty_candidates(core):
    pool = core.SlotPool()
    assert plan(core, pool, 0.0, [(PDF, 0, 0.0, 0, 1)]) == []
    assert plan(core, seed_pool(core), 0.0, []) == []


def test_a_full_pool_places_nothing(core):
    pool = seed_pool(core)
    for sid in (1, 2, 3):
        pool.acquire_slot(sid)
    assert plan(core, pool, 0.0, [(PDF, 10, 0.0, 1, 1)]) == []


def test_low_priority_job_is_not_starved_by_a_stream_of_priority_5_jobs(core):
    # One pdf slot; every 10 s a fresh priority-5 job arrives and the slot frees up again.
    pool = core.SlotPool()
    pool.add_slot(1, 1, [PDF])
    old = (PDF, 0, 0.0, 0, 1)
    started_at = None
    for step in range(100):
        now = step * 10.0
        placed = plan(core, pool, now, [old, (PDF, 5, now, 0, 1000 + step)])
        assert len(placed) == 1
        pool.release(1)
        if placed[0][0] == 1:
            started_at = now
            break
    assert started_at == 320.0


def test_queued_job_is_not_starved_by_a_stream_of_on_demand_requests(core):
    pool = core.SlotPool()
    pool.add_slot(1, 1, [PDF])
    queued = (PDF, 0, 0.0, 0, 1)
    for step in range(100):
        now = step * 16.0
        placed = plan(core, pool, now, [queued, (PDF, 0, now, 1, 1000 + step)])
        pool.release(1)
        if placed[0][0] == 1:
            break
    assert now == 256.0


@pytest.mark.parametrize("matching", ["fastest", None])
def test_unknown_matching_is_refused(core, matching):
    pool = seed_pool(core)
    with pytest.raises(ValueError, match="matching must be 'greedy' or 'optimal'"):
        plan(core, pool, 0.0, [(PDF, 0, 0.0, 0, 1)], matching=matching)
    assert pool.n_free == 3


def test_pool_of_the_other_implementation_is_refused(core):
    other = IMPLS["py" if core.impl == "c" else "c"]
    if other is None:
        pytest.fail(f"compiled core did not load ({compiled_error()}): run `make build`")
    with pytest.raises(TypeError):
        core.plan_cycle(other.SlotPool(), core.Candidates(), 0.0, core.Weights())


def test_optimal_matching_places_the_job_greedy_strands(core):
    # Free slots [A, B] (id 0) and [A, C] (id 1); jobs A (older: it scores first) then B. Greedy hands the
    # A job slot 0 (same specialisation, lower id) and strands B; optimal places both.
    A, B, C = 0, 1, 2
    results = {}
    for matching in ("greedy", "optimal"):
        pool = core.SlotPool()
        pool.add_slot(0, 1, [A, B])
        pool.add_slot(1, 2, [A, C])
        cands = core.Candidates.from_lists([A, B], [0, 0], [0.0, 100.0], [0, 0], [1, 2])
        idx, slots = core.plan_cycle(pool, cands, 100.0, core.Weights(), matching=matching)
        results[matching] = sorted(zip(idx, slots, strict=True))
    assert results["greedy"] == [(0, 0)]
    assert results["optimal"] == [(0, 1), (1, 0)]
