"""The Candidates container shared by both cores."""

import pytest

from fairsched.core import Candidates


def test_append_and_from_lists_build_the_same_columns():
    a = Candidates()
    a.append(3, 5, 10.5, True, 42)
    a.append(0, 0, 11, 0, -7)
    b = Candidates.from_lists([3, 0], [5, 0], [10.5, 11], [True, 0], [42, -7])
    for cands in (a, b):
        assert len(cands) == 2
        assert cands.types.typecode == "q" and list(cands.types) == [3, 0]
        assert cands.priorities.typecode == "q" and list(cands.priorities) == [5, 0]
        assert cands.eligible_at.typecode == "d" and list(cands.eligible_at) == [10.5, 11.0]
        assert cands.on_demand.typecode == "B" and list(cands.on_demand) == [1, 0]
        assert cands.job_ids.typecode == "q" and list(cands.job_ids) == [42, -7]


@pytest.mark.parametrize("eligible_at", [float("nan"), float("inf")])
def test_append_refuses_non_finite_time_and_leaves_no_ragged_row(eligible_at):
    cands = Candidates()
    with pytest.raises(ValueError, match="eligible_at must be a finite number"):
        cands.append(0, 0, eligible_at, 0, 1)
    assert len(cands) == 0 and len(cands.eligible_at) == 0


def test_append_refuses_a_job_id_too_large_for_64_bits_and_leaves_no_row():
    cands = Candidates()
    with pytest.raises(ValueError, match="64-bit integers"):
        cands.append(0, 0, 1.0, 0, 1 << 64)
    assert len(cands.types) == len(cands.job_ids) == 0


def test_from_lists_refuses_columns_of_different_lengths():
    with pytest.raises(ValueError, match="same length, got 2, 2, 1, 2, 2"):
        Candidates.from_lists([0, 1], [0, 0], [0.0], [0, 0], [1, 2])


def test_from_lists_refuses_non_finite_times_and_non_integers():
    with pytest.raises(ValueError, match="finite numbers of seconds, got nan"):
        Candidates.from_lists([0], [0], [float("nan")], [0], [1])
    with pytest.raises(ValueError, match="candidate priorities must be 64-bit integers"):
        Candidates.from_lists([0], [1.5], [0.0], [0], [1])


class _Unknown:
    """A flag with no truth value, as pandas.NA or a numpy array of several flags."""

    def __bool__(self):
        raise TypeError("boolean value of NA is ambiguous")


def test_append_refuses_a_flag_without_truth_value_and_leaves_no_row(core):
    cands = core.Candidates()
    cands.append(0, 1, 5.0, True, 7)
    with pytest.raises(TypeError, match="ambiguous"):
        cands.append(0, 0, 1.0, _Unknown(), 1)
    assert len(cands.types) == len(cands.eligible_at) == len(cands.on_demand) == 1
    # Both cores go on planning with the rows that were accepted.
    _, order = core.score_candidates(cands, 10.0, [1], core.Weights())
    assert list(order) == [0]
