"""Micro-batches through the pipeline stages, forward only: :func:`forward_only_stage_loop`.

Megatron's own schedules hard-code CUDA; this loop uses ``set_input_tensor`` and point-to-point
``isend``/``recv``, so it works with gloo and NCCL alike. Sends are asynchronous, so stage ``p``
starts micro-batch ``m+1`` while stage ``p+1`` works on ``m``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class StageInfo:
    """This rank's place in the pipeline and how to talk to its neighbours."""

    is_first: bool
    is_last: bool
    prev_rank: int | None
    next_rank: int | None
    group: Any
    hidden_size: int
    dtype: Any
    device: Any


def forward_only_stage_loop(
    model: Any,
    microbatches: Sequence[dict[str, torch.Tensor]],
    stage: StageInfo,
    on_step: Callable[[], None] | None = None,
) -> list[Any]:
    """Run ``microbatches`` (``input_ids``, ``position_ids``, ``labels`` ``[b, s]``) through this stage.

    Returns the last stage's per-micro-batch outputs (the head's dicts); other stages return ``[]``.
    Every rank of a pipeline must be given the same micro-batch shapes, in the same order.
    ``on_step`` is called after each micro-batch (the group's watch counts them: on a GPU, once its
    kernels are queued, which the next collective waits for).
    """
    import torch
    import torch.distributed as dist

    outputs: list[Any] = []
    pending: list[tuple[Any, Any]] = []
    with torch.no_grad():
        for mb in microbatches:
            batch, seq = mb["labels"].shape
            if not stage.is_first:
                received = torch.empty(seq, batch, stage.hidden_size, dtype=stage.dtype, device=stage.device)
                dist.recv(received, src=stage.prev_rank, group=stage.group)
                model.set_input_tensor(received)
            out = model(
                input_ids=mb["input_ids"] if stage.is_first else None,
                position_ids=mb["position_ids"] if stage.is_first else None,
                attention_mask=None,
                labels=mb["labels"] if stage.is_last else None,
            )
            if stage.is_last:
                outputs.append(out)
            else:
                out = out.contiguous()
                pending.append((dist.isend(out, dst=stage.next_rank, group=stage.group), out))
            if on_step is not None:
                on_step()
        for handle, _tensor in pending:
            handle.wait()
    return outputs
