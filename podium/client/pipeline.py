"""A large call as row chunks in flight at once: the wire overlapped with the teacher's compute.

:func:`row_chunks` and :func:`pipelined` overlap
the wire with the teacher's compute: a call whose answer is at least ``ClientOptions.pipeline_mb``
is sent as up to :data:`MAX_CHUNKS` requests of consecutive rows, at once, each on a connection
of its own thread, when its client has no other call in flight (:class:`Pipeline`). The
endpoint's scheduler batches their rows into group calls as it would the one request's (each
row's answer is its answer alone, whatever it is batched with), so the first chunks' answers
cross the wire while the group computes the later ones: a call costs about the larger of compute
and transfer plus one chunk, not their sum. The rows come back in their order, bit-identical to
one request's.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from podium.protocol.names import (
    INDEX_OUTPUTS,
)

MAX_CHUNKS = 4  # requests in flight for one call: the last one's transfer is what is not overlapped
WORTH = 3.0  # pipelined while answers wait this many times longer than their bodies take to arrive
CHUNK_THREADS = 16  # a teacher client's threads that send pipelined calls' chunks (each keeps its connections)


def row_chunks(rows: int, answer: float, pipeline_mb: float | None) -> list[tuple[int, int]]:
    """Consecutive ``(start, end)`` row ranges of a call whose answer is ``answer`` MB: one range
    below ``pipeline_mb`` (or when None), else 2 to :data:`MAX_CHUNKS` of about equal rows, each
    answering at least half ``pipeline_mb`` where it can."""
    if pipeline_mb is None or answer < pipeline_mb or rows < 2:
        return [(0, rows)]
    n = max(2, min(MAX_CHUNKS, rows, math.floor(2 * answer / pipeline_mb)))
    bounds = [round(i * rows / n) for i in range(n + 1)]
    return list(itertools.pairwise(bounds))


def pipelined(pool: concurrent.futures.Executor, chunks: Sequence[tuple[int, int]], rows: int,
              one: Callable[[int, int, int, float | None], dict[str, np.ndarray]],
              timeout_s: float | None) -> dict[str, np.ndarray]:
    """``one(index, start, end, timeout_s)`` for each chunk at once on ``pool``, all within
    ``timeout_s``; their arrays put together in row order (each copied into place by the thread that
    received it, while the others receive). The first error is raised; chunks not started are not sent."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    lock = threading.Lock()
    out: dict[str, np.ndarray] = {}

    def run(index: int, start: int, end: int) -> None:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        part = one(index, start, end, left)
        with lock:
            for name, array in part.items():
                if name not in out:
                    dtype = np.int64 if name in INDEX_OUTPUTS else array.dtype
                    out[name] = np.empty((rows, *array.shape[1:]), dtype=dtype)
        for name, array in part.items():
            out[name][start:end] = array  # ids widened to int64 on the way

    futures = [pool.submit(run, i, start, end) for i, (start, end) in enumerate(chunks)]
    try:
        for future in concurrent.futures.as_completed(futures):
            future.result()
    finally:
        for future in futures:
            future.cancel()
    return out


class Pipeline:
    """A teacher client's large calls in row chunks (:func:`row_chunks`, :func:`pipelined`), only
    when there is compute to hide the wire behind: while the client has no other call in flight
    (with company, the teacher computes the others' rows while this answer travels, and the chunks
    would only take more of its queue), and while the teacher's answers wait :data:`WORTH` times
    longer for their first byte than their bodies take to arrive (:meth:`observe`: whole answers
    and first chunks): a teacher that answers at once gains nothing from the overlap and the chunks
    cost their own overheads."""

    def __init__(self, pipeline_mb: float | None) -> None:
        self.pipeline_mb = pipeline_mb
        self._lock = threading.Lock()
        self._calls = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.compute_per_wire = WORTH  # the answers' wait over their bodies' reading time, smoothed

    def observe(self, waited_s: float, received_s: float) -> None:
        """An answer waited ``waited_s`` for its headers and took ``received_s`` to read."""
        if received_s > 0.005:  # bodies this small say nothing of the wire
            with self._lock:
                self.compute_per_wire = 0.5 * self.compute_per_wire + 0.5 * waited_s / received_s

    def call(self, rows: int, answer: float, whole: Callable[[], dict[str, np.ndarray]],
             chunk: Callable[[int, int, int, float | None], dict[str, np.ndarray]],
             timeout_s: float | None) -> dict[str, np.ndarray]:
        """``whole()``, or ``chunk(index, start, end, timeout_s)`` for row chunks put together."""
        with self._lock:
            worth = self._calls == 0 and self.compute_per_wire >= WORTH
            self._calls += 1
        try:
            parts = row_chunks(rows, answer, self.pipeline_mb if worth else None)
            if len(parts) == 1:
                return whole()
            with self._lock:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(CHUNK_THREADS, thread_name_prefix="podium-chunk")
                pool = self._pool
            return pipelined(pool, parts, rows, chunk, timeout_s)
        finally:
            with self._lock:
                self._calls -= 1

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
