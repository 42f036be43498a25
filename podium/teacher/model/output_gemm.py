"""A teacher's output-layer GEMM, and the precision of the logits it gives (``fp32_lm_head``).

Without ``fp32_lm_head`` the output layer multiplies the final hidden states by its weight in the
teacher's ``precision`` and the logits are rounded to it (bf16: about 3 significant digits) before
the head's fp32 log-softmax; the student's logprobs, computed with an fp32 head, then differ from
the teacher's by that rounding alone.

With it (true or ``"tf32"``), as NeMo RL's Megatron path does it (main 0054c4e,
``nemo_rl/models/megatron/setup.py`` ``_apply_precision_config``: ``logit_dtype = float32``), the
GEMM takes the model's own bf16/fp16 operands, accumulates in fp32 and *writes fp32 logits*; no
fp32 copy of the weight is kept. ``"tf32"`` is NeMo RL's alias of true
(``nemo_rl/utils/fp32_lm_head.py``): a bf16 or fp16 operand is exact in TF32, so TF32 tensor cores
cannot change such a product; podium lets the fp32 fallback below use them for ``"tf32"`` only.

How: on CUDA ``torch.mm(..., out_dtype=torch.float32)`` (the 16-bit GEMM with fp32 output, as
Transformer Engine's); elsewhere, or on a torch without it, the operands upcast to fp32 and
multiplied in fp32, which is the same product (a bf16/fp16 value is an fp32 value, and so is the
product of two), the weight upcast once per call of the head, not per chunk of rows. A teacher in
fp32 has fp32 logits either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from podium.config.teacher_keys import FP32_LM_HEAD_TF32, Fp32LmHead

if TYPE_CHECKING:  # pragma: no cover
    import torch


class OutputGemm:
    """``logits = rows @ weight.T`` for one call of the head, in float32, by ``fp32_lm_head``.

    ``weight``: this rank's slice of the output weight ``[V, h]`` (padding rows already cut);
    calling it with hidden-state rows ``[n, h]`` gives float32 logits ``[n, V]``."""

    def __init__(self, weight: torch.Tensor, fp32_lm_head: Fp32LmHead = False) -> None:
        import torch

        half = weight.dtype in (torch.bfloat16, torch.float16)
        self.fp32 = fp32_lm_head is not False
        # TF32 is exact only for 16-bit operands: an fp32 teacher's product never uses it here
        self.tf32 = fp32_lm_head == FP32_LM_HEAD_TF32 and half
        self.weight = weight
        self.out_dtype = self.fp32 and half and weight.is_cuda
        if self.fp32 and not self.out_dtype and weight.dtype != torch.float32:
            self.weight = weight.float()  # once per call: the rows are upcast per chunk

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        import torch

        if not self.fp32:
            return torch.matmul(rows, self.weight.t()).float()  # rounded to the params dtype first
        if self.out_dtype:
            try:
                return torch.mm(rows, self.weight.t(), out_dtype=torch.float32)
            except TypeError:  # a torch without the fp32-output GEMM: the upcast product below
                self.out_dtype = False
                self.weight = self.weight.float()
        return _fp32_matmul(rows.float(), self.weight, allow_tf32=self.tf32 and rows.is_cuda)


def _fp32_matmul(rows: torch.Tensor, weight: torch.Tensor, allow_tf32: bool) -> Any:
    """``rows @ weight.T`` in fp32; TF32 tensor cores only when asked (the flag is restored)."""
    import torch

    if not allow_tf32:
        return torch.matmul(rows, weight.t())
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return torch.matmul(rows, weight.t())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
