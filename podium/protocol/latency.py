"""How long a replica's answers take, as one number: the exponentially weighted mean both sides use.

podium's client measures each replica's answers with it and drains a slow one
(:mod:`podium.client.routing`); a teacher's endpoint measures its own batches with the same rule and
publishes the figure in ``/metrics`` (``podium_batch_seconds_recent``), which ``podium status``
compares across a teacher's replicas by the client's own test (:func:`podium.client.routing.is_slow`).
"""

from __future__ import annotations

from dataclasses import dataclass

EWMA_WEIGHT = 0.3  # a new answer's weight in a replica's latency (the last ~5 answers count most)


@dataclass(frozen=True)
class Latency:
    """How long one replica's answers take, as this client measured them (None: not yet)."""

    seconds: float | None = None
    answers: int = 0


def observed(latency: Latency, seconds: float, *, fresh: bool = False) -> Latency:
    """``latency`` after an answer that took ``seconds``; ``fresh``: the answer alone says how fast
    the replica is now (a probe of a drained replica, sent with no other request there)."""
    if latency.seconds is None or fresh:
        return Latency(seconds, latency.answers + 1)
    return Latency((1 - EWMA_WEIGHT) * latency.seconds + EWMA_WEIGHT * seconds, latency.answers + 1)
