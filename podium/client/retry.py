"""A call's retry rules: what the client does after each exchange with one of a teacher's replicas.

The teacher is deterministic, so the same request sent again, to the next generation or another
replica, gives the same answer. Each call has one deadline (``ClientOptions.call_timeout_s``, or
the call's ``timeout_s``: :class:`~podium.client.replicas.CallDeadline`) that every wait and every
exchange of the call stays within (an exchange's socket timeouts are never longer than what is
left). Within it, after each exchange, by the answer's ``X-Podium-Error-Kind`` where it has one
(:mod:`podium.protocol.names`):

- ``request-failed`` (500: this request's own computation failed, the group survived) is not
  retried (:class:`TeacherRequestFailedError` with the server's cause) unless the generation that
  answered it is gone since (below);
- ``queue-full`` (503 + ``Retry-After``): that replica gets no request for a backoff
  (:func:`backoff_s`: ``Retry-After``, at least ``poll_interval_s``, doubling on each full answer
  of the call, jittered up to +50%, at most ``max_backoff_s`` unless ``Retry-After`` says more);
  the call goes to another replica meanwhile, or waits for the first one due;
- a connection error or a timeout of an exchange, and any other 503 (``group-broken``, draining,
  not ready), are retried: on another replica that answers, else the records are re-read and the
  call waits (also at most ``ready_timeout_s`` at a time) for a ready endpoint; after a 503 with
  ``Retry-After`` when no replica answers, at most ``min(Retry-After, poll_interval_s)`` first;
- a 5xx other than 503 is retried only when the generation that answered it is gone since (the
  replica's record, re-read, names another generation or says it is not ready any more:
  :func:`gone_since`); else it is :class:`TeacherServerError`;
- a 4xx (``refused``) is never retried (:class:`TeacherRequestError`);
- a request whose generation died under it (the connection dropped after it was sent, a
  ``group-broken`` answer, a 5xx from a generation gone since) is sent again at most
  ``max_retries_after_crash`` times; the next such death ends the call
  (:class:`TeacherRequestFailedError`, :data:`CRASHED`): a request that kills every generation must
  not crash-loop the teacher for as long as the trainer keeps the call alive;
- an answer (2xx) from another generation than the record named (``X-Podium-Generation``) is
  returned (the teacher is deterministic), and the replica is not used again before its record is
  re-read;
- a ``failed`` record ends the call only when that failure is final
  (:meth:`~podium.rendezvous.records.EndpointRecord.failure_is_final`, :class:`TeacherFailedError`) for every
  replica; otherwise the call waits for the next generation (:class:`~podium.client.replicas.ReplicaSet`);
- when the deadline passes: :class:`TeacherUnavailableError` naming the teacher, the last
  generation seen, how long it waited and what it saw (:meth:`~podium.client.replicas.CallDeadline.unavailable`).

Owns :func:`decide`, the rules after one exchange, pure: it takes what the exchange produced
(:class:`Exchange`) and what the call met so far (:class:`Tally`) and returns a :data:`Decision`
(:class:`Answer`, :class:`Fail`, :class:`BackOff`, :class:`FailOver`) with every message to note or
log; :meth:`TeacherClient.send <podium.client.teacher.TeacherClient.send>` makes the exchanges,
reads a replica's record when :func:`asks_answerer` says the rule needs it, and carries the
decisions out.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from podium.client.errors import (
    PodiumClientError,
    TeacherRequestError,
    TeacherRequestFailedError,
    TeacherServerError,
)
from podium.client.options import ClientOptions
from podium.client.replicas import error_text
from podium.protocol.names import ERROR_GROUP_BROKEN, ERROR_QUEUE_FULL, ERROR_REQUEST_FAILED
from podium.rendezvous.records import EndpointRecord, Status

# Why a request is not sent again: it may be what kills the generations (docs/troubleshooting.md quotes it).
CRASHED = "{n} generations died under this request ({seen}); ClientOptions.max_retries_after_crash is {limit}"

Log = tuple[int, str]  # (logging level, message)
Uniform = Callable[[float, float], float]  # the jitter's random source: a number in [a, b]


@dataclass(frozen=True)
class Exchange:
    """What one exchange of a call produced: a transport error (``error``), or an answer."""

    where: str  # the teacher, and which replica when it has several (for errors and logs)
    generation: str  # the generation its record named when the request was sent
    at: str  # where the request went, for what the call saw: "[replica R ]generation G at URL"
    error: str | None = None  # the exchange failed: how
    dropped: bool = False  # ... the connection was lost with the request sent (the server died with it)
    status: int = 0
    kind: str | None = None  # X-Podium-Error-Kind
    body: bytes | bytearray | memoryview = b""
    retry_after_s: float = 0.0  # Retry-After (0: none, or unreadable)
    served: str | None = None  # X-Podium-Generation: the generation that answered
    gone: str | None = None  # after a 5xx :func:`asks_answerer` names: what says that generation is gone since

    @property
    def message(self) -> str:
        return error_text(self.body)


@dataclass(frozen=True)
class Tally:
    """What a call met so far: how each generation died under its request, its queue-full answers."""

    crashes: tuple[str, ...] = ()
    full_answers: int = 0


@dataclass(frozen=True)
class Answer:
    """Return the answer. ``forget``: another generation than the record named gave it, so the
    replica gets no request before its record is re-read."""

    forget: bool = False
    logs: tuple[Log, ...] = ()


@dataclass(frozen=True)
class Fail:
    """End the call with ``error``."""

    error: PodiumClientError


@dataclass(frozen=True)
class BackOff:
    """The replica's queue is full: it gets no request for ``seconds`` (it stays known to answer);
    the request is sent again, to another replica or to this one when it is due."""

    seconds: float
    tally: Tally
    note: str  # what the call saw (for TeacherUnavailableError)
    logs: tuple[Log, ...]


@dataclass(frozen=True)
class FailOver:
    """The replica did not answer: none goes there until its record says it is ready again (the
    call's ready timeout runs meanwhile); the request is sent again, to another replica that
    answers, or after the records are re-read. ``pause_s``: when no replica answers, wait this long
    first (at most: :meth:`pause`)."""

    tally: Tally  # with this exchange's crash, if it was one
    note: str
    logs: tuple[Log, ...]
    pause_s: float = 0.0

    def pause(self, left_s: float) -> float:
        """How long to wait with ``left_s`` left before the call's deadline: never past it."""
        return min(self.pause_s, max(0.0, left_s))


Decision = Answer | Fail | BackOff | FailOver


def asks_answerer(status: int, kind: str | None) -> bool:
    """Whether the rule for this answer asks if the generation that gave it is gone since
    (:attr:`Exchange.gone`; only then is the replica's record re-read): a 5xx that is not a 503,
    ``queue-full`` or ``group-broken`` (those are retried whatever the record says)."""
    return status >= 500 and status != 503 and kind not in (ERROR_QUEUE_FULL, ERROR_GROUP_BROKEN)


def gone_since(generation: str, now: EndpointRecord) -> str | None:
    """What says ``generation`` (the one that answered) is gone, by its replica's record ``now``
    (None: nothing). Then its error came from a teacher that broke under the request, and another
    generation or replica can answer it; else the error is the request's own."""
    if str(now.generation) != generation:
        return f"the record now says generation {now.generation} ({now.status.value})"
    if now.status is not Status.READY:
        return f"its record now says {now.status.value}" + (f" ({now.reason})" if now.reason else "")
    return None


def retry_after_s(header: str | None) -> float:
    """A ``Retry-After`` header's seconds (0: none, not a number, negative or not finite: a NaN or
    negative value would make the pause raise, an infinite one shut the replica out for good)."""
    try:
        seconds = float(header or 0)
    except ValueError:
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def backoff_s(retry_after: float, full_answers: int, options: ClientOptions,
              uniform: Uniform = random.uniform) -> float:
    """How long a replica that said its queue is full gets no request: ``Retry-After`` (at least
    ``poll_interval_s``) doubling with each full answer of the call (``full_answers``, this one
    included), jittered up to +50% so callers turned away together do not come back together, at
    most ``max_backoff_s`` (or ``Retry-After``, when it says more)."""
    base = max(retry_after, options.poll_interval_s) * 2 ** min(full_answers - 1, 16)
    return min(base * uniform(1.0, 1.5), max(options.max_backoff_s, retry_after))


def decide(exchange: Exchange, tally: Tally, options: ClientOptions, uniform: Uniform = random.uniform) -> Decision:
    """What the call does after ``exchange`` (see the module doc), having met ``tally`` before it."""
    ex = exchange
    head = f"teacher {ex.where} generation {ex.generation}"
    if ex.error is not None:
        return _fail_over(ex, tally, options, f"{ex.at}: {ex.error}",
                          crash=f"{ex.at}: connection lost with the request sent" if ex.dropped else None,
                          log=(logging.WARNING, f"{head}: {ex.error}; re-reading the records"))
    if ex.kind == ERROR_QUEUE_FULL:
        full = tally.full_answers + 1
        wait = backoff_s(ex.retry_after_s, full, options, uniform)
        return BackOff(wait, replace(tally, full_answers=full), f"{ex.at}: HTTP {ex.status} {ex.message}",
                       ((logging.INFO, f"{head}: queue full; none sent there for {wait:.1f}s"),))
    if ex.status == 503 or ex.kind == ERROR_GROUP_BROKEN:
        said = f"{ex.at}: HTTP {ex.status} {ex.message}"
        return _fail_over(ex, tally, options, said, crash=said if ex.kind == ERROR_GROUP_BROKEN else None,
                          log=(logging.INFO, f"{head} answered 503; another replica or a ready endpoint"),
                          pause_s=min(ex.retry_after_s, options.poll_interval_s) if ex.retry_after_s else 0.0)
    if 400 <= ex.status < 500:
        return Fail(TeacherRequestError(ex.where, ex.generation, ex.status, ex.message))
    if asks_answerer(ex.status, ex.kind):
        if ex.gone is not None:
            return _fail_over(ex, tally, options, f"{ex.at}: HTTP {ex.status} {ex.message}; {ex.gone}",
                              crash=f"{ex.at}: HTTP {ex.status}; {ex.gone}",
                              log=(logging.WARNING, f"{head} answered HTTP {ex.status} and {ex.gone}; retrying"))
        if ex.kind == ERROR_REQUEST_FAILED:
            return Fail(TeacherRequestFailedError(ex.where, ex.generation, ex.status, ex.message))
    if ex.status >= 300:
        return Fail(TeacherServerError(ex.where, ex.generation, ex.status, ex.message))
    if ex.served and ex.served != ex.generation:
        return Answer(forget=True, logs=((logging.INFO, f"teacher {ex.where}: answered by generation {ex.served}, "
                                          f"record said {ex.generation}; re-reading the record"),))
    return Answer()


def _fail_over(ex: Exchange, tally: Tally, options: ClientOptions, note: str, *, crash: str | None, log: Log,
               pause_s: float = 0.0) -> FailOver | Fail:
    """:class:`FailOver`, the generation's death under the request counted when it is one
    (``crash``: how); past ``max_retries_after_crash`` deaths: :class:`Fail`."""
    if crash is None:
        return FailOver(tally, note, (log,), pause_s)
    crashes = (*tally.crashes, crash)
    limit = options.max_retries_after_crash
    if len(crashes) > limit:
        why = CRASHED.format(n=len(crashes), seen="; ".join(crashes), limit=limit)
        return Fail(TeacherRequestFailedError(ex.where, ex.generation, None, why))
    again = (logging.WARNING, f"teacher {ex.where}: generation {ex.generation} died under this request ({crash}); "
                              f"sending it again ({len(crashes)} of at most {limit})")
    return FailOver(replace(tally, crashes=crashes), note, (again, log), pause_s)
