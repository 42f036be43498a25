"""The full-vocabulary payloads checked against transformers fp32 (the oracle), for any caller.

- :func:`hf_hidden_states`: transformers' ``output_hidden_states[-1]`` (after the final norm: the LM
  head's input), zero at and past each row's length: what ``hidden_states`` must be;
- :func:`hf_full_logits`: ``z / T`` in the model's own alignment, zero past the length: ``logits``;
- :func:`assert_payload_matches`: a group's or a client's answer against those, to bf16 precision
  for a 16-bit payload and tightly for fp32; for hidden states, ``log_softmax(lm_head(h))`` at the
  next token reproduces the logprobs (NeMo RL's student rebuilds the teacher's distribution so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from podium.apps.tiny_models import _load_hf_model

TIGHT = 1e-4  # fp32 against fp32
DTYPES = {"BF16": torch.bfloat16, "FP16": torch.float16, "FP32": torch.float32}
# a 16-bit value is its fp32 value rounded: within half a step of 2^-8 (bf16) / 2^-11 (fp16), relative
STEPS = {"BF16": 2.0 ** -8, "FP16": 2.0 ** -11, "FP32": 0.0}


def _valid(lengths: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < lengths[:, None]


def hf_hidden_states(checkpoint: Path | str, ids: Any, lengths: Any) -> torch.Tensor:
    ids, lengths = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(lengths, dtype=torch.long)
    model = _load_hf_model(str(checkpoint))
    mask = _valid(lengths, ids.shape[1]).long()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1].float()
    return hidden * _valid(lengths, ids.shape[1])[..., None]


def hf_full_logits(checkpoint: Path | str, ids: Any, lengths: Any, temperature: float = 1.0) -> torch.Tensor:
    ids, lengths = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(lengths, dtype=torch.long)
    model = _load_hf_model(str(checkpoint))
    mask = _valid(lengths, ids.shape[1]).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float() / float(temperature)
    return logits * _valid(lengths, ids.shape[1])[..., None]


def lm_head_logprobs(checkpoint: Path | str, hidden: torch.Tensor, ids: Any, temperature: float = 1.0) -> torch.Tensor:
    """NeMo RL's convention of logprobs rebuilt from hidden states: ``log_softmax(lm_head(h) / T)``
    at position ``i - 1`` read at token ``i`` (position 0: 0; the caller masks the padding)."""
    head = _load_hf_model(str(checkpoint)).get_output_embeddings().weight.float()
    ids = torch.as_tensor(ids, dtype=torch.long)
    with torch.no_grad():
        logsm = torch.log_softmax(hidden.float() @ head.t() / float(temperature), dim=-1)
    out = torch.zeros(ids.shape, dtype=torch.float32)
    out[:, 1:] = logsm[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return out


def assert_payload_matches(got: torch.Tensor, expected: torch.Tensor, lengths: Any, datatype: str) -> None:
    """``got`` is ``expected`` in ``datatype`` (its dtype, shape), to that dtype's precision (one
    rounding step of the oracle's magnitude, plus fp32 noise); exactly 0 past each length."""
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    assert got.dtype == DTYPES[datatype], (got.dtype, datatype)
    assert tuple(got.shape) == tuple(expected.shape), (got.shape, expected.shape)
    valid = _valid(lengths, got.shape[1])
    diff = (got.float() - expected).abs()[valid]
    bound = TIGHT + STEPS[datatype] * expected.abs()[valid]
    worst = float((diff - bound).max())
    assert worst <= 0, f"{datatype} payload off the oracle by {worst:.3g} beyond its precision"
    assert not got[~valid].float().any(), "a position past its row's length is not 0"
