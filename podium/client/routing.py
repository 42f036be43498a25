"""Which of a teacher's replicas a request goes to, which are slow, and when a request is sent twice:
the rules alone, pure (no socket, no thread, no clock: the time is given).

A replica's speed is what this client measures of it: :class:`Latency`, an exponentially weighted
mean of how long its answers took (request sent to answer read), per replica. From it:

- **least expected wait** (:func:`choose`): a request goes to the replica whose
  ``(outstanding + 1) x latency`` is least (its requests in flight from this client, this one
  included, at its measured time per request; Finagle's "peak EWMA" cost). A replica not measured
  yet counts as the median of those that are (:func:`typical_s`), so a new one gets requests.
  Costs within :data:`TIE_RATIO` of the least are noise, not speed (answer times on a loaded node
  jitter by that much): among those the fewest outstanding requests win, ties taken in turn, as
  plain least-outstanding routing does;
- **slow** (:func:`is_slow`): a replica whose latency is over ``ClientOptions.slow_factor`` times the
  median of the other replicas' is drained: no request goes there while another usable replica is
  not slow, but one request every ``ClientOptions.slow_probe_s`` (a probe, with none other of this
  client's in flight there), whose answer replaces its latency (:func:`observed` with ``fresh``):
  a probe answered at the others' speed ends the drain;
- **hedging** (:func:`hedge_after_s`, :class:`HedgeBudget`): a request still unanswered
  ``max(hedge_factor x its replica's usual time, hedge_min_s)`` after it was sent is sent once more,
  to another replica, and the first answer wins (the teacher is deterministic); the usual time is
  the lesser of the replica's own latency and the others' median, so a request to a slow replica
  is hedged at the healthy ones' pace. At most ``hedge_fraction`` of requests are hedged (a token
  bucket each request adds to), never a request twice, so hedging cannot double a healthy
  teacher's load. The copy that lost is cancelled; the time it had taken is a lower bound on its
  replica's latency (:func:`censored`), which never lowers the estimate.

:class:`~podium.client.replicas.ReplicaSet` keeps each replica's :class:`Latency` and applies these
rules; :mod:`podium.client.hedge` sends the second copy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from podium.client.options import ClientOptions
from podium.protocol.latency import EWMA_WEIGHT, Latency, observed

__all__ = ["EWMA_WEIGHT", "Latency", "observed"]  # the rule's pieces both sides share, here as before

TIE_RATIO = 2.0  # expected waits within this factor of the least are alike (then: fewest outstanding, in turn)
# A replica is slow only when also this much slower than the others: answers of a few milliseconds
# jitter by several times on a loaded node, which is no reason to drain a healthy replica.
SLOW_MIN_GAP_S = 0.25
HEDGE_BURST = 2.0  # hedges a burst of slow answers may take at once, beyond hedge_fraction of the requests


def censored(latency: Latency, seconds: float) -> Latency:
    """``latency`` after a request cancelled unanswered ``seconds`` after it was sent (the copy
    that lost a hedge): its answer would have taken longer, so the estimate can only rise."""
    return Latency(max(latency.seconds or 0.0, seconds), latency.answers)


def typical_s(latencies: Sequence[float | None]) -> float | None:
    """The median of the measured ``latencies`` (None when none is)."""
    known = [s for s in latencies if s is not None]
    return statistics.median(known) if known else None


def is_slow(own_s: float | None, others_s: Sequence[float | None], factor: float | None) -> bool:
    """Whether a replica answering in ``own_s`` is slow beside replicas answering in ``others_s``:
    over ``factor`` times their median and slower by :data:`SLOW_MIN_GAP_S` at least (never when
    either is unmeasured, or ``factor`` is None)."""
    others = typical_s(others_s)
    return (factor is not None and own_s is not None and others is not None and own_s > factor * others
            and own_s - others >= SLOW_MIN_GAP_S)


def judged(latencies: Sequence[float | None], factor: float | None) -> list[bool]:
    """Which of the replicas answering in ``latencies`` are slow (:func:`is_slow` beside the others)."""
    return [is_slow(own, [*latencies[:i], *latencies[i + 1:]], factor) for i, own in enumerate(latencies)]


@dataclass(frozen=True)
class SlowReplica:
    """A replica drained for its slowness: which, where, how slow beside the others."""

    replica: int
    url: str
    latency_s: float  # its answers' time, as this client measured it
    others_s: float | None  # the median of the other usable replicas'


@dataclass(frozen=True)
class Candidate:
    """A usable replica as the choice sees it: its place in the list (the turn order), this
    client's requests in flight there, its measured latency."""

    index: int
    outstanding: int
    latency_s: float | None


def expected_wait(candidate: Candidate, typical: float | None) -> float:
    """How long a request sent there now would take: ``(outstanding + 1) x latency``, an unmeasured
    replica at the ``typical`` one (none measured: every request counts 1)."""
    per_request = candidate.latency_s if candidate.latency_s is not None else typical
    return (candidate.outstanding + 1) * (per_request if per_request is not None else 1.0)


def choose(candidates: Sequence[Candidate], turn: int, count: int) -> Candidate:
    """The candidate with the least expected wait; among those within :data:`TIE_RATIO` of it, the
    fewest outstanding requests, then the first at or after ``turn`` (of ``count`` replicas)."""
    if not candidates:
        raise ValueError("no replica to choose from")
    typical = typical_s([c.latency_s for c in candidates])
    waits = {c.index: expected_wait(c, typical) for c in candidates}
    least = min(waits.values())
    alike = [c for c in candidates if waits[c.index] <= least * TIE_RATIO]
    return min(alike, key=lambda c: (c.outstanding, (c.index - turn) % count))


def hedge_after_s(own_s: float | None, others_s: Sequence[float | None], options: ClientOptions) -> float | None:
    """When a request to a replica answering in ``own_s`` is sent again elsewhere, the other
    usable replicas answering in ``others_s``: ``max(hedge_factor x usual, hedge_min_s)``, the
    usual time the lesser of its own and the others' median. None: never (hedging off, no other
    replica, or nothing measured yet to say what is usual)."""
    others = typical_s(others_s)
    if options.hedge_factor is None or not others_s:
        return None
    usual = min((s for s in (own_s, others) if s is not None), default=None)
    if usual is None:
        return None
    return max(options.hedge_factor * usual, options.hedge_min_s)


@dataclass
class HedgeBudget:
    """How many requests may still be hedged: each request sent adds ``fraction`` of a hedge (at
    most :data:`HEDGE_BURST` saved), each hedge takes one, so at most ``fraction`` of the requests
    (plus the burst) are ever hedged."""

    fraction: float
    tokens: float = 0.0

    def earn(self) -> None:
        """A request was sent."""
        self.tokens = min(self.tokens + self.fraction, HEDGE_BURST)

    def take(self) -> bool:
        """Whether a request may be hedged now (then the hedge is paid for)."""
        if self.tokens < 1.0 - 1e-9:  # ten requests of 0.1 add up to 0.9999999999999999
            return False
        self.tokens -= 1.0
        return True
