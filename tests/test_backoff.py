"""The one backoff formula: every wait that grows while something keeps failing doubles the one
before, up to a ceiling, with jitter where many waiters would act in lockstep. Each place that
waits is checked against the formula it had of its own, written out here."""

from __future__ import annotations

import random

import pytest

from fairsched.backoff import backoff
from fairsched.supervisor import queue_link, running, templates, watchdog, workers


def doubled(first: float, ceiling: float, waits: int) -> list[float]:
    """Waits as a place that doubled its last wait computed them."""
    out, delay = [], first
    for _ in range(waits):
        out.append(delay)
        delay = min(delay * 2, ceiling)
    return out


def test_a_worker_restarts_at_once_then_after_a_tenth_of_a_second_doubling_to_30():
    def before(recent: int) -> float:
        return 0.0 if recent <= 1 else min(0.1 * 2 ** (recent - 2), 30.0)

    def now(recent: int) -> float:  # as workers.py reads it
        return 0.0 if recent <= 1 else backoff(recent - 2, workers.RESTART_DELAY_FIRST,
                                                  workers.RESTART_DELAY_MAX)

    assert [now(n) for n in range(1, 40)] == [before(n) for n in range(1, 40)]
    assert [now(n) for n in range(1, 5)] == [0.0, 0.1, 0.2, 0.4]
    assert now(39) == 30.0


def test_a_lost_template_is_replaced_after_a_second_doubling_to_a_minute():
    before = [min(60.0, 1.0 * 2 ** (losses - 1)) for losses in range(1, 30)]
    assert [backoff(losses - 1, templates.TEMPLATE_DELAY_FIRST, templates.TEMPLATE_DELAY_MAX)
            for losses in range(1, 30)] == before
    assert before[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]


def test_the_lease_watchdog_restarts_after_a_second_doubling_to_30():
    assert [backoff(n, watchdog.RESTART_FIRST, watchdog.RESTART_MAX) for n in range(30)] == \
        doubled(1.0, 30.0, 30)


@pytest.mark.parametrize("lease", [1.0, 1.5, 15.0, 600.0])
def test_each_database_lane_reconnects_after_a_tenth_doubling_to_a_quarter_lease_or_5(lease):
    ceiling = min(queue_link.RECONNECT_MAX, lease / 4)  # as QueueLink.reconnect_max
    assert [backoff(n, queue_link.RECONNECT_FIRST, ceiling) for n in range(40)] == \
        doubled(0.1, ceiling, 40)


@pytest.mark.parametrize("base", [0.0, 0.001, 1.0, 2.5, 7.0])
def test_a_failed_job_is_retried_after_between_half_and_all_of_base_doubling_to_300(base):
    """The same draws from the same generator: the same run_after, jitter and all."""
    def before(attempt: int, rng) -> float:
        delay = min(300.0, base * 2.0 ** min(attempt - 1, 1000))
        return delay / 2 + rng.uniform(0.0, delay / 2)

    old, new = random.Random(7), random.Random(7)
    for attempt in [*range(1, 40), 10**6]:
        expected = before(attempt, old)
        got = backoff(attempt - 1, base, running.RETRY_DELAY_MAX, jitter="equal", rng=new)
        assert got == expected
        ceiling = min(300.0, base * 2.0 ** min(attempt - 1, 1000))
        assert ceiling / 2 <= got <= ceiling


def test_full_jitter_draws_from_nothing_to_the_whole_wait_and_never_in_lockstep():
    rng = random.Random(3)
    draws = [backoff(4, 1.0, 300.0, jitter="full", rng=rng) for _ in range(200)]
    assert all(0.0 <= d <= 16.0 for d in draws)
    assert min(draws) < 8.0 < max(draws)  # below the floor "equal" keeps
    assert len(set(draws)) > 1
    assert len({backoff(7, 1.0, 300.0, jitter="equal") for _ in range(20)}) > 1


def test_no_step_overflows_and_a_zero_first_wait_stays_zero():
    assert backoff(10**9, 5.0, 60.0) == 60.0
    assert backoff(10**9, 0.0, 60.0, jitter="equal") == 0.0


@pytest.mark.parametrize("bad, words", [
    ({"step": -1}, "step must be an integer >= 0, got -1"),
    ({"step": True}, "step must be an integer >= 0, got True"),
    ({"step": 1.0}, "step must be an integer >= 0, got 1.0"),
    ({"first": -1.0}, "first and ceiling must be finite and >= 0, got -1.0, 30.0"),
    ({"ceiling": float("inf")}, "first and ceiling must be finite and >= 0, got 1.0, inf"),
    ({"jitter": "none"}, "jitter must be 'equal', 'full' or None, got 'none'"),
])
def test_what_is_no_backoff_is_refused_naming_it(bad, words):
    args = {"step": 0, "first": 1.0, "ceiling": 30.0, **bad}
    with pytest.raises(ValueError) as caught:
        backoff(args.pop("step"), args.pop("first"), args.pop("ceiling"), **args)
    assert str(caught.value) == words
