"""The endpoint's batcher: every caller's requests in one queue, joined into batches for the group.

A teacher is shared by trainers that each send small, ragged batches (NeMo RL's trajectory
collector calls once per prompt group, from a thread pool). Computing them one request at a time
pads each to its own longest row and leaves the model mostly idle between them; this module
gives the group fewer, fuller batches instead:

- one queue of :class:`QueuedRequest` (a validated request and its future) from all callers;
- a **batch** is formed when the group is free: the caller whose turn it is (callers take turns,
  whatever their queries) picks the query of its oldest request (:attr:`QueuedRequest.key`: what
  computes alike, :attr:`~podium.protocol.query.Query.computed_alike`, and the candidate count; not
  the row cap ``micro_batch_size`` or the wire dtypes, which cannot change an answer), and the batch
  holds the queued requests asking alike, up to ``batch_tokens`` tokens (each row counted at its bucket length,
  :func:`podium.teacher.compute.microbatch.bucket_length`), taken **round-robin across callers** (each
  caller's share of a batch is the room left over the callers that still have rows, at least one
  row), so one caller's huge request is split across batches and never holds the others back;
- an idle group waits up to ``max_delay_s`` for company (a request that arrives while the group
  computes waits for the running batch anyway); a full batch starts at once;
- each row's answer goes back to its own request, in its own order; a request is answered when its
  last row is, identical to its answer alone (see ``podium.teacher.compute.microbatch``);
- a request cancelled before its first row was sent leaves the queue; one cancelled mid-way sends
  no more rows. The queue's bound (503 + Retry-After beyond it) is the endpoint's ``max_queue``;
- a batch that fails while the group is not ``broken`` is computed again one request at a time, so
  a request whose own computation fails (an out-of-memory, a bug) fails alone and the other
  callers' rows of that batch are answered.

The group computes its own micro-batches from a batch (token budget, length buckets, DP balance);
the batcher decides only which rows go together. :func:`form_batch` is pure logic, tested
without processes; :class:`RequestBatcher` runs it on the endpoint's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from podium.protocol.batch import Batch
from podium.protocol.query import Query
from podium.teacher.compute.microbatch import bucket_length

logger = logging.getLogger(__name__)

# A batch holds this many micro-batches' worth of tokens per data-parallel replica: enough that the
# group's per-batch cost (one Ray round trip) is small, few enough that callers take turns often.
BATCH_MICROBATCHES = 2

RowBlocks = tuple[np.ndarray, ...]
"""A request's output as consecutive row blocks ``[n_i, width, ...]`` (together: its rows in order)."""


@dataclass(eq=False)
class QueuedRequest:
    """One request in the queue: its rows, how far they went, and what came back."""

    request_id: str
    caller: str
    batch: Batch
    query: Query
    future: asyncio.Future[dict[str, RowBlocks]]
    enqueued: float = field(default_factory=time.monotonic)
    seq_multiple: int = 1
    next_row: int = 0  # rows [0, next_row) were sent to the group
    done_rows: int = 0
    started: float | None = None  # when its first rows went to the group
    blocks: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)  # output -> first row -> rows

    @property
    def results(self) -> dict[str, RowBlocks]:
        """Each output's row blocks in row order (whole once ``done_rows`` is every row)."""
        return {name: tuple(by_start[k] for k in sorted(by_start)) for name, by_start in self.blocks.items()}

    def __post_init__(self) -> None:
        self.costs = [bucket_length(n, self.seq_multiple) for n in self.batch.input_lengths.tolist()]

    @property
    def key(self) -> tuple[Any, ...]:
        """Requests with equal keys may share a batch."""
        return (*self.query.computed_alike, self.batch.candidates)

    @property
    def remaining(self) -> int:
        return self.batch.rows - self.next_row

    @property
    def cancelled(self) -> bool:
        return self.future.done()


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, end)`` of ``request`` at rows ``[offset, offset + end - start)`` of a batch."""

    request: QueuedRequest
    start: int
    end: int
    offset: int


def form_batch(queue: Sequence[QueuedRequest], batch_tokens: int, after_caller: str | None = None) -> list[Segment]:
    """The rows of the next batch (see the module doc); marks them sent (``next_row``).

    ``after_caller``: the caller served first in the previous batch; the turn starts after it."""
    live = [j for j in queue if j.remaining > 0 and not j.cancelled]
    if not live:
        return []
    callers = list(dict.fromkeys(j.caller for j in live))
    if after_caller in callers:
        turn = callers.index(after_caller) + 1
        callers = callers[turn:] + callers[:turn]
    # The caller whose turn it is picks the batch's query (its oldest request's), so a caller asking
    # otherwise takes its turn too instead of waiting until no request asking as the oldest is left.
    key = next(j for j in live if j.caller == callers[0]).key
    live = [j for j in live if j.key == key]
    callers = [c for c in callers if any(j.caller == c for j in live)]
    segments: list[Segment] = []
    used = 0
    offset = 0
    while used < batch_tokens:
        active = [c for c in callers if any(j.caller == c and j.remaining > 0 for j in live)]
        if not active:
            break
        share = max(1, (batch_tokens - used) // len(active))
        progressed = False
        for caller in active:
            taken = 0
            for request in (j for j in live if j.caller == caller and j.remaining > 0):
                start = request.next_row
                while request.remaining > 0:
                    cost = request.costs[request.next_row]
                    # the batch's first row always goes
                    if (segments or request.next_row > start) and (taken + cost > share or used + cost > batch_tokens):
                        break
                    request.next_row += 1
                    taken += cost
                    used += cost
                if request.next_row > start:
                    segments.append(Segment(request, start, request.next_row, offset))
                    offset += request.next_row - start
                    progressed = True
                if request.remaining > 0 or taken >= share:
                    break  # this caller's share is used (or its next row does not fit)
        if not progressed:
            break
    return segments


def join_rows(segments: Sequence[Segment]) -> Batch:
    """The segments' rows joined into one batch (each row's real tokens; the width is the longest row)."""
    lengths = np.concatenate([s.request.batch.input_lengths[s.start:s.end] for s in segments]).astype(np.int64)
    width = int(lengths.max())
    whole = segments[0].request.batch
    if len(segments) == 1 and segments[0].start == 0 and segments[0].end == whole.rows and \
            whole.input_ids.shape[1] == width and whole.input_ids.flags.c_contiguous:
        # one request, whole: its own arrays (a copy of 8 MB of ids cost 3.7 ms)
        return Batch(input_ids=whole.input_ids, input_lengths=lengths, width=width, candidate_ids=whole.candidate_ids)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    cands = None
    first = segments[0].request.batch.candidate_ids
    if first is not None:
        cands = np.zeros((len(lengths), width, first.shape[-1]), dtype=np.int64)
    for s in segments:
        src = s.request.batch
        w = min(width, src.input_ids.shape[1])
        ids[s.offset:s.offset + s.end - s.start, :w] = src.input_ids[s.start:s.end, :w]
        if cands is not None and src.candidate_ids is not None:  # a batch's requests all have them (QueuedRequest.key)
            cands[s.offset:s.offset + s.end - s.start, :w] = src.candidate_ids[s.start:s.end, :w]
    return Batch(input_ids=ids, input_lengths=lengths, width=width, candidate_ids=cands)


def deliver(segments: Sequence[Segment], result: dict[str, np.ndarray]) -> list[QueuedRequest]:
    """Each segment's rows of a batch's ``result`` into its request, as a block; the requests now complete.
    A block is the batch's own rows (a view) where they span the request's width, so a request's answer
    is never assembled on the teacher: it leaves block by block (:mod:`podium.protocol.oip`).
    Assembling a 64 x 2048 x 64 FP32/INT32 answer (67 MB over 8 batches) cost 13 ms on the event loop,
    against 28 ms for its transfer."""
    finished = []
    for s in segments:
        request = s.request
        rows = s.end - s.start
        for name, array in result.items():
            if not request.query.wants(name):
                continue
            block = array[s.offset:s.offset + rows]
            if block.shape[1] != request.batch.width or not block.flags.c_contiguous:
                block = _at_width(block, request.batch.width)
            request.blocks.setdefault(name, {})[s.start] = block
        request.done_rows += rows
        if request.done_rows == request.batch.rows:
            finished.append(request)
    return finished


def _at_width(rows: np.ndarray, width: int) -> np.ndarray:
    """``rows`` cut or zero-padded to ``width`` positions, contiguous (a batch is as wide as its
    longest row; a request as its own)."""
    out = np.empty((rows.shape[0], width, *rows.shape[2:]), dtype=rows.dtype)
    w = min(width, rows.shape[1])
    out[:, :w] = rows[:, :w]
    out[:, w:] = 0
    return out


Compute = Callable[[Batch, QueuedRequest], Awaitable[dict[str, np.ndarray]]]


class RequestBatcher:
    """Runs :func:`form_batch` on the event loop: one batch at a time through ``compute``.

    ``compute(batch, request)`` computes a batch (``request``: its first request, whose query it
    asks) and returns its outputs as numpy ``[rows, width, ...]``; ``on_batch(segments, seconds)``
    observes each batch (metrics); ``broken()`` says whether the group can serve no more (then a
    failed batch is not computed again). ``batch_requests=False``: one whole request per batch, in
    arrival order."""

    def __init__(self, compute: Compute, *, batch_tokens: int, max_delay_s: float, batch_requests: bool = True,
                 on_batch: Callable[[Sequence[Segment], float], None] | None = None,
                 on_change: Callable[[], None] | None = None, broken: Callable[[], bool] | None = None) -> None:
        self.compute = compute
        self.broken = broken or (lambda: False)
        self.batch_tokens = max(1, int(batch_tokens))
        self.max_delay_s = max(0.0, float(max_delay_s))
        self.batch_requests = batch_requests
        self.on_batch = on_batch
        self.on_change = on_change  # after a batch ends (its requests may be answered, the group is free)
        self.in_flight: list[QueuedRequest] = []
        self.queue: list[QueuedRequest] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._after: str | None = None
        self.batches = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="podium-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def submit(self, request: QueuedRequest) -> None:
        self.queue.append(request)
        self._arrived.set()

    @property
    def depth(self) -> int:
        """Requests queued (not cancelled) or in the running batch (cancelled ones too)."""
        return len({*(j for j in self.queue if not j.cancelled and j.remaining > 0), *self.in_flight})

    @property
    def queued_rows(self) -> int:
        return sum(j.remaining for j in self.queue if not j.cancelled)

    def oldest_age_s(self) -> float:
        """Seconds since the oldest request queued or computing arrived (0 with none)."""
        waiting = [j.enqueued for j in (*self.queue, *self.in_flight) if not j.future.done()]
        return time.monotonic() - min(waiting) if waiting else 0.0

    def _prune(self) -> None:
        self.queue = [j for j in self.queue if j.remaining > 0 and not j.cancelled]

    def _queued_tokens(self) -> int:
        return sum(sum(j.costs[j.next_row:]) for j in self.queue if not j.cancelled)

    async def _wait_for_company(self) -> None:
        """Until a batch's worth is queued or the oldest request has waited ``max_delay_s``."""
        while self.batch_requests and self._queued_tokens() < self.batch_tokens:
            oldest = min(j.enqueued for j in self.queue)
            left = self.max_delay_s - (time.monotonic() - oldest)
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                return
            self._prune()
            if not self.queue:
                return

    def _next_batch(self) -> list[Segment]:
        if self.batch_requests:
            segments = form_batch(self.queue, self.batch_tokens, self._after)
            if segments:
                self._after = segments[0].request.caller
            return segments
        request = self.queue[0]
        segments = [Segment(request, request.next_row, request.batch.rows, 0)]
        request.next_row = request.batch.rows
        return segments

    async def _loop(self) -> None:
        """Forever: the next batch, computed. A bug in forming a batch fails the requests it touched, never
        the loop (a dead loop would leave every later request waiting)."""
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.exception("batcher: a batch could not be formed or computed")
                for request in [*self.in_flight, *self.queue[:1]]:
                    if not request.future.done():
                        request.future.set_exception(exc)
                self.in_flight = []
                self._prune()
                if self.on_change is not None:
                    self.on_change()

    async def _step(self) -> None:
        """Wait for work (and company), then form and compute one batch."""
        self._prune()
        if not self.queue:
            self._arrived.clear()
            await self._arrived.wait()
            return
        await self._wait_for_company()
        self._prune()
        segments = self._next_batch() if self.queue else []
        if not segments:
            return
        now = time.monotonic()
        for s in segments:
            if s.request.started is None:
                s.request.started = now
        self.in_flight = list(dict.fromkeys(s.request for s in segments))
        try:
            await self._run_batch(segments)
        finally:
            self.in_flight = []
            self._prune()
            if self.on_change is not None:
                self.on_change()

    async def _run_batch(self, segments: list[Segment]) -> None:
        try:
            await self._compute(segments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            requests = list(dict.fromkeys(s.request for s in segments))
            if len(requests) == 1 or self.broken():  # the group's error is every request's
                self._fail(requests, exc)
                return
            logger.warning("batcher: a batch of %d requests failed (%s: %s); computing them one at a time",
                           len(requests), type(exc).__name__, exc)
            for i, request in enumerate(requests):
                if request.cancelled:
                    continue
                if self.broken():
                    self._fail(requests[i:], exc)
                    return
                mine = [s for s in segments if s.request is request]
                alone, offset = [], 0
                for s in mine:
                    alone.append(Segment(request, s.start, s.end, offset))
                    offset += s.end - s.start
                try:
                    await self._compute(alone)
                except asyncio.CancelledError:
                    raise
                except Exception as own:  # this request's own failure
                    self._fail([request], own)

    async def _compute(self, segments: list[Segment]) -> None:
        """One batch of ``segments`` through the group; its rows delivered, its finished requests answered."""
        started = time.perf_counter()
        self.batches += 1
        result = await self.compute(join_rows(segments), segments[0].request)
        if self.on_batch is not None:
            self.on_batch(segments, time.perf_counter() - started)
        for request in deliver(segments, result):
            if not request.future.done():
                request.future.set_result(request.results)

    @staticmethod
    def _fail(requests: Sequence[QueuedRequest], exc: Exception) -> None:
        for request in requests:
            if not request.future.done():
                request.future.set_exception(exc)
