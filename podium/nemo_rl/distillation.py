"""A podium teacher where NeMo RL's distillation loop holds its teacher ``Policy``.

Owns :class:`RemoteDistillationTeacher`: everything ``nemo_rl/algorithms/distillation.py``
(7ea279a) calls on ``teacher_policy``: ``offload_after_refit()`` after construction and after each
step, ``prepare_for_lp_inference()`` and ``get_topk_logits(train_data, k=..., timer=...)`` each step.
The teacher's memory is its own (another allocation), so the two memory moves are no-ops.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from podium.nemo_rl.remote import RemoteTeacher, as_batched_data_dict


class RemoteDistillationTeacher(RemoteTeacher):
    """NeMo RL distillation teacher (``Policy``) for one podium teacher.

    ``values_datatype="BF16"`` halves the top-k values' bytes on the wire (rounded to bfloat16); ids
    travel INT32 (``indices_datatype="INT64"``: wide); returned as float32 / int64 either way. The other keywords are
    :class:`~podium.nemo_rl.remote.RemoteTeacher`'s (``options``, ``model``, ``client``); any other
    raises :class:`TypeError`."""

    def __init__(self, rendezvous_path: str | Path, alias: str, *, values_datatype: str = "FP32",
                 indices_datatype: str = "INT32", **kwargs: Any) -> None:
        super().__init__(rendezvous_path, alias, **kwargs)
        self.values_datatype = values_datatype
        self.indices_datatype = indices_datatype

    def get_topk_logits(self, data: Any, k: int, micro_batch_size: int | None = None, timer: Any = None) -> Any:
        """``{"topk_logits": float32 [B, S, k], "topk_indices": int64 [B, S, k]}`` on CPU: the
        temperature-scaled logits of the ``k`` likeliest next tokens, position ``t`` holding the
        distribution of the token after ``t`` (NeMo RL's loss slices ``[:, :-1]``); zeros at and
        past ``length - 1``, which NeMo RL's mask never reads. ``data`` is only read."""
        timed = timer.time("get_topk_logits/podium") if timer is not None else contextlib.nullcontext()
        with timed:
            result = self.teacher().get_topk_logits(data, int(k), micro_batch_size=micro_batch_size,
                                                    values_datatype=self.values_datatype,
                                                    indices_datatype=self.indices_datatype)
        return as_batched_data_dict(result)

    def prepare_for_lp_inference(self, keep_train_buffers: bool = False) -> None:
        """No-op: a remote teacher's weights are always where it computes."""

    def offload_after_refit(self) -> None:
        """No-op: nothing of the teacher's lives on the trainer's GPUs."""

    def offload_before_refit(self) -> None:
        """No-op: nothing of the teacher's lives on the trainer's GPUs."""
