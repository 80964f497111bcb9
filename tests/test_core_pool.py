"""Slot pool semantics, on both cores."""

import pytest

from fairsched.core import implementations
from tests.core_pools import EXCEL, INDEX, PDF, seed_pool

IMPLS = implementations()


@pytest.fixture
def pool(core):
    return seed_pool(core)


def test_new_slots_are_free_and_counted_per_type(pool):
    assert len(pool) == 3 and pool.n_free == 3
    assert [pool.free_count(t) for t in (PDF, EXCEL, INDEX, 3, -1)] == [3, 2, 1, 0, 0]
    assert list(pool.free_counts(5)) == [3, 2, 1, 0, 0]
    assert pool.free_counts(5).typecode == "q"
    assert list(pool.free_counts(2)) == [3, 2]
    assert list(pool.free_counts(0)) == []
    assert pool.n_type_ids == 3
    assert not any(pool.is_busy(s) for s in (1, 2, 3))


def test_slot_details(pool):
    assert pool.slot_types(1) == (PDF, EXCEL, INDEX)
    assert pool.worker_of(3) == 200
    assert pool.has_slot(2) and not pool.has_slot(4)
    assert pool.slot_ids() == [1, 2, 3]
    with pytest.raises(KeyError, match="no slot 9"):
        pool.slot_types(9)
    with pytest.raises(KeyError, match="no slot 9"):
        pool.worker_of(9)


def test_pdf_job_takes_the_specialist_then_the_less_versatile_slot(pool):
    assert pool.acquire(PDF) == 3
    assert pool.acquire(PDF) == 2
    assert pool.acquire(PDF) == 1
    assert pool.acquire(PDF) == -1
    assert pool.n_free == 0


def test_acquire_keeps_every_free_count_in_step(pool):
    assert pool.acquire(EXCEL) == 2
    assert pool.is_busy(2)
    assert list(pool.free_counts(3)) == [2, 1, 1]
    assert pool.n_free == 2


def test_equally_specialised_slots_go_lowest_id_first(core):
    p = core.SlotPool()
    for sid in (7, 3, 5):
        p.add_slot(sid, 1, [4])
    assert [p.acquire(4) for _ in range(4)] == [3, 5, 7, -1]


def test_acquire_of_unknown_type_finds_nothing(pool):
    assert pool.acquire(3) == -1
    assert pool.acquire(-1) == -1
    assert pool.n_free == 3


def test_release_frees_the_slot_and_makes_it_first_choice_again(pool):
    assert pool.acquire(PDF) == 3
    assert pool.acquire(PDF) == 2
    assert pool.release(3) is True
    assert not pool.is_busy(3)
    assert list(pool.free_counts(3)) == [2, 1, 1]
    assert pool.acquire(PDF) == 3


def test_release_of_a_free_or_unknown_slot_is_a_no_op(pool):
    assert pool.release(3) is False
    assert pool.release(99) is False
    assert pool.n_free == 3 and list(pool.free_counts(3)) == [3, 2, 1]


def test_acquire_slot_reserves_that_slot_only_when_free(pool):
    assert pool.acquire_slot(1) is True
    assert pool.is_busy(1)
    assert list(pool.free_counts(3)) == [2, 1, 0]
    assert pool.acquire_slot(1) is False
    assert pool.acquire_slot(42) is False
    assert pool.acquire(INDEX) == -1


def test_remove_worker_drops_free_and_busy_slots_and_returns_busy_ids(pool):
    pool.add_slot(4, 100, [EXCEL])
    assert pool.acquire_slot(4) and pool.acquire_slot(1)
    assert pool.remove_worker(100) == [1, 4]
    assert len(pool) == 1 and pool.slot_ids() == [3]
    assert pool.n_free == 1
    assert list(pool.free_counts(3)) == [1, 0, 0]
    assert not pool.has_slot(1) and not pool.has_slot(2)


def test_release_after_the_worker_vanished_is_a_no_op(pool):
    assert pool.acquire(EXCEL) == 2
    assert pool.remove_worker(100) == [2]
    assert pool.is_busy(2) is False
    assert pool.release(2) is False
    assert pool.acquire_slot(2) is False
    assert pool.n_free == 1 and list(pool.free_counts(3)) == [1, 0, 0]


def test_remove_unknown_worker_changes_nothing(pool):
    assert pool.remove_worker(999) == []
    assert len(pool) == 3 and pool.n_free == 3


def test_a_restarted_worker_comes_back_with_the_same_slot_ids(pool):
    pool.acquire(PDF)
    pool.remove_worker(200)
    pool.add_slot(3, 201, [PDF])
    assert pool.worker_of(3) == 201 and not pool.is_busy(3)
    assert pool.acquire(PDF) == 3


def test_hint_survives_removal_below_it(core):
    # Busy slots ahead of a removed one must not be handed out again.
    p = core.SlotPool()
    for sid, worker in ((1, 1), (2, 2), (3, 1), (4, 2)):
        p.add_slot(sid, worker, [0])
    assert [p.acquire(0), p.acquire(0), p.acquire(0)] == [1, 2, 3]
    assert p.remove_worker(1) == [1, 3]
    assert p.acquire(0) == 4
    assert p.acquire(0) == -1
    assert p.release(2)
    assert p.acquire(0) == 2


def test_adding_a_more_specialised_slot_makes_it_first_choice(core):
    p = core.SlotPool()
    p.add_slot(1, 1, [0, 1])
    p.add_slot(2, 1, [0, 1])
    assert p.acquire(0) == 1
    p.add_slot(9, 2, [0])
    assert p.acquire(0) == 9
    assert p.acquire(0) == 2


def test_the_pool_grows_for_new_type_ids(core):
    p = core.SlotPool()
    p.add_slot(1, 1, [0])
    p.add_slot(2, 1, [1000])
    assert p.n_type_ids == 1001
    assert p.free_count(1000) == 1 and p.free_count(500) == 0
    assert p.acquire(1000) == 2


@pytest.mark.parametrize(("slot_id", "types", "error", "message"), [
    (1, [0], ValueError, "slot 1 already exists"),
    (5, [], ValueError, "at least one type id"),
    (5, [0, 1, 0], ValueError, "type id 0 is listed twice"),
    (5, [-1], ValueError, "type id must be between 0 and"),
    (5, [1 << 20], ValueError, "type id must be between 0 and"),
    (5, ["pdf"], TypeError, "type id must be an integer"),
    (5, "pdf", TypeError, "type_ids must be a sequence"),
    (-1, [0], ValueError, "slot id must be >= 0"),
    (1.5, [0], TypeError, "slot id must be an integer"),
    (1 << 63, [0], OverflowError, "does not fit in 64 bits"),
])
def test_add_slot_refuses_bad_input_and_changes_nothing(pool, slot_id, types, error, message):
    with pytest.raises(error, match=message):
        pool.add_slot(slot_id, 7, types)
    assert len(pool) == 3 and pool.n_free == 3 and pool.n_type_ids == 3


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda pool: pool.acquire(1.9), TypeError, "type id must be an integer, got 1.9"),
    (lambda pool: pool.acquire(None), TypeError, "type id must be an integer, got None"),
    (lambda pool: pool.acquire(1 << 70), OverflowError, "does not fit in 64 bits"),
    (lambda pool: pool.free_count(2.7), TypeError, "type id must be an integer, got 2.7"),
    (lambda pool: pool.remove_worker(0.5), TypeError, "worker id must be an integer, got 0.5"),
    (lambda pool: pool.free_counts(3.0), TypeError, "n_types must be an integer, got 3.0"),
])
def test_both_cores_refuse_an_id_that_is_not_an_integer_alike(pool, call, error, message):
    with pytest.raises(error, match=message):
        call(pool)
    assert len(pool) == 3 and pool.n_free == 3


def test_free_counts_refuses_negative_length(pool):
    with pytest.raises(ValueError, match="n_types must be >= 0"):
        pool.free_counts(-1)


def test_many_slots_of_one_worker(core):
    p = core.SlotPool()
    for sid in range(200):
        p.add_slot(sid, sid % 3, [sid % 5, 5 + sid % 2])
    busy = [p.acquire(t) for t in (0, 1, 2, 3, 4, 5, 6) for _ in range(10)]
    assert -1 not in busy
    expected = sorted(s for s in busy if s % 3 == 1)
    assert p.remove_worker(1) == expected
    assert len(p) == 200 - len([s for s in range(200) if s % 3 == 1])
    assert sum(p.free_counts(5)) == p.n_free
