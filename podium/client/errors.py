"""Errors a trainer can get from podium's client; each says which teacher, which generation, and what was seen."""

from __future__ import annotations

import time
from collections.abc import Sequence


class PodiumClientError(RuntimeError):
    """Base of the client's errors."""


class TeacherRequestError(PodiumClientError):
    """The teacher refused the request (4xx): retrying the same request cannot help."""

    def __init__(self, teacher: str, generation: str | None, status: int, message: str) -> None:
        self.teacher = teacher
        self.generation = generation
        self.status = status
        self.message = message
        super().__init__(f"teacher {teacher} (generation {generation}) refused the request: HTTP {status}: {message}")


class TeacherServerError(PodiumClientError):
    """The teacher failed while computing (5xx other than 503)."""

    def __init__(self, teacher: str, generation: str | None, status: int, message: str) -> None:
        self.teacher = teacher
        self.generation = generation
        self.status = status
        self.message = message
        super().__init__(f"teacher {teacher} (generation {generation}) failed: HTTP {status}: {message}")


class TeacherRequestFailedError(TeacherServerError, TeacherRequestError):
    """The teacher's computation of this request failed, and sending it again cannot help: the
    teacher said so (HTTP 500, ``X-Podium-Error-Kind: request-failed``: the group survived, the
    request did not), or the generations it was sent to died under it more often than
    ``ClientOptions.max_retries_after_crash`` allows (it may be what kills them). ``status`` is
    None in that case; ``message`` is the cause."""

    def __init__(self, teacher: str, generation: str | None, status: int | None, message: str) -> None:
        self.teacher = teacher
        self.generation = generation
        self.status = status  # type: ignore[assignment]  # None: no answer, the generations died
        self.message = message
        cause = f"HTTP {status}: {message}" if status is not None else message
        text = f"teacher {teacher} (generation {generation}) failed: {cause} (this request is not sent again)"
        PodiumClientError.__init__(self, text)


class TeacherUnavailableError(PodiumClientError, TimeoutError):
    """No answer from the teacher in time: the call's deadline (``call_timeout_s`` or the call's
    ``timeout_s``) or the ready timeout passed while the teacher was down, restarting, not ready or
    not answering. ``generation``: the last one seen (None when no record was read); ``seen``: what
    was seen, oldest first; ``waited_s``: how long the call waited; ``limit``: which limit ended it."""

    def __init__(self, teacher: str, generation: str | None, waited_s: float, seen: Sequence[str],
                 limit: str = "") -> None:
        self.teacher = teacher
        self.generation = generation
        self.waited_s = waited_s
        self.timeout_s = waited_s  # the name this error had before it said which limit ended the wait
        self.seen = list(seen)
        self.limit = limit
        history = "; ".join(self.seen[-6:]) or "nothing"
        ended = f" ({limit})" if limit else ""
        super().__init__(f"teacher {teacher} unavailable after {waited_s:.1f}s{ended}; last generation "
                         f"{generation or 'none'}; seen: {history}")


class TeacherFailedError(PodiumClientError):
    """The teacher's record says ``failed`` for good (``EndpointRecord.failure_is_final``):
    no generation will come back to serve."""

    def __init__(self, teacher: str, generation: str, reason: str | None) -> None:
        self.teacher = teacher
        self.generation = generation
        self.reason = reason
        super().__init__(f"teacher {teacher} generation {generation} failed: {reason or 'no reason given'}")


class TokenizerMismatchError(PodiumClientError):
    """The trainer's tokenizer is not the teacher's: logprobs would be about other tokens."""


class TransportError(ConnectionError):
    """The HTTP exchange itself failed (refused, reset, timed out); the teacher may be restarting.
    ``dropped``: the connection was lost after the whole request was sent and before its answer
    (not a timeout): the server died with the request in hand."""

    def __init__(self, message: str, *, dropped: bool = False) -> None:
        super().__init__(message)
        self.dropped = dropped


class ServerProofError(TransportError):
    """The server at a record's URL did not prove it holds the run's token and is the generation
    the record names (``GET /v2/podium/proof``): the token was not sent there, its answers are not
    used; the client treats that endpoint as gone and follows the records."""


class TeacherStoppedError(TeacherFailedError):
    """The teacher's record says it was stopped for good (``podium down``, ``scancel``, a time limit
    that stops: :meth:`EndpointRecord.stopped_for_good <podium.rendezvous.records.EndpointRecord.stopped_for_good>`):
    nothing brings it back by itself, so a call fails at once instead of waiting ``call_timeout_s``
    (a preempted teacher, which comes back, is still waited for). ``stopped_at``: epoch seconds."""

    def __init__(self, teacher: str, generation: str, reason: str | None, stopped_at: float) -> None:
        self.stopped_at = stopped_at
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(stopped_at))
        super().__init__(teacher, generation, reason)
        PodiumClientError.__init__(
            self, f"teacher {teacher} generation {generation} was stopped at {when} ({reason or 'no reason given'}) "
                  f"and is not coming back by itself: start it again (podium up <recipe>) or point the trainer "
                  f"at a run that serves it")
