"""Errors a trainer can get from podium's client; each says which teacher, which generation, and what was seen."""

from __future__ import annotations

from typing import Optional, Sequence


class PodiumClientError(RuntimeError):
    """Base of the client's errors."""


class TeacherRequestError(PodiumClientError):
    """The teacher refused the request (4xx): retrying the same request cannot help."""

    def __init__(self, teacher: str, generation: Optional[str], status: int, message: str) -> None:
        self.teacher = teacher
        self.generation = generation
        self.status = status
        self.message = message
        super().__init__(f"teacher {teacher} (generation {generation}) refused the request: HTTP {status}: {message}")


class TeacherServerError(PodiumClientError):
    """The teacher failed while computing (5xx other than 503)."""

    def __init__(self, teacher: str, generation: Optional[str], status: int, message: str) -> None:
        self.teacher = teacher
        self.generation = generation
        self.status = status
        self.message = message
        super().__init__(f"teacher {teacher} (generation {generation}) failed: HTTP {status}: {message}")


class TeacherUnavailableError(PodiumClientError, TimeoutError):
    """The teacher did not become ready (again) within the client's ready timeout."""

    def __init__(self, teacher: str, timeout_s: float, seen: Sequence[str]) -> None:
        self.teacher = teacher
        self.timeout_s = timeout_s
        self.seen = list(seen)
        history = "; ".join(self.seen[-6:]) or "nothing"
        super().__init__(f"teacher {teacher} not ready after {timeout_s:.0f}s; last seen: {history}")


class TeacherFailedError(PodiumClientError):
    """The teacher's record says ``failed``: it will not serve this generation."""

    def __init__(self, teacher: str, generation: str, reason: Optional[str]) -> None:
        self.teacher = teacher
        self.generation = generation
        self.reason = reason
        super().__init__(f"teacher {teacher} generation {generation} failed: {reason or 'no reason given'}")


class TokenizerMismatchError(PodiumClientError):
    """The trainer's tokenizer is not the teacher's: logprobs would be about other tokens."""


class TransportError(ConnectionError):
    """The HTTP exchange itself failed (refused, reset, timed out); the teacher may be restarting."""
