"""The candidate cache: rows by job id, planned in place, on both cores."""

import math

import pytest

from tests.core_pools import EXCEL, INDEX, PDF, seed_pool


def test_rows_are_added_replaced_and_removed_by_job_id(core):
    cache = core.CandidateCache()
    assert cache.add(10, PDF, 1, 100.0, False, "job 10") is True
    assert cache.add(11, EXCEL, 2, 50.0, False, "job 11") is True
    assert cache.add(-1, PDF, 0, 120.0, True, "request 1") is True
    # The same job id again replaces its row, type and kind included.
    assert cache.add(10, EXCEL, 3, 90.0, False, "job 10 again") is False
    assert (len(cache), cache.n_queued, cache.n_on_demand) == (3, 2, 1)
    assert (cache.queued_of(PDF), cache.queued_of(EXCEL), cache.queued_of(INDEX)) == (0, 2, 0)
    assert cache.get(10) == "job 10 again" and 10 in cache and cache.get(12, "none") == "none"
    assert cache.rows_list() == [(-1, PDF, 0, 120.0, True), (10, EXCEL, 3, 90.0, False),
                                 (11, EXCEL, 2, 50.0, False)]
    assert cache.remove(11) is True and cache.remove(11) is False
    assert cache.jobs_of(on_demand=False) == ["job 10 again"]
    assert cache.jobs_of(on_demand=True) == ["request 1"]
    # Anything that is no 64-bit integer is simply absent, as in a dict.
    assert "10" not in cache and 1 << 70 not in cache and cache.remove(None) is False


def test_add_many_takes_columns_and_replaces_by_job_id(core):
    cache = core.CandidateCache()
    cache.add(5, PDF, 0, 1.0, False, "old 5")
    added = cache.add_many([5, 6, 7], [EXCEL, PDF, PDF], [1, 2, 3], [10.0, 20.0, 30.0],
                           ["new 5", "job 6", "job 7"])
    assert added == 2
    assert cache.get(5) == "new 5"
    assert (cache.queued_of(PDF), cache.queued_of(EXCEL)) == (2, 1)
    assert cache.add_many([-2], [INDEX], [0], [3.5], ["request 2"], on_demand=True) == 1
    assert cache.rows_list()[0] == (-2, INDEX, 0, 3.5, True)


def test_forgetting_a_type_keeps_other_types_and_the_on_demand_rows(core):
    cache = core.CandidateCache()
    cache.add_many(range(1, 7), [PDF, EXCEL, PDF, INDEX, PDF, EXCEL], [0] * 6, [0.0] * 6,
                   [f"job {i}" for i in range(1, 7)])
    cache.add(-1, PDF, 0, 0.0, True, "request 1")
    assert cache.forget_type(PDF) == 3
    assert cache.forget_type(PDF) == 0 and cache.forget_type(99) == 0
    assert [r[0] for r in cache.rows_list()] == [-1, 2, 4, 6]
    assert cache.queued_of(PDF) == 0
    assert cache.forget_queued() == 3
    assert cache.rows_list() == [(-1, PDF, 0, 0.0, True)]
    cache.clear()
    assert len(cache) == 0 and cache.n_on_demand == 0


def test_plan_places_as_plan_cycle_and_takes_the_placed_rows_out(core):
    rows = [(EXCEL, 1, 0.0, 0, 1), (INDEX, 0, 0.0, 1, -4), (INDEX, 3, 0.0, 0, 5),
            (PDF, 2, 3.0, 0, 6), (PDF, 0, 0.0, 0, 7)]
    cands = core.Candidates()
    for row in rows:
        cands.append(*row)
    idx, slots = core.plan_cycle(seed_pool(core), cands, 10.0, core.Weights())
    expected = [(cands.job_ids[i], s) for i, s in zip(idx, slots, strict=True)]

    cache = core.CandidateCache()
    for t, p, e, od, job_id in rows:
        cache.add(job_id, t, p, e, od, f"job {job_id}")
    pool = seed_pool(core)
    reqs, req_slots, job_ids, job_slots = cache.plan(pool, 10.0, core.Weights())
    assert (req_slots.typecode, job_ids.typecode, job_slots.typecode) == ("q", "q", "q")
    # On-demand jobs come back as their objects, to start at once; queued ones as their ids,
    # to claim.
    assert list(zip(reqs, req_slots, strict=True)) == [
        (f"job {i}", s) for i, s in expected if i < 0]
    assert list(zip(job_ids, job_slots, strict=True)) == [(i, s) for i, s in expected if i >= 0]
    placed = {i for i, _ in expected}
    assert placed == {-4, 6, 1}
    assert all(pool.is_busy(s) for _, s in expected) and pool.n_free == 0
    assert sorted(r[0] for r in cache.rows_list()) == sorted({5, 7})
    # The queued jobs placed are being claimed; the on-demand one is not.
    assert cache.claiming_list() == [(1, False), (6, False)]


def test_the_clock_offset_moves_queued_rows_only(core):
    # A queued job eligible at 100 on the queue's clock, which is 60 s ahead of this host's,
    # has waited longer than a request eligible at 50 here; without the offset it would not.
    w = core.Weights(on_demand=0.0, on_demand_age=0.0)
    placed = []
    for offset in (60.0, 0.0):
        cache = core.CandidateCache()
        cache.add(7, PDF, 0, 100.0, False, "queued")
        cache.add(-9, PDF, 0, 50.0, True, "request")
        pool = core.SlotPool()
        pool.add_slot(1, 1, [PDF])
        reqs, _, job_ids, _ = cache.plan(pool, 200.0, w, offset=offset)
        placed.append(reqs + list(job_ids))
    assert placed == [[7], ["request"]]


def test_without_queued_only_on_demand_rows_are_placed(core):
    cache = core.CandidateCache()
    cache.add(1, PDF, 10, 0.0, False, "queued")
    cache.add(-1, EXCEL, 0, 5.0, True, "request")
    pool = seed_pool(core)
    reqs, req_slots, job_ids, _ = cache.plan(pool, 10.0, core.Weights(), queued=False)
    assert (reqs, list(req_slots), list(job_ids)) == (["request"], [2], [])
    assert cache.rows_list() == [(1, PDF, 10, 0.0, False)] and pool.n_free == 2


def test_optimal_matching_places_what_greedy_strands(core):
    cache = core.CandidateCache()
    cache.add(1, 0, 5, 0.0, False, "A job")
    cache.add(2, 1, 0, 0.0, False, "B job")
    pool = core.SlotPool()
    pool.add_slot(0, 0, [0, 1])
    pool.add_slot(1, 1, [0, 2])
    _, _, job_ids, slots = cache.plan(pool, 0.0, core.Weights(), matching="optimal")
    assert list(zip(job_ids, slots, strict=True)) == [(1, 1), (2, 0)]


def test_a_cancel_is_remembered_only_for_a_claim_on_its_way(core):
    cache = core.CandidateCache()
    cache.add(3, PDF, 0, 0.0, False, "job 3")
    assert cache.cancel_claim(3) is False  # waiting, not being claimed
    pool = seed_pool(core)
    cache.plan(pool, 1.0, core.Weights())
    assert cache.n_claiming == 1
    assert cache.cancel_claim(3) is True
    assert cache.cancel_claim("3") is False and cache.cancel_claim(1 << 64) is False
    assert cache.end_claim(3) is True
    assert cache.end_claim(3) is False and cache.n_claiming == 0


def test_a_job_can_wait_again_while_its_claim_is_on_its_way(core):
    cache = core.CandidateCache()
    cache.add(3, PDF, 0, 0.0, False, "job 3")
    pool = seed_pool(core)
    cache.plan(pool, 1.0, core.Weights())
    assert 3 not in cache
    assert cache.add(3, PDF, 0, 0.0, False, "job 3 again") is True
    assert cache.get(3) == "job 3 again" and cache.claiming_list() == [(3, False)]
    assert cache.remove(3) is True
    assert cache.cancel_claim(3) is True and cache.end_claim(3) is True
    assert len(cache) == 0 and cache.n_claiming == 0 and 3 not in cache


def test_planning_an_empty_cache_changes_nothing(core):
    cache = core.CandidateCache()
    pool = seed_pool(core)
    reqs, req_slots, job_ids, job_slots = cache.plan(pool, 0.0, core.Weights())
    assert (reqs, list(req_slots), list(job_ids), list(job_slots)) == ([], [], [], [])
    assert pool.n_free == 3


@pytest.mark.parametrize(("row", "error", "message"), [
    ((1, -1, 0, 0.0), ValueError, "type id must be between 0 and 1048575, got -1"),
    ((1, 1 << 20, 0, 0.0), ValueError, "type id must be between 0 and 1048575, got 1048576"),
    ((1 << 63, 0, 0, 0.0), OverflowError, "job id 9223372036854775808 does not fit in 64 bits"),
    ((1, 0, "high", 0.0), TypeError, "priority must be an integer, got 'high'"),
    ((1, 0, 0, math.nan), ValueError, "eligible_at must be a finite number of seconds"),
    ((1.5, 0, 0, 0.0), TypeError, "job id must be an integer, got 1.5"),
])
def test_a_bad_row_is_refused_with_its_reason_and_leaves_nothing(core, row, error, message):
    cache = core.CandidateCache()
    with pytest.raises(error, match=message):
        cache.add(*row, False, "job")
    assert len(cache) == 0 and cache.rows_list() == []


def test_bad_columns_are_refused_and_leave_nothing(core):
    cache = core.CandidateCache()
    with pytest.raises(ValueError, match="same length, got 2, 2, 2, 1, 2"):
        cache.add_many([1, 2], [0, 0], [0, 0], [0.0], ["a", "b"])
    with pytest.raises(ValueError, match="type id must be between 0 and 1048575, got 5000000"):
        cache.add_many([1, 2], [0, 5_000_000], [0, 0], [0.0, 0.0], ["a", "b"])
    with pytest.raises(ValueError, match="eligible_at must be finite numbers of seconds, got inf"):
        cache.add_many([1], [0], [0], [math.inf], ["a"])
    with pytest.raises(ValueError, match="job ids must be 64-bit integers"):
        cache.add_many([1 << 64], [0], [0], [0.0], ["a"])
    assert len(cache) == 0


def test_plan_refuses_bad_arguments_before_reserving_anything(core):
    cache = core.CandidateCache()
    cache.add(1, PDF, 0, 0.0, False, "job")
    pool = seed_pool(core)
    with pytest.raises(ValueError, match="matching must be 'greedy' or 'optimal'"):
        cache.plan(pool, 0.0, core.Weights(), matching="best")
    with pytest.raises(ValueError, match="offset must be a finite number of seconds"):
        cache.plan(pool, 0.0, core.Weights(), offset=math.inf)
    with pytest.raises(TypeError, match="weights must be a fairsched.core.Weights"):
        cache.plan(pool, 0.0, None)
    with pytest.raises(TypeError):
        cache.plan(object(), 0.0, core.Weights())
    assert pool.n_free == 3 and len(cache) == 1
