"""The endpoint's scheduler: every caller's requests in one queue, batched into group calls.

A teacher is shared by trainers that each send small, ragged batches (NeMo RL's trajectory
collector calls once per prompt group, from a thread pool). Computing them one request at a time
pads each to its own longest row and leaves the model mostly idle between calls; this module
gives the group fewer, fuller calls instead:

- one queue of :class:`Job` (a validated request and its future) from all callers;
- a **call** is formed when the group is free: the caller whose turn it is (callers take turns,
  whatever their options) picks the options of its oldest request (:attr:`Job.key`: top-k,
  temperature, outputs, candidate count; not the row cap ``micro_batch_size``, which cannot change
  an answer), and the call holds the queued requests with those options, up to
  ``call_tokens`` tokens (each row counted at its bucket length,
  :func:`podium.teacher.compute.microbatch.bucket_length`), taken **round-robin across callers** (each
  caller's share of a call is the room left over the callers that still have rows, at least one
  row), so one caller's huge request is split across calls and never holds the others back;
- an idle group waits up to ``max_delay_s`` for company (a request that arrives while the group
  computes waits for the call anyway); a full call starts at once;
- each row's answer goes back to its own request, in its own order; a request is answered when its
  last row is, identical to its answer alone (see ``podium.teacher.compute.microbatch``);
- a request cancelled before its first row was sent leaves the queue; one cancelled mid-way sends
  no more rows. The queue's bound (503 + Retry-After beyond it) is the endpoint's ``max_queue``;
- a call that fails while the group is not ``broken`` is computed again one request at a time, so
  a request whose own computation fails (an out-of-memory, a bug) fails alone and the other
  callers' rows of that call are answered.

The group computes its own micro-batches from a call (token budget, length buckets, DP balance);
the scheduler decides only which rows go together. :func:`form_call` is pure logic, tested
without processes; :class:`Scheduler` runs it on the endpoint's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from podium.protocol.batch import Batch, Options
from podium.teacher.compute.microbatch import bucket_length

logger = logging.getLogger(__name__)

# A call holds this many micro-batches' worth of tokens per data-parallel replica: enough that the
# group's per-call cost (one Ray round trip) is small, few enough that callers take turns often.
CALL_MICROBATCHES = 2

RowBlocks = tuple[np.ndarray, ...]
"""A request's output as consecutive row blocks ``[n_i, width, ...]`` (together: its rows in order)."""


@dataclass(eq=False)
class Job:
    """One request in the queue: its rows, how far they went, and what came back."""

    request_id: str
    caller: str
    batch: Batch
    opts: Options
    outputs: tuple[str, ...]
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
        """Requests with equal keys may share a group call."""
        cands = self.batch.candidate_ids
        return (self.opts.top_k, self.opts.temperature, frozenset(self.outputs),
                None if cands is None else int(cands.shape[-1]))

    @property
    def remaining(self) -> int:
        return self.batch.rows - self.next_row

    @property
    def cancelled(self) -> bool:
        return self.future.done()


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, end)`` of ``job`` at rows ``[offset, offset + end - start)`` of a call."""

    job: Job
    start: int
    end: int
    offset: int


def form_call(queue: Sequence[Job], call_tokens: int, after_caller: str | None = None) -> list[Segment]:
    """The rows of the next group call (see the module doc); marks them sent (``next_row``).

    ``after_caller``: the caller served first in the previous call; the turn starts after it."""
    live = [j for j in queue if j.remaining > 0 and not j.cancelled]
    if not live:
        return []
    callers = list(dict.fromkeys(j.caller for j in live))
    if after_caller in callers:
        turn = callers.index(after_caller) + 1
        callers = callers[turn:] + callers[:turn]
    # The caller whose turn it is picks the call's options (its oldest request's), so a caller with
    # other options takes its turn too instead of waiting until no request with the oldest's is left.
    key = next(j for j in live if j.caller == callers[0]).key
    live = [j for j in live if j.key == key]
    callers = [c for c in callers if any(j.caller == c for j in live)]
    segments: list[Segment] = []
    used = 0
    offset = 0
    while used < call_tokens:
        active = [c for c in callers if any(j.caller == c and j.remaining > 0 for j in live)]
        if not active:
            break
        share = max(1, (call_tokens - used) // len(active))
        progressed = False
        for caller in active:
            taken = 0
            for job in (j for j in live if j.caller == caller and j.remaining > 0):
                start = job.next_row
                while job.remaining > 0:
                    cost = job.costs[job.next_row]
                    # the call's first row always goes
                    if (segments or job.next_row > start) and (taken + cost > share or used + cost > call_tokens):
                        break
                    job.next_row += 1
                    taken += cost
                    used += cost
                if job.next_row > start:
                    segments.append(Segment(job, start, job.next_row, offset))
                    offset += job.next_row - start
                    progressed = True
                if job.remaining > 0 or taken >= share:
                    break  # this caller's share is used (or its next row does not fit)
        if not progressed:
            break
    return segments


def call_batch(segments: Sequence[Segment]) -> Batch:
    """One batch of a call's rows (each row's real tokens; the width is the longest row)."""
    lengths = np.concatenate([s.job.batch.input_lengths[s.start:s.end] for s in segments]).astype(np.int64)
    width = int(lengths.max())
    whole = segments[0].job.batch
    if len(segments) == 1 and segments[0].start == 0 and segments[0].end == whole.rows and \
            whole.input_ids.shape[1] == width and whole.input_ids.flags.c_contiguous:
        # one request, whole: its own arrays (a copy of 8 MB of ids cost 3.7 ms)
        return Batch(input_ids=whole.input_ids, input_lengths=lengths, width=width, candidate_ids=whole.candidate_ids)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    cands = None
    first = segments[0].job.batch.candidate_ids
    if first is not None:
        cands = np.zeros((len(lengths), width, first.shape[-1]), dtype=np.int64)
    for s in segments:
        src = s.job.batch
        w = min(width, src.input_ids.shape[1])
        ids[s.offset:s.offset + s.end - s.start, :w] = src.input_ids[s.start:s.end, :w]
        if cands is not None and src.candidate_ids is not None:  # a call's requests all have them (Job.key)
            cands[s.offset:s.offset + s.end - s.start, :w] = src.candidate_ids[s.start:s.end, :w]
    return Batch(input_ids=ids, input_lengths=lengths, width=width, candidate_ids=cands)


def deliver(segments: Sequence[Segment], result: dict[str, np.ndarray]) -> list[Job]:
    """Each segment's rows of a call's ``result`` into its job, as a block; the jobs now complete.
    A block is the call's own rows (a view) where they span the job's width, so a request's answer
    is never assembled on the teacher: it leaves block by block (:mod:`podium.protocol.oip`).
    Assembling a 64 x 2048 x 64 FP32/INT32 answer (67 MB over 8 calls) cost 13 ms on the event loop,
    against 28 ms for its transfer."""
    finished = []
    for s in segments:
        job = s.job
        rows = s.end - s.start
        for name, array in result.items():
            if name not in job.outputs:
                continue
            block = array[s.offset:s.offset + rows]
            if block.shape[1] != job.batch.width or not block.flags.c_contiguous:
                block = _at_width(block, job.batch.width)
            job.blocks.setdefault(name, {})[s.start] = block
        job.done_rows += rows
        if job.done_rows == job.batch.rows:
            finished.append(job)
    return finished


def _at_width(rows: np.ndarray, width: int) -> np.ndarray:
    """``rows`` cut or zero-padded to ``width`` positions, contiguous (a call is as wide as its
    longest row; a request as its own)."""
    out = np.empty((rows.shape[0], width, *rows.shape[2:]), dtype=rows.dtype)
    w = min(width, rows.shape[1])
    out[:, :w] = rows[:, :w]
    out[:, w:] = 0
    return out


Compute = Callable[[Batch, Job], Awaitable[dict[str, np.ndarray]]]


class Scheduler:
    """Runs :func:`form_call` on the event loop: one group call at a time through ``compute``.

    ``compute(batch, job)`` runs a call (``job``: the call's first job, whose options it uses) and
    returns its outputs as numpy ``[rows, width, ...]``; ``on_call(segments, seconds, waits)``
    observes each call (metrics); ``broken()`` says whether the group can serve no more (then a
    failed call is not computed again). ``batch_requests=False``: one whole request per call, in
    arrival order."""

    def __init__(self, compute: Compute, *, call_tokens: int, max_delay_s: float, batch_requests: bool = True,
                 on_call: Callable[[Sequence[Segment], float], None] | None = None,
                 on_change: Callable[[], None] | None = None, broken: Callable[[], bool] | None = None) -> None:
        self.compute = compute
        self.broken = broken or (lambda: False)
        self.call_tokens = max(1, int(call_tokens))
        self.max_delay_s = max(0.0, float(max_delay_s))
        self.batch_requests = batch_requests
        self.on_call = on_call
        self.on_change = on_change  # after a call ends (its jobs may be answered, the group is free)
        self.in_flight: list[Job] = []
        self.queue: list[Job] = []
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._after: str | None = None
        self.calls = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="podium-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def submit(self, job: Job) -> None:
        self.queue.append(job)
        self._arrived.set()

    @property
    def depth(self) -> int:
        """Requests queued (not cancelled) or in the running call (cancelled ones too)."""
        return len({*(j for j in self.queue if not j.cancelled and j.remaining > 0), *self.in_flight})

    @property
    def queued_rows(self) -> int:
        return sum(j.remaining for j in self.queue if not j.cancelled)

    def _prune(self) -> None:
        self.queue = [j for j in self.queue if j.remaining > 0 and not j.cancelled]

    def _queued_tokens(self) -> int:
        return sum(sum(j.costs[j.next_row:]) for j in self.queue if not j.cancelled)

    async def _wait_for_company(self) -> None:
        """Until a call's worth is queued or the oldest request has waited ``max_delay_s``."""
        while self.batch_requests and self._queued_tokens() < self.call_tokens:
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

    def _next_call(self) -> list[Segment]:
        if self.batch_requests:
            segments = form_call(self.queue, self.call_tokens, self._after)
            if segments:
                self._after = segments[0].job.caller
            return segments
        job = self.queue[0]
        segments = [Segment(job, job.next_row, job.batch.rows, 0)]
        job.next_row = job.batch.rows
        return segments

    async def _loop(self) -> None:
        """Forever: the next call, run. A bug in forming a call fails the requests it touched, never
        the loop (a dead loop would leave every later request waiting)."""
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.exception("scheduler: a call could not be formed or run")
                for job in [*self.in_flight, *self.queue[:1]]:
                    if not job.future.done():
                        job.future.set_exception(exc)
                self.in_flight = []
                self._prune()
                if self.on_change is not None:
                    self.on_change()

    async def _step(self) -> None:
        """Wait for work (and company), then form and run one call."""
        self._prune()
        if not self.queue:
            self._arrived.clear()
            await self._arrived.wait()
            return
        await self._wait_for_company()
        self._prune()
        segments = self._next_call() if self.queue else []
        if not segments:
            return
        now = time.monotonic()
        for s in segments:
            if s.job.started is None:
                s.job.started = now
        self.in_flight = list(dict.fromkeys(s.job for s in segments))
        try:
            await self._run_call(segments)
        finally:
            self.in_flight = []
            self._prune()
            if self.on_change is not None:
                self.on_change()

    async def _run_call(self, segments: list[Segment]) -> None:
        try:
            await self._compute(segments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            jobs = list(dict.fromkeys(s.job for s in segments))
            if len(jobs) == 1 or self.broken():  # the group's error is every request's
                self._fail(jobs, exc)
                return
            logger.warning("scheduler: a call of %d requests failed (%s: %s); computing them one at a time",
                           len(jobs), type(exc).__name__, exc)
            for i, job in enumerate(jobs):
                if job.cancelled:
                    continue
                if self.broken():
                    self._fail(jobs[i:], exc)
                    return
                mine = [s for s in segments if s.job is job]
                alone, offset = [], 0
                for s in mine:
                    alone.append(Segment(job, s.start, s.end, offset))
                    offset += s.end - s.start
                try:
                    await self._compute(alone)
                except asyncio.CancelledError:
                    raise
                except Exception as own:  # this request's own failure
                    self._fail([job], own)

    async def _compute(self, segments: list[Segment]) -> None:
        """One group call of ``segments``; its rows delivered, its finished jobs answered."""
        started = time.perf_counter()
        self.calls += 1
        result = await self.compute(call_batch(segments), segments[0].job)
        if self.on_call is not None:
            self.on_call(segments, time.perf_counter() - started)
        for job in deliver(segments, result):
            if not job.future.done():
                job.future.set_result(job.results)

    @staticmethod
    def _fail(jobs: Sequence[Job], exc: Exception) -> None:
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(exc)
