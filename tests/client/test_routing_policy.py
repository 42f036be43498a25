"""The client's routing rules (:mod:`podium.client.routing`) alone: no socket, no thread, no clock.

Least expected wait (an unmeasured replica counts as the median, alike costs by fewest outstanding
in turn), what makes a replica slow, when a request is hedged, the hedge budget, and how answers
and cancelled copies move a replica's latency. The race between a request's two copies
(:class:`podium.client.hedge.Race`) with stand-in answers, no request sent. The same rules end to
end, with a slowed replica: ``test_slow_replica.py``.
"""

from __future__ import annotations

import threading

import pytest

from podium.client import ClientOptions
from podium.client.hedge import Race
from podium.client.routing import (
    EWMA_WEIGHT,
    HEDGE_BURST,
    TIE_RATIO,
    Candidate,
    HedgeBudget,
    Latency,
    censored,
    choose,
    expected_wait,
    hedge_after_s,
    is_slow,
    judged,
    observed,
    typical_s,
)

HEDGING = ClientOptions(hedge_factor=3.0, hedge_min_s=0.5, hedge_fraction=0.1)


# ------------------------------------------------------------------ least expected wait


def test_unmeasured_replicas_are_routed_by_least_outstanding_in_turn() -> None:
    pool = [Candidate(0, 1, None), Candidate(1, 0, None), Candidate(2, 0, None)]
    assert choose(pool, turn=0, count=3).index == 1
    assert choose(pool, turn=2, count=3).index == 2  # a tie: the first at or after the turn


def test_the_faster_replica_wins_when_the_expected_waits_differ_beyond_the_tie() -> None:
    fast, slow = Candidate(0, 2, 0.1), Candidate(1, 0, 1.0)
    assert expected_wait(fast, None) == pytest.approx(0.3) and expected_wait(slow, None) == pytest.approx(1.0)
    assert choose([fast, slow], turn=1, count=2).index == 0  # 3 in flight at 0.1 s beat 1 at 1 s


def test_expected_waits_within_the_tie_ratio_go_by_fewest_outstanding() -> None:
    # a wait of 0.35 s vs 0.2 s is within the tie: the idle replica takes the request
    busy, idle = Candidate(0, 1, 0.1), Candidate(1, 0, 0.35)
    assert expected_wait(idle, None) <= expected_wait(busy, None) * TIE_RATIO
    assert choose([busy, idle], turn=0, count=2).index == 1


def test_a_replica_not_measured_yet_counts_as_the_median_of_the_others() -> None:
    pool = [Candidate(0, 0, 0.1), Candidate(1, 0, 0.3), Candidate(2, 0, None)]
    assert typical_s([c.latency_s for c in pool]) == pytest.approx(0.2)
    assert expected_wait(pool[2], 0.2) == pytest.approx(0.2)
    assert choose(pool, turn=2, count=3).index == 2  # alike the others: its turn, so it gets calls


def test_choosing_among_no_replica_is_an_error() -> None:
    with pytest.raises(ValueError, match="no replica"):
        choose([], turn=0, count=0)


# ------------------------------------------------------------------ slow replicas


def test_a_replica_over_the_factor_times_the_others_median_is_slow() -> None:
    assert is_slow(1.0, [0.1, 0.2, 0.3], 4.0)
    assert not is_slow(0.7, [0.1, 0.2, 0.3], 4.0)  # 3.5x the median
    assert judged([0.05, 1.0], 4.0) == [False, True]
    assert judged([0.05, 0.06, 1.0], 4.0) == [False, False, True]
    # milliseconds that jitter by several times on a loaded node are no slowness
    assert not is_slow(0.025, [0.004, 0.005], 4.0)
    assert is_slow(0.3, [0.004, 0.005], 4.0)


def test_slowness_is_never_judged_unmeasured_alone_or_switched_off() -> None:
    assert not is_slow(None, [0.1], 4.0)
    assert not is_slow(1.0, [None], 4.0)
    assert not is_slow(1.0, [], 4.0)
    assert not is_slow(1.0, [0.1], None)
    assert judged([0.05, 1.0], None) == [False, False]


def test_latency_is_a_moving_mean_and_a_probe_answer_replaces_it() -> None:
    first = observed(Latency(), 1.0)
    assert first == Latency(1.0, 1)
    assert observed(first, 0.0).seconds == pytest.approx(1 - EWMA_WEIGHT)
    assert observed(first, 0.05, fresh=True) == Latency(0.05, 2)  # a probe of a drained replica: it recovers


def test_a_cancelled_copy_can_only_raise_its_replicas_latency() -> None:
    assert censored(Latency(), 0.3) == Latency(0.3, 0)
    assert censored(Latency(1.0, 4), 0.3) == Latency(1.0, 4)
    assert censored(Latency(0.1, 4), 0.3) == Latency(0.3, 4)


# ------------------------------------------------------------------ hedging


def test_a_request_is_hedged_at_the_factor_times_the_usual_time_at_least_the_floor() -> None:
    assert hedge_after_s(0.4, [0.5], HEDGING) == pytest.approx(1.2)  # 3 x its own 0.4 s
    assert hedge_after_s(0.1, [0.1], HEDGING) == pytest.approx(0.5)  # the floor


def test_a_request_to_a_slow_replica_is_hedged_at_the_healthy_ones_pace() -> None:
    assert hedge_after_s(5.0, [0.2, 0.3], HEDGING) == pytest.approx(0.75)  # 3 x the others' 0.25 s
    assert hedge_after_s(None, [0.3], HEDGING) == pytest.approx(0.9)  # unmeasured: the others' pace


def test_no_hedge_without_another_replica_a_measurement_or_when_switched_off() -> None:
    assert hedge_after_s(0.3, [], HEDGING) is None
    assert hedge_after_s(None, [None], HEDGING) is None
    assert hedge_after_s(0.3, [0.3], ClientOptions(hedge_factor=None)) is None


def test_the_hedge_budget_allows_at_most_the_fraction_plus_a_burst() -> None:
    budget = HedgeBudget(0.1)
    hedged = 0
    for _ in range(1000):
        budget.earn()
        hedged += budget.take()
    assert hedged == 100
    idle = HedgeBudget(0.1)
    for _ in range(1000):  # requests answered in time save at most a burst of hedges
        idle.earn()
    assert sum(idle.take() for _ in range(10)) == int(HEDGE_BURST)


def test_a_budget_of_no_fraction_never_hedges() -> None:
    budget = HedgeBudget(0.0)
    budget.earn()
    assert not budget.take()


# ------------------------------------------------------------------ the race between two copies


def test_the_second_copy_answering_first_wins_and_cancels_the_first() -> None:
    race: Race[str] = Race()
    assert race.start_second()
    assert race.second_answered("second")
    assert race.first.cancelled and not race.second.cancelled
    assert race.first_failed(timeout_s=0) == "second"


def test_the_first_copy_answering_cancels_a_running_second_which_then_cannot_win() -> None:
    race: Race[str] = Race()
    assert race.start_second()
    race.first_answering()
    assert race.second.cancelled and not race.first.cancelled
    assert not race.second_answered("late")


def test_no_second_copy_starts_once_the_first_answers_or_failed() -> None:
    answered: Race[str] = Race()
    answered.watching(None)(memoryview(b"x"), 1, None)  # type: ignore[arg-type]  # its body arrives
    assert not answered.start_second()
    failed: Race[str] = Race()
    assert failed.first_failed(timeout_s=0) is None
    assert not failed.start_second()


def test_a_failed_first_copy_waits_for_the_running_second() -> None:
    race: Race[str] = Race()
    assert race.start_second()
    threading.Timer(0.05, race.second_answered, args=("second",)).start()
    assert race.first_failed(timeout_s=30) == "second"
