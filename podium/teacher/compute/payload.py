"""The full-vocabulary payloads of a last pipeline stage: hidden states and full logits.

NeMo RL's full-vocabulary distillation ships the teacher's distribution whole, one of two ways
(``on_policy_distillation.full.teacher_payload``): the **hidden states** (``[B, S, H]``, the input of
``output_layer``, i.e. after the final norm; the student projects them through the teacher's LM head
it loads itself) or the **logits** (``[B, S, V]``, ``z / T``, the whole vocabulary). Both are in
the alignment of the model's outputs: position ``i`` holds what the model computed at ``i`` (the
distribution of token ``i+1``), for every ``i < length``; positions past a row's length are 0.

:func:`payload_outputs` is the head's step for one micro-batch (the head calls it beside the
logprobs, from the same hidden states and output weight): hidden states as they are, transposed to
``[b, s, H]``; logits a chunk of rows at a time, each TP rank's vocabulary slice all-gathered and
the padding rows of the vocabulary cut, so the full ``[s·b, V]`` float32 logits never exist (only
the payload, in its dtype). Either is cast to the asked dtype on the device, before it goes
anywhere: the bytes that reach the host, cross Ray and leave on the wire are the payload's own.
The CP pieces are put together by the worker with the head's other outputs; :func:`mask_payload`
zeroes what lies past each row's length.

:func:`hidden_states_refusal` says why a teacher cannot offer ``hidden_states`` (the student
rebuilds logits as ``output_layer(h)``; a teacher whose logits are not that, or whose LM head the
student cannot load, would be silently mis-reconstructed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from podium.config.teacher_keys import Fp32LmHead
from podium.protocol.names import HIDDEN_STATES, LOGITS
from podium.teacher.compute.microbatch import GEMM_ROWS, round_up
from podium.teacher.model.output_gemm import OutputGemm

if TYPE_CHECKING:  # pragma: no cover
    import torch

# The torch dtype of each payload datatype (podium.protocol.names.PAYLOAD_DATATYPES).
TORCH_DTYPES = {"BF16": "bfloat16", "FP16": "float16", "FP32": "float32"}


def torch_dtype(datatype: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, TORCH_DTYPES[datatype])
    return dtype


def payload_outputs(payload: str, hidden: torch.Tensor, weight: torch.Tensor, *, datatype: str, temperature: float,
                    vocab_size: int, tp_group: Any, tp_size: int, chunk_elements: int,
                    fp32_lm_head: Fp32LmHead = False) -> dict[str, torch.Tensor]:
    """One micro-batch's payload ``[b, s, D]`` in ``datatype``: hidden ``[s, b, h]`` (the output
    layer's input), this rank's slice of the output weight ``[V/TP, h]``; logits from the output
    GEMM the logprob head uses (``fp32_lm_head``: :mod:`podium.teacher.model.output_gemm`)."""
    dtype = torch_dtype(datatype)
    if payload == HIDDEN_STATES:
        return {HIDDEN_STATES: hidden.transpose(0, 1).to(dtype).contiguous()}
    if payload == LOGITS:
        gemm = OutputGemm(weight, fp32_lm_head)
        return {LOGITS: _full_logits(hidden, gemm, dtype, temperature, vocab_size, tp_group, tp_size, chunk_elements)}
    raise ValueError(f"unknown payload {payload!r}")


def _full_logits(hidden: torch.Tensor, gemm: OutputGemm, dtype: torch.dtype, temperature: float, vocab_size: int,
                 tp_group: Any, tp_size: int, chunk_elements: int) -> torch.Tensor:
    """``z / T`` of every position over the whole (unpadded) vocabulary, ``[b, s, V]`` in ``dtype``:
    a chunk of rows at a time (row counts multiples of :data:`GEMM_ROWS`, as the logprob head's),
    each TP rank's slice all-gathered (the slices are equal: the vocabulary is padded to TP)."""
    import torch
    import torch.distributed as dist

    seq, batch, size = hidden.shape
    rows = hidden.transpose(0, 1).reshape(batch * seq, size)
    n, local = rows.shape[0], gemm.weight.shape[0]
    out = torch.empty((n, vocab_size), dtype=dtype, device=rows.device)
    step = max(GEMM_ROWS, chunk_elements // max(1, local * tp_size) // GEMM_ROWS * GEMM_ROWS)
    scale = 1.0 / float(temperature)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        part = rows[r0:r1]
        if part.shape[0] % GEMM_ROWS:
            part = torch.cat([part, part.new_zeros((round_up(r1 - r0, GEMM_ROWS) - (r1 - r0), size))])
        logits = gemm(part)[: r1 - r0]
        if scale != 1.0:
            logits.mul_(scale)
        if tp_size > 1:
            pieces = [torch.empty_like(logits) for _ in range(tp_size)]
            dist.all_gather(pieces, logits.contiguous(), group=tp_group)
            logits = torch.cat(pieces, dim=-1)
        out[r0:r1] = logits[:, :vocab_size]
        del logits
    return out.view(batch, seq, vocab_size)


def mask_payload(payload: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``payload [B, S, D]`` with every position at or past its row's length set to 0, in place."""
    import torch

    past = torch.arange(payload.shape[1])[None, :] >= lengths[:, None].to("cpu")
    payload[past.to(payload.device)] = 0
    return payload


def hidden_states_refusal(*, tied_embeddings: bool, checkpoint_kind: str, logit_softcapping: float | None = None,
                          output_multiplier: float | None = None) -> str | None:
    """Why this teacher cannot answer ``hidden_states`` (None: it can).

    NeMo RL's student rebuilds the teacher's logits as ``output_layer(h)`` with an LM head it loads
    from the teacher's checkpoint (``cfg["model_name"]``). Refused: logits softcapped or scaled after
    the output layer (Gemma-2's ``final_logit_softcapping``, MuP's output multiplier: megatron-core
    0.16.1 and podium's model descriptions express neither, so only a caller that knows can say so),
    and a head tied to the input embedding in a Megatron ``torch_dist`` checkpoint: that checkpoint
    holds no ``output_layer.weight`` (the embedding stands in for it), which is what a loader of the
    teacher's LM head reads. A tied HF checkpoint is loadable (``tie_word_embeddings``: the bridge
    that loads it ties the head to ``embed_tokens`` again)."""
    if logit_softcapping:
        return f"its logits are softcapped after the output layer (final_logit_softcapping={logit_softcapping:g})"
    if output_multiplier not in (None, 1.0):
        return f"its logits are scaled after the output layer (output multiplier {output_multiplier:g}, MuP)"
    if tied_embeddings and checkpoint_kind == "torch_dist":
        return ("its output layer is tied to the input embedding in a torch_dist checkpoint, which holds no "
                "output_layer.weight for the student to load as the teacher's LM head")
    return None
