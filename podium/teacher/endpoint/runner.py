"""The endpoint's batches through its group: their size, one at a time on an executor thread, measured.

The batcher (:mod:`podium.teacher.endpoint.batching`) joins the queued requests' rows into each
batch; :class:`GroupRunner` computes it on a thread of its own (so health probes answer while the
group computes), checks what the group returned, and records the batch in the endpoint's metrics.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence

import numpy as np

from podium.protocol.batch import Batch
from podium.protocol.query import Query
from podium.teacher.endpoint.answer import group_outputs
from podium.teacher.endpoint.batching import BATCH_MICROBATCHES, QueuedRequest, Segment
from podium.teacher.endpoint.metrics import EndpointMetrics
from podium.teacher.seam import GroupFacts, ServedGroup

DEFAULT_BATCH_TOKENS = 16384  # for a group that does not state its micro-batch budget


def batch_tokens(facts: GroupFacts, configured: int | None) -> int:
    """Tokens of one batch: ``configured``, else the group's micro-batch budget for each DP
    replica, :data:`~podium.teacher.endpoint.batching.BATCH_MICROBATCHES` times."""
    if configured:
        return int(configured)
    if not facts.max_tokens_per_microbatch:
        return DEFAULT_BATCH_TOKENS
    return int(facts.max_tokens_per_microbatch) * max(1, facts.data_parallel_size) * BATCH_MICROBATCHES


class GroupRunner:
    """The batcher's computation of a batch (:meth:`compute`) and what it observes of each (:meth:`observe`)."""

    def __init__(self, group: ServedGroup, metrics: EndpointMetrics) -> None:
        self.group = group
        self.metrics = metrics
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="podium-infer")

    def _compute(self, batch: Batch, query: Query) -> dict[str, np.ndarray]:
        """Runs on the executor thread: one batch (the batcher's) at a time."""
        return group_outputs(self.group.compute(batch, query), batch)

    async def compute(self, batch: Batch, first: QueuedRequest) -> dict[str, np.ndarray]:
        """A batch, asked as its first request asks (the batcher joins only requests asking alike),
        on the executor thread (health probes answer meanwhile)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._compute, batch, first.query)

    def observe(self, segments: Sequence[Segment], seconds: float) -> None:
        stats = self.group.last_batch
        tokens = sum(int(s.request.batch.input_lengths[s.start:s.end].sum()) for s in segments)
        waits = [s.request.started - s.request.enqueued for s in segments
                 if s.start == 0 and s.request.started is not None]
        self.metrics.batch(seconds=seconds, tokens=tokens, waits=waits,
                          computed_tokens=stats.computed_tokens if stats is not None else None,
                          microbatches=stats.microbatches if stats is not None else None)

    def shutdown(self) -> None:
        """No more batches; one still computing finishes on its thread."""
        self._executor.shutdown(wait=False, cancel_futures=False)
