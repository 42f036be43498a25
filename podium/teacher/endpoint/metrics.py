"""The endpoint's Prometheus metrics (``GET /metrics``, text format), one registry per endpoint.

Names follow Prometheus' conventions (``_total`` counters, ``_seconds`` histograms) under the
``podium_`` prefix; every series carries the teacher's ``teacher`` label, and
``podium_generation_info`` says which job and restart answers. What ``podium status`` shows per
replica (tokens/s and answer bytes/s over the last minute, queue depth, padding share) is read from
here by :func:`~podium.protocol.metrics_text.summary` (which needs no prometheus_client): bytes/s
near the machine's network limit while tokens/s stays below what the GPUs compute says the wire,
not the model, limits the teacher.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from podium.protocol.latency import Latency, observed

# how readers parse this text (no prometheus_client), and the liveness series they read
from podium.protocol.metrics_text import (
    BATCH_SECONDS_RECENT,
    CALL_SECONDS,
    OLDEST_REQUEST,
    RANK_CALL_SECONDS,
    RANK_FORWARD_AGE,
    STUCK,
    summary,
    totals,
)
from podium.teacher.seam import Liveness

disable_created_metrics()  # no *_created series: a scrape shows what was served, not when counters began

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
WINDOW_S = 60.0
_TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _Window:
    """Amounts added over the last :data:`WINDOW_S` seconds, as a per-second rate (thread-safe)."""

    def __init__(self) -> None:
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def add(self, amount: int) -> None:
        with self._lock:
            self._recent.append((time.monotonic(), amount))

    def per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - WINDOW_S:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / WINDOW_S


__all__ = ["CONTENT_TYPE", "WINDOW_S", "EndpointMetrics", "summary", "totals"]


class _Recent:
    """What the latest batches took, as the exponentially weighted mean podium's client keeps of a
    replica's answers (:mod:`podium.protocol.latency`; 0 with none; thread-safe). Latest batches,
    not a time window: a replica its callers route around gets few calls, and what its last ones
    took is what its callers saw."""

    def __init__(self) -> None:
        self._latency = Latency()
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._latency = observed(self._latency, seconds)

    def mean(self) -> float:
        with self._lock:
            return self._latency.seconds or 0.0


class _LivenessCollector(Collector):
    """What the group's watch knows, read when /metrics is (``podium status`` shows it): the age of
    the oldest request, how long the batch computing has run, whether the watch fired, and per rank
    the age of its last forward's end and the seconds its part of the last call took."""

    def __init__(self, teacher: str, liveness: Callable[[], Liveness], oldest_request_s: Callable[[], float]) -> None:
        self.teacher, self.liveness, self.oldest_request_s = teacher, liveness, oldest_request_s

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now, live, t = time.time(), self.liveness(), self.teacher
        for name, doc, value in (
            (OLDEST_REQUEST, "Seconds since the oldest request queued or computing arrived (0: none)",
             self.oldest_request_s()),
            (CALL_SECONDS, "Seconds the batch computing now has run (0: idle)", live.call_age_s or 0.0),
            (STUCK, "1 once the group's watch found a call stuck (the generation then fails)",
             1.0 if live.stuck else 0.0),
        ):
            family = GaugeMetricFamily(name, doc, labels=["teacher"])
            family.add_metric([t], value)
            yield family
        ages = GaugeMetricFamily(RANK_FORWARD_AGE, "Seconds since the rank's part of a call last returned",
                                 labels=["teacher", "rank"])
        took = GaugeMetricFamily(RANK_CALL_SECONDS, "Seconds the rank's part of the last call took",
                                 labels=["teacher", "rank"])
        for rank in live.ranks:
            if rank.last_forward_end is not None:
                ages.add_metric([t, str(rank.rank)], max(0.0, now - rank.last_forward_end))
            if rank.last_call_seconds is not None:
                took.add_metric([t, str(rank.rank)], rank.last_call_seconds)
        yield ages
        yield took


class EndpointMetrics:
    """The counters, gauges and histograms of one endpoint (thread-safe: prometheus_client is)."""

    def __init__(self, teacher: str, queue_depth: Callable[[], float], queued_rows: Callable[[], float],
                 liveness: Callable[[], Liveness] = Liveness, oldest_request_s: Callable[[], float] = lambda: 0.0
                 ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"teacher": teacher}
        r = self.registry
        r.register(_LivenessCollector(teacher, liveness, oldest_request_s))

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, ("teacher", *extra), registry=r)

        self.requests = counter("podium_requests", "Infer requests answered, by HTTP status", ("status",))
        self.rows = counter("podium_rows", "Rows answered 200")
        self.tokens = counter("podium_tokens", "Real tokens (input lengths) of rows answered 200")
        self.computed = counter("podium_computed_tokens",
                                "Token positions the model computed (rows x bucket length, padding included)")
        self.batches = counter("podium_group_calls", "Batches through the group (one or more requests each)")
        self.microbatches = counter("podium_microbatches", "Forward micro-batches run")
        self.errors = counter("podium_errors", "Failed infer requests, by kind", ("kind",))
        self.abandoned = counter("podium_abandoned_requests", "Requests whose client went away before the answer")
        self.forward = Histogram("podium_forward_seconds", "Seconds of one batch through the group", ("teacher",),
                                 buckets=_TIME_BUCKETS, registry=r)
        self.wait = Histogram("podium_queue_wait_seconds", "Seconds from a request's arrival to its first rows' batch",
                              ("teacher",), buckets=_TIME_BUCKETS, registry=r)
        self.batch_tokens = Histogram("podium_call_tokens", "Real tokens in one batch", ("teacher",),
                                     buckets=_TOKEN_BUCKETS, registry=r)
        self.queue = Gauge("podium_queue_depth", "Requests queued or computing", ("teacher",), registry=r)
        self.queue.labels(**labels).set_function(queue_depth)
        self.queue_rows = Gauge("podium_queue_rows", "Rows waiting for a batch", ("teacher",), registry=r)
        self.queue_rows.labels(**labels).set_function(queued_rows)
        self.rate = Gauge("podium_tokens_per_second_1m", "Real tokens answered per second over the last minute",
                          ("teacher",), registry=r)
        self._tokens_1m = _Window()
        self.rate.labels(**labels).set_function(self._tokens_1m.per_second)
        self.response_bytes = counter("podium_response_bytes",
                                      "Body bytes of the infer answers sent (every status; headers not counted)")
        self.bytes_rate = Gauge("podium_response_bytes_per_second_1m",
                                "Body bytes of infer answers sent per second over the last minute", ("teacher",),
                                registry=r)
        self._bytes_1m = _Window()
        self.bytes_rate.labels(**labels).set_function(self._bytes_1m.per_second)
        self.batch_mean = Gauge(BATCH_SECONDS_RECENT, "Seconds of the latest batches through the group, a weighted mean"
                                " (0: none); status compares a teacher's replicas by it", ("teacher",), registry=r)
        self._batch_recent = _Recent()
        self.batch_mean.labels(**labels).set_function(self._batch_recent.mean)
        self.generation = Gauge("podium_generation_info", "The job and restart that answer (value 1)",
                                ("teacher", "job_id", "restart"), registry=r)
        self._teacher = teacher
        for metric in (self.rows, self.tokens, self.computed, self.batches, self.microbatches, self.abandoned,
                       self.response_bytes):
            metric.labels(**labels)  # present (at 0) from the start

    def set_generation(self, job_id: str, restart: int) -> None:
        self.generation.labels(teacher=self._teacher, job_id=job_id, restart=str(restart)).set(1)

    def answered(self, status: int) -> None:
        """An infer request answered with HTTP ``status``."""
        self.requests.labels(teacher=self._teacher, status=str(status)).inc()

    def served(self, rows: int, tokens: int) -> None:
        """The rows and real tokens of a request answered 200."""
        self.rows.labels(teacher=self._teacher).inc(rows)
        self.tokens.labels(teacher=self._teacher).inc(tokens)
        self._tokens_1m.add(tokens)

    def sent(self, body_bytes: int) -> None:
        """The body bytes of an infer answer sent (any status)."""
        self.response_bytes.labels(teacher=self._teacher).inc(body_bytes)
        self._bytes_1m.add(body_bytes)

    def abandoned_request(self) -> None:
        self.abandoned.labels(teacher=self._teacher).inc()

    def failed(self, kind: str) -> None:
        self.errors.labels(teacher=self._teacher, kind=kind).inc()

    def batch(self, *, seconds: float, tokens: int, computed_tokens: int | None, microbatches: int | None,
             waits: list[float]) -> None:
        t = self._teacher
        self.batches.labels(teacher=t).inc()
        self.forward.labels(teacher=t).observe(seconds)
        self._batch_recent.add(seconds)
        self.batch_tokens.labels(teacher=t).observe(tokens)
        self.computed.labels(teacher=t).inc(computed_tokens if computed_tokens is not None else tokens)
        if microbatches:
            self.microbatches.labels(teacher=t).inc(microbatches)
        for w in waits:
            self.wait.labels(teacher=t).observe(w)

    def render(self) -> bytes:
        return generate_latest(self.registry)
