"""gpt-oss teachers (``GptOssForCausalLM``) against HF transformers, on the real Megatron group (Ray,
CPU/gloo, megatron-core's ``GPTModel`` with MoE layers, the local spec with podium's SDPA core
attention), on the tiny checkpoint in which every feature gpt-oss adds moves the logits: a learnt
sink per head, layer 0 sliding (window 4) and layer 1 global, YaRN, q/k/v and o_proj biases, 4 fused
experts (gate/up interleaved) with biases behind a biased router, the clamped SwiGLU with its ``+1``:

- TP1: one rank holds everything; logprobs and top-k;
- TP2: attention heads, KV groups, their biases and the sinks split (each rank its heads' sinks,
  megatron's ``softmax_offset`` of ``heads / TP``), the vocabulary split;
- TP1·EP2 (the controls' ``right`` build): two experts per rank, each reading only its own.

Logprobs within 1e-4 of the oracle (fp32). Negative controls (``gpt_oss_controls.py``, TP1·EP2): no
sinks, the window on every layer, plain RoPE for YaRN, the SwiGLU unclamped or without its ``+1``,
the router's bias zeroed are each far from HF (measured logit differences ~6.8, ~8.1, ~5.2, ~5.6,
~6.7, ~3.3; podium's build 8e-6).

MXFP4 (gpt-oss's published format): the tiny checkpoint's experts written as blocks and scales with
``quantization_config``; podium's dequantization equals transformers' on the same bytes, the map
reads an MXFP4 expert as the dequantized checkpoint's, and the MXFP4 checkpoint served at TP1·EP2
matches transformers on the dequantized copy.
"""

from __future__ import annotations

import controls
import pytest
from harness.teacher_groups import assert_matches_oracle, ragged_batch, start_group

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

VOCAB = 256


def test_describes_sinks_window_yarn_and_clamped_glu(tiny_gpt_oss_checkpoint):
    from podium.teacher.model.checkpoint_loader import describe_model

    desc = describe_model(tiny_gpt_oss_checkpoint)
    assert (desc.family, desc.activation, desc.head_dim, desc.position_embedding_type) == (
        "gpt_oss", "quick_geglu", 24, "yarn")
    assert (desc.attention_sinks, desc.glu_linear_offset, desc.activation_clamp) == (True, 1.0, 1.5)
    assert (desc.sliding_window, desc.window_layers) == (4, (True, False))
    assert desc.rope_scaling == {"rope_type": "yarn", "truncate": False, "factor": 4.0,
                                 "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0}
    assert (desc.qkv_bias, desc.attn_out_bias, desc.mlp_bias, desc.expert_quantization) == (True, True, True, None)
    assert (desc.num_experts, desc.moe_topk, desc.moe_ffn_hidden_size, desc.moe_layers) == (4, 2, 32, (True, True))


@pytest.fixture
def gpt_oss_tp1(ray_cluster, tiny_gpt_oss_checkpoint):
    yield from start_group(tiny_gpt_oss_checkpoint)


@pytest.fixture
def gpt_oss_tp2(ray_cluster, tiny_gpt_oss_checkpoint):
    yield from start_group(tiny_gpt_oss_checkpoint, per_node=2, tp=2)


def test_gpt_oss_tp1(gpt_oss_tp1, tiny_gpt_oss_checkpoint):
    assert_matches_oracle(gpt_oss_tp1, tiny_gpt_oss_checkpoint, ragged_batch(VOCAB, seed=81), top_k=4)


def test_gpt_oss_tp2_attention_and_sinks_split(gpt_oss_tp2, tiny_gpt_oss_checkpoint):
    assert sorted(i.tp_rank for i in gpt_oss_tp2.worker_info) == [0, 1]
    assert_matches_oracle(gpt_oss_tp2, tiny_gpt_oss_checkpoint, ragged_batch(VOCAB, seed=82), top_k=3)


def test_mxfp4_experts_read_as_transformers_dequantizes_them(tiny_gpt_oss_mxfp4_checkpoint):
    """Each expert's fc1/fc2 read from the MXFP4 checkpoint (its rows only, dequantized alone) equal
    what the map reads from the copy transformers dequantized; the dequantizer equals transformers'."""
    import torch
    from safetensors import safe_open
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from podium.teacher.model.checkpoint_loader import describe_model
    from podium.teacher.model.hf import RankLayout
    from podium.teacher.model.hf.gpt_oss import gpt_oss_sources
    from podium.teacher.model.hf.mxfp4 import dequantize_mxfp4
    from podium.teacher.model.hf.safetensors_io import SafetensorsCheckpoint
    from podium.teacher.model.hf.slices import SliceReader

    mxfp4, dequantized = tiny_gpt_oss_mxfp4_checkpoint
    with safe_open(str(mxfp4 / "model.safetensors"), "pt") as f:
        blocks, scales = (f.get_tensor(f"model.layers.1.mlp.experts.gate_up_proj_{k}") for k in ("blocks", "scales"))
    assert blocks.dtype == scales.dtype == torch.uint8 and tuple(blocks.shape) == (4, 64, 2, 16)
    assert torch.equal(dequantize_mxfp4(blocks, scales).transpose(1, 2),
                       convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    desc = describe_model(mxfp4)
    assert desc.expert_quantization == "mxfp4"
    for etp_rank, ep_rank in ((0, 0), (1, 1)):  # expert-TP 2: the halves of each expert
        layout = RankLayout(0, 1, 256, ep_rank=ep_rank, ep_size=2, etp_rank=etp_rank, etp_size=2)
        quantized = SliceReader(SafetensorsCheckpoint(mxfp4), desc, layout)
        plain = SliceReader(SafetensorsCheckpoint(dequantized), describe_model(dequantized), layout)
        for layer in (0, 1):
            for local in ("linear_fc1.weight", "linear_fc2.weight", "linear_fc1.bias", "linear_fc2.bias"):
                name = f"mlp.experts.local_experts.1.{local}"
                got, want = gpt_oss_sources(quantized, layer, name), gpt_oss_sources(plain, layer, name)
                assert got is not None and want is not None and torch.equal(got, want), (layer, name)
        assert quantized.ckpt.bytes_read < plain.ckpt.bytes_read / 3  # 4.25 bits a value, fp32 in the copy


def test_the_oracle_catches_each_gpt_oss_feature_left_out_and_serves_mxfp4_at_ep2(
        tiny_gpt_oss_checkpoint, tiny_gpt_oss_mxfp4_checkpoint, tmp_path):
    """Negative controls (``gpt_oss_controls.py``): each feature matters; podium's build at TP1·EP2
    matches HF, on the plain checkpoint and on the MXFP4 one (against its dequantized copy)."""
    mxfp4, dequantized = tiny_gpt_oss_mxfp4_checkpoint
    pair = f"{mxfp4}={dequantized}"
    result = controls.run("gpt_oss_controls.py", tmp_path, [tiny_gpt_oss_checkpoint, pair])
    diffs = result[str(tiny_gpt_oss_checkpoint)]
    assert diffs["right"] < 1e-4, diffs
    assert min(v for k, v in diffs.items() if k != "right") > 1e-2, diffs
    assert result[pair]["right"] < 1e-4, result[pair]
