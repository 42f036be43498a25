"""The payload step of the head in one process (no group): what it computes, in which dtype, and
which teachers refuse ``hidden_states`` (:mod:`podium.teacher.compute.payload`)."""

from __future__ import annotations

import pytest
import torch

from podium.teacher.compute.payload import hidden_states_refusal, mask_payload, payload_outputs


@pytest.mark.parametrize("datatype", ["BF16", "FP16", "FP32"])
def test_payloads_are_the_head_input_and_its_logits_in_the_dtype_asked(datatype: str) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 2, 8, generator=gen)  # [s, b, h], as megatron hands it
    weight = torch.randn(12, 8, generator=gen)  # vocabulary of 10 padded to 12
    kw = {"datatype": datatype, "temperature": 0.5, "vocab_size": 10, "tp_group": None, "tp_size": 1,
          "chunk_elements": 48}  # a few rows per chunk
    dtype = {"BF16": torch.bfloat16, "FP16": torch.float16, "FP32": torch.float32}[datatype]
    states = payload_outputs("hidden_states", hidden, weight, **kw)["hidden_states"]
    assert states.dtype == dtype and torch.equal(states, hidden.transpose(0, 1).to(dtype))
    logits = payload_outputs("logits", hidden, weight, **kw)["logits"]
    expected = (hidden.transpose(0, 1) @ weight[:10].t() / 0.5).to(dtype)
    assert logits.shape == (2, 6, 10) and logits.dtype == dtype
    torch.testing.assert_close(logits.float(), expected.float(), atol=1e-5, rtol=1e-5)
    masked = mask_payload(logits.clone(), torch.tensor([6, 2]))
    assert not masked[1, 2:].any() and torch.equal(masked[0], logits[0]) and torch.equal(masked[1, :2], logits[1, :2])


def test_teachers_whose_logits_are_not_the_head_of_h_refuse_hidden_states() -> None:
    assert hidden_states_refusal(tied_embeddings=False, checkpoint_kind="hf") is None
    assert hidden_states_refusal(tied_embeddings=True, checkpoint_kind="hf") is None  # the loader ties it again
    assert "no output_layer.weight" in str(hidden_states_refusal(tied_embeddings=True, checkpoint_kind="torch_dist"))
    assert "softcapped" in str(hidden_states_refusal(tied_embeddings=False, checkpoint_kind="hf",
                                                     logit_softcapping=30.0))
    assert "MuP" in str(hidden_states_refusal(tied_embeddings=False, checkpoint_kind="hf", output_multiplier=2.0))
