"""Gemma 3 text teachers (``Gemma3ForCausalLM``) against HF transformers, on the real Megatron group
(Ray, CPU/gloo, megatron-core's ``GPTModel`` on the local spec with the Gemma 3 pieces of
``podium.teacher.model.gemma3``), on the tiny checkpoint in which each Gemma feature moves the
logits: 3 of 4 layers sliding (window 4, shorter than the sequences) with their own RoPE base, the
global layer's RoPE linearly scaled, q/k norms, ``query_pre_attn_scalar`` 20 (not head_dim 24),
gated tanh-GELU, post-attention and post-MLP norms, ``(1 + w)`` norms, the embedding scaled by
``√hidden`` and tied to the output layer:

- TP1: one rank; logprobs and top-k;
- TP2: attention heads, KV groups, the MLP and the vocabulary split (the post-norms after the
  reduction);
- TP1 on the multimodal checkpoint (``Gemma3ForConditionalGeneration``): its language model read
  under ``language_model.``, its ``text_config`` over transformers' defaults; the oracle is the
  multimodal model on text.

Logprobs within 1e-4 of the oracle (fp32). Negative controls (``gemma3_controls.py``, TP2): the
window on every layer, the sliding layers on the global RoPE base, the embedding unscaled, the
default softmax scale, the global RoPE unscaled are each far from HF (measured logit differences
~15, ~17, ~55, ~1.1 and more than 1e-2; podium's build 2e-5).
"""

from __future__ import annotations

import controls
import pytest
from harness.teacher_groups import assert_matches_oracle, ragged_batch, start_group

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

VOCAB = 256


def test_describes_sliding_layers_local_rope_scales_and_post_norms(tiny_gemma3_checkpoint):
    from podium.teacher.model.checkpoint_loader import describe_model

    desc = describe_model(tiny_gemma3_checkpoint)
    assert (desc.family, desc.activation, desc.head_dim, desc.tied_embeddings) == ("gemma3", "geglu_tanh", 24, True)
    assert (desc.sliding_window, desc.window_layers) == (4, (True, False, True, True))
    assert (desc.rotary_base, desc.local_rotary_base, desc.rope_scaling) == (
        1000.0, 10.0, {"rope_type": "linear", "factor": 4.0})
    assert desc.softmax_scale == pytest.approx(20 ** -0.5) and desc.embedding_scale == pytest.approx(8.0)
    assert desc.post_norms and desc.qk_norm


@pytest.fixture
def gemma3_tp1(ray_cluster, tiny_gemma3_checkpoint):
    yield from start_group(tiny_gemma3_checkpoint)


@pytest.fixture
def gemma3_tp2(ray_cluster, tiny_gemma3_checkpoint):
    yield from start_group(tiny_gemma3_checkpoint, per_node=2, tp=2)


def test_gemma3_tp1(gemma3_tp1, tiny_gemma3_checkpoint):
    assert_matches_oracle(gemma3_tp1, tiny_gemma3_checkpoint, ragged_batch(VOCAB, seed=71), top_k=4)


def test_gemma3_tp2(gemma3_tp2, tiny_gemma3_checkpoint):
    assert_matches_oracle(gemma3_tp2, tiny_gemma3_checkpoint, ragged_batch(VOCAB, seed=72), top_k=3)


def test_gemma3_multimodal_checkpoint_serves_its_language_model(ray_cluster, tiny_gemma3_mm_checkpoint):
    from podium.teacher.model.checkpoint_loader import describe_model

    desc = describe_model(tiny_gemma3_mm_checkpoint)
    assert (desc.architecture, desc.family, desc.num_layers, desc.window_layers) == (
        "Gemma3ForConditionalGeneration", "gemma3", 4, (True, False, True, True))
    for group in start_group(tiny_gemma3_mm_checkpoint):
        assert_matches_oracle(group, tiny_gemma3_mm_checkpoint, ragged_batch(VOCAB, seed=73), top_k=2)


def test_the_oracle_catches_each_gemma3_piece_left_out(tiny_gemma3_checkpoint, tmp_path):
    """Negative controls (``gemma3_controls.py``): each piece podium adds is needed."""
    diffs = controls.run("gemma3_controls.py", tmp_path, [tiny_gemma3_checkpoint])[str(tiny_gemma3_checkpoint)]
    assert diffs["right"] < 1e-4, diffs
    assert min(v for k, v in diffs.items() if k != "right") > 1e-2, diffs
