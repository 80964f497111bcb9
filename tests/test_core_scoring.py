"""Scoring: the seed's worked numbers, the ordering rules and input checks, on both cores."""

import math

import pytest

from fairsched.core import implementations

IMPLS = implementations()


def rank(core, now, rows, free=(1,), weights=None):
    """rows: (type, priority, eligible_at, on_demand, job_id); returns (scores, order)."""
    cands = core.Candidates.from_lists(*zip(*rows, strict=True)) if rows else core.Candidates()
    return core.score_candidates(cands, now, list(free), weights or core.Weights())


def test_default_weights_are_the_design_values(core):
    w = core.Weights()
    assert (w.priority, w.age, w.rarity, w.on_demand, w.on_demand_age) == (
        1024.0, 16.0, 500.0, 4096.0, 32.0)
    assert all(type(v) is float for v in (w.priority, w.age, w.rarity, w.on_demand,
                                          w.on_demand_age))


def test_rarity_bonus_halves_as_free_slots_double(core):
    rows = [(t, 0, 100.0, 0, t) for t in range(4)]
    scores, _ = rank(core, 100.0, rows, free=[1, 2, 4, 8])
    assert list(scores) == [500.0, 250.0, 125.0, 62.5]


def test_no_rarity_bonus_without_free_slot_or_for_unknown_type(core):
    rows = [(0, 0, 0.0, 0, 1), (1, 0, 0.0, 0, 2), (-1, 0, 0.0, 0, 3), (7, 0, 0.0, 0, 4)]
    scores, _ = rank(core, 0.0, rows, free=[0, 3])
    assert list(scores) == [0.0, 500.0 / 3, 0.0, 0.0]


def test_each_term_of_the_formula(core):
    w = core.Weights(priority=1000.0, age=10.0, rarity=300.0, on_demand=5000.0,
                     on_demand_age=20.0)
    rows = [(0, 3, 90.0, 0, 1), (0, 3, 90.0, 1, 2)]
    scores, _ = rank(core, 100.0, rows, free=[2], weights=w)
    assert list(scores) == [3000.0 + 100.0 + 150.0, 3000.0 + 100.0 + 150.0 + 5000.0 + 200.0]


def test_not_yet_eligible_job_has_age_zero(core):
    scores, _ = rank(core, 100.0, [(0, 1, 160.0, 1, 1)], free=[0])
    assert list(scores) == [1024.0 + 4096.0]


@pytest.mark.parametrize(("waited", "old_job_first"), [(0.0, False), (319.0, False),
                                                        (320.0, True), (321.0, True)])
def test_priority_0_job_overtakes_fresh_priority_5_job_after_320_s(core, waited, old_job_first):
    now = 10_000.0
    old = (0, 0, now - waited, 0, 1)
    fresh = (0, 5, now, 0, 2)
    scores, order = rank(core, now, [old, fresh])
    assert (list(order) == [0, 1]) is old_job_first
    if waited == 320.0:
        # Equal scores at the crossover: the older job wins the tie.
        assert scores[0] == scores[1]


@pytest.mark.parametrize(("waited", "queued_first"), [(0.0, False), (255.0, False),
                                                      (256.0, True), (257.0, True)])
def test_fresh_on_demand_job_and_queued_priority_0_job_cross_at_256_s(core, waited, queued_first):
    now = 5_000.0
    queued = (0, 0, now - waited, 0, 1)
    on_demand = (0, 0, now, 1, 2)
    scores, order = rank(core, now, [queued, on_demand])
    assert (list(order) == [0, 1]) is queued_first
    if waited == 256.0:
        assert scores[0] == scores[1]


def test_order_breaks_ties_by_age_then_job_id_then_position(core):
    rows = [
        (0, 1, 50.0, 0, 9),  # 0
        (0, 1, 40.0, 0, 9),  # 1: same score as 0 once both are not yet eligible, older
        (0, 1, 40.0, 0, 3),  # 2: same as 1, lower job id
        (0, 1, 40.0, 0, 3),  # 3: identical to 2
        (0, 2, 60.0, 0, 99),  # 4: higher priority
    ]
    scores, order = rank(core, 0.0, rows, free=[0])
    assert len(set(scores[:4])) == 1
    assert list(order) == [4, 2, 3, 1, 0]


def test_one_job_far_older_than_the_rest_leaves_the_order_exact(core):
    # A job waiting for a year scores far above a backlog of minutes: the bulk of the scores
    # lies in a sliver of the range, and must still come out in the exact order.
    rows = [(t % 3, t % 11, 1e9 - (t * 7919) % 600, t % 20 == 0, t) for t in range(500)]
    rows.append((0, 0, 1e9 - 365 * 86400.0, 0, 500))
    scores, order = rank(core, 1e9, rows, free=[1, 2, 4])
    expected = sorted(range(len(rows)), key=lambda i: (-scores[i], rows[i][2], rows[i][4]))
    assert list(order) == expected
    assert order[0] == 500


def test_empty_candidates(core):
    scores, order = rank(core, 1.0, [])
    assert (list(scores), list(order)) == ([], [])
    assert (scores.typecode, order.typecode) == ("d", "q")


def test_results_are_typed_arrays(core):
    scores, order = rank(core, 1.0, [(0, 0, 0.0, 0, 1)])
    assert (scores.typecode, order.typecode) == ("d", "q")


def test_absurd_times_still_give_a_total_order(core):
    # inf x 0 is NaN: such a score sorts last instead of scrambling the order.
    w = core.Weights(age=0.0, on_demand_age=0.0)
    rows = [(0, 0, -1.7e308, 0, 1), (0, 1, 0.0, 0, 2), (0, 0, 0.0, 0, 3)]
    scores, order = rank(core, 1.7e308, rows, free=[0], weights=w)
    assert math.isnan(scores[0])
    assert list(order) == [1, 2, 0]


def test_scores_spread_past_the_largest_double_still_order_exactly(core):
    # Scores from -1.7e308 to 1.7e308: their difference overflows a double, and the order
    # must not depend on it.
    w = core.Weights(priority=1.7e308 / 2**62, age=0.0, rarity=0.0, on_demand_age=0.0)
    rows = [(0, -2**62, 0.0, 0, 1), (0, 2**62, 0.0, 0, 2), (0, 0, 0.0, 0, 3),
            (0, 2**61, 0.0, 0, 4), (0, -5, 0.0, 0, 5)]
    scores, order = rank(core, 1.0, rows, free=[1], weights=w)
    assert all(math.isfinite(x) for x in scores)
    assert list(order) == [1, 3, 2, 4, 0]


def test_many_scores_spread_past_the_largest_double_order_exactly(core):
    # As above with enough candidates that the 64 highest share a bucket of the compiled
    # sort, which puts them in order by comparison (qsort).
    w = core.Weights(priority=1.7e308 / 2**62, age=0.0, rarity=0.0, on_demand_age=0.0)
    prios = [2**62 - k * 2**57 for k in range(64)] + [-5, 0, 7]
    rows = [(0, p, 0.0, 0, i) for i, p in enumerate(prios)]
    scores, order = rank(core, 1.0, rows, free=[1], weights=w)
    assert all(math.isfinite(x) for x in scores)
    assert scores[0] - scores[63] == math.inf
    assert list(order) == sorted(range(len(rows)), key=lambda i: -prios[i])


@pytest.mark.parametrize("now", [float("nan"), float("inf"), "10", None])
def test_now_must_be_a_finite_number(core, now):
    with pytest.raises((ValueError, TypeError), match="now must be"):
        rank(core, now, [(0, 0, 0.0, 0, 1)])


def test_weights_must_be_a_weights(core):
    cands = core.Candidates()
    with pytest.raises(TypeError, match="weights must be"):
        core.score_candidates(cands, 0.0, [], {"priority": 1.0})


def test_cands_must_be_candidates(core):
    with pytest.raises(TypeError, match="cands must be"):
        core.score_candidates([(0, 0, 0.0, 0, 1)], 0.0, [], core.Weights())


def test_ragged_candidate_columns_are_refused(core):
    cands = core.Candidates.from_lists([0, 1], [0, 0], [0.0, 0.0], [0, 0], [1, 2])
    cands.job_ids.append(3)
    with pytest.raises(ValueError, match="different lengths"):
        core.score_candidates(cands, 0.0, [1], core.Weights())


def test_free_counts_must_be_integers(core):
    with pytest.raises(TypeError, match="free_counts"):
        rank(core, 0.0, [(0, 0, 0.0, 0, 1)], free=["a"])


@pytest.mark.parametrize(("field", "value", "error"), [
    ("age", -1.0, ValueError), ("rarity", float("inf"), ValueError),
    ("priority", float("nan"), ValueError), ("on_demand", "4096", TypeError),
    ("on_demand_age", True, TypeError),
])
def test_weights_refuse_bad_values(core, field, value, error):
    with pytest.raises(error, match=f"weight {field} must be"):
        core.Weights(**{field: value})


def test_weights_are_frozen_and_take_integers(core):
    w = core.Weights(age=20)
    assert w.age == 20.0 and type(w.age) is float
    with pytest.raises(AttributeError):
        w.age = 1.0
