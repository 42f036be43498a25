"""``podium.poll.poll_until``: when it asks, what it returns, how it times out (a fake clock: no sleeping)."""

from __future__ import annotations

import pytest

from podium.poll import PollTimeout, poll_until


class FakeClock:
    """A clock that moves only when slept on; records each sleep."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def answers(*values):
    it = iter(values)
    asked: list[int] = []

    def condition():
        asked.append(1)
        return next(it)

    condition.asked = asked  # type: ignore[attr-defined]
    return condition


def test_returns_the_first_value_that_is_neither_none_nor_false() -> None:
    clock = FakeClock()
    condition = answers(None, False, 0)  # 0 is a result, not "not yet"
    assert poll_until(condition, timeout_s=10, interval_s=0.5, what="x", clock=clock, sleep=clock.sleep) == 0
    assert clock.sleeps == [0.5, 0.5]
    assert poll_until(lambda: True, timeout_s=0, interval_s=1, what="x", clock=clock, sleep=clock.sleep) is True
    assert poll_until(list, timeout_s=0, interval_s=1, what="x", clock=clock, sleep=clock.sleep) == []


def test_times_out_naming_what_it_waited_for_and_asks_once_more_at_the_deadline() -> None:
    clock = FakeClock()
    condition = answers(*[None] * 10)
    with pytest.raises(PollTimeout, match=r"timed out after 1\.2s waiting for the head's record") as info:
        poll_until(condition, timeout_s=1.2, interval_s=0.5, what="the head's record", clock=clock, sleep=clock.sleep)
    assert isinstance(info.value, TimeoutError) and info.value.what == "the head's record"
    assert info.value.timeout_s == 1.2
    assert clock.sleeps == pytest.approx([0.5, 0.5, 0.2])  # the last sleep ends at the deadline
    assert len(condition.asked) == 4  # at 0, 0.5, 1.0 and at the deadline


def test_a_zero_or_negative_timeout_still_asks_once() -> None:
    clock = FakeClock()
    with pytest.raises(PollTimeout):
        poll_until(lambda: None, timeout_s=0, interval_s=1, what="x", clock=clock, sleep=clock.sleep)
    assert poll_until(lambda: "ok", timeout_s=-5, interval_s=1, what="x", clock=clock, sleep=clock.sleep) == "ok"
    assert clock.sleeps == []


def test_backoff_doubles_the_interval_up_to_its_bound() -> None:
    clock = FakeClock()
    with pytest.raises(PollTimeout):
        poll_until(lambda: None, timeout_s=10, interval_s=1, max_interval_s=3, what="x", clock=clock,
                   sleep=clock.sleep)
    assert clock.sleeps == [1, 2, 3, 3, 1]


def test_an_error_of_the_condition_ends_the_wait() -> None:
    clock = FakeClock()

    def failing():
        raise RuntimeError("failed for good")

    with pytest.raises(RuntimeError, match="failed for good"):
        poll_until(failing, timeout_s=10, interval_s=1, what="x", clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []


def test_bad_intervals_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_s=0"):
        poll_until(lambda: True, timeout_s=1, interval_s=0, what="x")
    with pytest.raises(ValueError, match=r"max_interval_s=0\.5 < interval_s=1"):
        poll_until(lambda: True, timeout_s=1, interval_s=1, max_interval_s=0.5, what="x")
