"""The endpoint's calls into its group: their size, one at a time on an executor thread, measured.

The scheduler (:mod:`podium.teacher.endpoint.batching`) forms each call from the queued requests' rows;
:class:`GroupCalls` runs it on a thread of its own (so health probes answer while the group
computes), checks what the group returned, and records the call in the endpoint's metrics.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence

import numpy as np

from podium.protocol.batch import Batch, Options
from podium.protocol.names import OUTPUTS
from podium.teacher.endpoint.answer import group_outputs
from podium.teacher.endpoint.batching import CALL_MICROBATCHES, Job, Segment
from podium.teacher.endpoint.config import LogprobGroup
from podium.teacher.endpoint.metrics import EndpointMetrics

DEFAULT_CALL_TOKENS = 16384  # for a group that does not say its token budget


def call_tokens(group: LogprobGroup, configured: int | None) -> int:
    """Tokens of one group call: ``configured``, else the group's micro-batch budget for each DP
    replica, :data:`~podium.teacher.endpoint.batching.CALL_MICROBATCHES` times."""
    if configured:
        return int(configured)
    budget = getattr(group, "max_tokens_per_microbatch", None)
    if not budget:
        return DEFAULT_CALL_TOKENS
    return int(budget) * int(getattr(group, "data_parallel_size", 1) or 1) * CALL_MICROBATCHES


class GroupCalls:
    """The scheduler's group call (:meth:`call`) and what it observes of each (:meth:`observe`)."""

    def __init__(self, group: LogprobGroup, metrics: EndpointMetrics) -> None:
        self.group = group
        self.metrics = metrics
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="podium-infer")

    def _compute(self, batch: Batch, opts: Options, outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Runs on the executor thread: one group call (the scheduler's) at a time."""
        result = self.group.get_logprobs(batch, micro_batch_size=opts.micro_batch_size, top_k=opts.top_k,
                                         temperature=opts.temperature, outputs=outputs)
        return group_outputs(result, batch)

    async def call(self, batch: Batch, job: Job) -> dict[str, np.ndarray]:
        """The scheduler's group call, on the executor thread (health probes answer meanwhile)."""
        outputs = tuple(o for o in OUTPUTS if o in job.outputs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._compute, batch, job.opts, outputs)

    def observe(self, segments: Sequence[Segment], seconds: float) -> None:
        stats = getattr(self.group, "last_call", None)
        tokens = sum(int(s.job.batch.input_lengths[s.start:s.end].sum()) for s in segments)
        waits = [s.job.started - s.job.enqueued for s in segments if s.start == 0 and s.job.started is not None]
        self.metrics.call(seconds=seconds, tokens=tokens, waits=waits,
                          computed_tokens=getattr(stats, "computed_tokens", None),
                          microbatches=getattr(stats, "microbatches", None))

    def shutdown(self) -> None:
        """No more calls; one still running finishes on its thread."""
        self._executor.shutdown(wait=False, cancel_futures=False)
