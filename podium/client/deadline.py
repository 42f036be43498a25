"""One call's deadline and what it saw on the way: :class:`CallDeadline`, shared by
:class:`~podium.client.replicas.ReplicaSet` (waiting for a replica) and
:class:`~podium.client.teacher.TeacherClient` (the exchanges), so every wait and every exchange of a
call stays within it, and :class:`TeacherUnavailableError` says what the call saw.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from podium.client.errors import TeacherUnavailableError


@dataclass
class CallDeadline:
    """One call's deadline and what it saw (for :class:`TeacherUnavailableError`)."""

    teacher: str
    limit_s: float
    ready_timeout_s: float
    started: float = field(default_factory=time.monotonic)
    seen: list[str] = field(default_factory=list)
    generation: str | None = None
    waiting_since: float | None = None  # when the teacher was found unusable (the ready timeout runs)

    @property
    def ends_at(self) -> float:
        return self.started + self.limit_s

    def left(self) -> float:
        """Seconds left before the call's deadline (or the ready timeout, while waiting)."""
        end = self.ends_at
        if self.waiting_since is not None:
            end = min(end, self.waiting_since + self.ready_timeout_s)
        return end - time.monotonic()

    def note(self, event: str) -> None:
        event = " ".join(event.split())  # one line
        if not self.seen or self.seen[-1] != event:
            self.seen.append(event)
            del self.seen[:-20]

    def unusable(self) -> None:
        """The teacher cannot answer now: from here the ready timeout runs too (until it can)."""
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def usable(self) -> None:
        self.waiting_since = None

    def unavailable(self) -> TeacherUnavailableError:
        now = time.monotonic()
        if now >= self.ends_at or self.waiting_since is None:
            limit = f"call deadline {self.limit_s:g}s"
        else:
            limit = f"not ready within ready_timeout_s {self.ready_timeout_s:g}s"
        return TeacherUnavailableError(self.teacher, self.generation, now - self.started, self.seen, limit)
