"""The group's watch of its calls, as pure decisions (:mod:`podium.teacher.compute.liveness`): when
a call is stuck, and how the verdict names its ranks. The watch on a real group (a frozen rank):
``test_group_liveness.py``."""

from __future__ import annotations

from podium.teacher.compute.liveness import WATCH_FACTOR, CallWatch, RankReport, RankSeat, allowed_s

SEATS = [RankSeat(0, "10.0.0.1, pid 11", 8), RankSeat(1, "10.0.0.2, pid 22", 8)]


def test_the_allowance_is_the_floor_until_the_teacher_has_a_measured_speed() -> None:
    assert allowed_s(60.0, None, 4096) == 60.0
    assert allowed_s(60.0, 1000.0, 4096) == 60.0  # 10 x 4.1 s < the floor
    assert allowed_s(60.0, 100.0, 4096) == WATCH_FACTOR * 40.96  # a big micro-batch on a slow teacher


def test_a_call_without_progress_past_its_allowance_is_stuck_and_names_the_silent_rank_first() -> None:
    watch = CallWatch(7, SEATS, allowed_s=20.0, started=100.0)
    watch.report(0, RankReport(call=7, microbatches=8, done=2, since_s=0.5), now=102.0)
    watch.report(1, RankReport(call=7, microbatches=8, done=2, since_s=0.5), now=102.0)
    # rank 1 stops answering at 102; rank 0 keeps answering, stuck on micro-batch 3 (a collective)
    for now in (110.0, 120.0):
        watch.report(0, RankReport(call=7, microbatches=8, done=2, since_s=now - 101.5), now=now)
    assert watch.stuck(121.0) is None  # 19.5 s since the last micro-batch ended (101.5)
    verdict = watch.stuck(125.0)
    assert verdict is not None
    print(verdict)
    assert verdict.startswith("stuck call: no progress for 24 s (allowed 20 s): ")
    first, second = verdict.split(": ", 2)[2].split("; ")
    assert first == ("rank 1 (10.0.0.2, pid 22) has not finished micro-batch 3 of 8 for 24 s and has not "
                     "answered the watch for 23 s (frozen?)")
    assert second == "rank 0 (10.0.0.1, pid 11) has not finished micro-batch 3 of 8 for 24 s"


def test_a_slow_call_that_keeps_finishing_micro_batches_is_not_stuck() -> None:
    """On a loaded node every micro-batch takes many times its usual time: each one finished
    restarts the clock, however long the whole call takes."""
    watch = CallWatch(1, SEATS[:1], allowed_s=20.0, started=0.0)
    for done in range(1, 9):  # 15 s a micro-batch, 120 s in all
        now = 15.0 * done
        watch.report(0, RankReport(call=1, microbatches=8, done=done, since_s=0.2), now=now)
        assert watch.stuck(now + 14.0) is None
    assert watch.stuck(15.0 * 8 + 25.0) is not None  # then nothing: stuck


def test_a_rank_still_on_an_earlier_call_or_finished_is_no_progress_and_finished_ranks_are_named() -> None:
    watch = CallWatch(3, SEATS, allowed_s=5.0, started=0.0, what="warm-up forward")
    watch.report(1, RankReport(call=2, microbatches=1, done=1, since_s=0.0), now=1.0)  # the last call's news
    assert watch.stuck(4.0) is None
    watch.rank_finished(0, now=0.4)
    verdict = watch.stuck(6.0)
    assert verdict is not None and verdict.startswith("stuck warm-up forward: no progress for 6 s")
    assert verdict.endswith("rank 1 (10.0.0.2, pid 22) has not finished micro-batch 1 of 8 for 6 s and has not "
                            "answered the watch for 5 s (frozen?); rank 0 finished in 0.4 s")
    watch.rank_finished(1, now=7.0)
    assert watch.stuck(100.0) is None  # every rank finished: nothing is stuck
