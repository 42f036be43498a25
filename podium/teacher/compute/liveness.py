"""Whether a call in a teacher group is still moving: the watch's pure decisions.

A rank that stops making progress (a frozen process, a rank stuck in a collective its peer never
joins, a wedged read) leaves its call waiting forever while the node, Ray and the endpoint look
alive. The group watches every call it computes (:meth:`TeacherWorkerGroup.compute`): each rank
counts the micro-batches it finished (:meth:`TeacherWorker.progress`, answered on a thread of its
own while the forward runs), the driver asks every unfinished rank about once a second and notes
when each rank's task returns. This module decides, from those observations alone:

- **progress** is the call's start, a micro-batch finished on any rank, or a rank's task returning;
- a call is **stuck** when no progress came for longer than its allowance
  (:func:`allowed_s`): the teacher's own measured speed times the call's largest micro-batch
  (``factor`` times what it should take), never below the floor ``server.stuck_after_s``. A slow
  but moving call is not stuck: each finished micro-batch restarts the clock (on a loaded node a
  forward takes many times its usual time, and a watch that fired on that would turn load into
  outages);
- the verdict names the ranks: which have not finished which micro-batch for how long (those that
  no longer answer the watch first: the frozen one), and which finished, in how long.

Times are the driver's monotonic clock; a rank's report carries only durations measured on its
own clock (``since_s``), so clocks of different nodes never meet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

WATCH_FACTOR = 10.0  # a micro-batch may take this many times what the teacher's measured speed says
# A rank that has not answered the watch for this share of the allowance is named as silent (a
# frozen process): one that answers, if slowly on a loaded node, answers within a few seconds.
SILENT_SHARE = 0.5


@dataclass(frozen=True)
class RankReport:
    """What one rank says of the call it runs (:meth:`TeacherWorker.progress`)."""

    call: int  # the group's number of the call (0: none yet)
    microbatches: int  # this rank's micro-batches in that call
    done: int  # of which finished
    since_s: float  # seconds since its last event (the call's start or a micro-batch's end), its own clock


@dataclass(frozen=True)
class RankSeat:
    """A rank as the verdict names it."""

    rank: int
    where: str  # its node (address) and process: "127.0.0.12, pid 4242"
    microbatches: int  # the micro-batches the driver planned for it in this call


def allowed_s(floor_s: float, tokens_per_s: float | None, step_tokens: int, factor: float = WATCH_FACTOR) -> float:
    """How long a call may go without progress: ``factor`` × the seconds its largest micro-batch
    (``step_tokens`` token positions) takes at the teacher's measured speed, never below
    ``floor_s`` (and ``floor_s`` alone before the teacher has a measured speed)."""
    if not tokens_per_s or tokens_per_s <= 0:
        return floor_s
    return max(floor_s, factor * step_tokens / tokens_per_s)


@dataclass
class CallWatch:
    """What the driver saw of one call (:attr:`call`) on its ranks, and whether it is stuck."""

    call: int
    seats: Sequence[RankSeat]
    allowed_s: float
    started: float  # the driver's monotonic clock
    what: str = "call"  # "call" or "warm-up forward": how the verdict names it
    last_progress: float = field(init=False)
    finished: dict[int, float] = field(default_factory=dict)  # rank -> when its task returned
    reports: dict[int, RankReport] = field(default_factory=dict)
    answered: dict[int, float] = field(default_factory=dict)  # rank -> when it last answered the watch

    def __post_init__(self) -> None:
        self.last_progress = self.started

    def rank_finished(self, rank: int, now: float) -> None:
        self.finished.setdefault(rank, now)
        self.last_progress = max(self.last_progress, now)

    def report(self, rank: int, report: RankReport, now: float) -> None:
        """A rank's answer to the watch; a micro-batch it finished since the last one is progress
        (dated by its own account of how long ago)."""
        self.answered[rank] = now
        if report.call != self.call:  # still on nothing (or on an earlier call): no news
            return
        before = self.reports.get(rank)
        if report.done > (before.done if before is not None else 0):
            self.last_progress = max(self.last_progress, now - max(0.0, report.since_s))
        self.reports[rank] = report

    def pending(self) -> list[RankSeat]:
        return [seat for seat in self.seats if seat.rank not in self.finished]

    def stuck(self, now: float) -> str | None:
        """The verdict (see the module doc) once the call went without progress for longer than
        :attr:`allowed_s`, else None."""
        if now - self.last_progress <= self.allowed_s or not self.pending():
            return None
        return self.describe(now)

    def describe(self, now: float) -> str:
        waiting = sorted(self.pending(), key=lambda s: (-self._silent_s(s.rank, now), self._done(s.rank), s.rank))
        parts = [self._not_finished(seat, now) for seat in waiting]
        if self.finished:
            took = max(at - self.started for at in self.finished.values())
            ranks = ", ".join(str(r) for r in sorted(self.finished))
            parts.append(f"rank{'s' if len(self.finished) > 1 else ''} {ranks} finished in {took:.1f} s")
        return (f"stuck {self.what}: no progress for {now - self.last_progress:.0f} s (allowed "
                f"{self.allowed_s:.0f} s): " + "; ".join(parts))

    def _done(self, rank: int) -> int:
        report = self.reports.get(rank)
        return report.done if report is not None else 0

    def _silent_s(self, rank: int, now: float) -> float:
        return now - self.answered.get(rank, self.started)

    def _not_finished(self, seat: RankSeat, now: float) -> str:
        report = self.reports.get(seat.rank)
        total = report.microbatches if report is not None else seat.microbatches
        done = self._done(seat.rank)
        since = now - self.started if report is None else now - self.answered[seat.rank] + report.since_s
        text = (f"rank {seat.rank} ({seat.where}) has not finished micro-batch {min(done + 1, total)} of {total} "
                f"for {since:.0f} s")
        silent = self._silent_s(seat.rank, now)
        if silent >= SILENT_SHARE * self.allowed_s:
            text += f" and has not answered the watch for {silent:.0f} s (frozen?)"
        return text
