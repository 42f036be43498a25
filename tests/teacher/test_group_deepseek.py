"""DeepSeek-V3 / Kimi K2 teachers (``DeepseekV3ForCausalLM``) against HF transformers, on the real
Megatron group (Ray, CPU/gloo, megatron-core's ``GPTModel`` with ``MLASelfAttention`` and MoE layers,
the local spec), on the tiny checkpoint in which every feature DeepSeek-V3 adds moves the logits:
multi-latent attention (a query latent, a key/value latent with a shared rotary key, value heads
narrower than the query/key heads) with DeepSeek's YaRN (``mscale`` and ``mscale_all_dim``), a dense
first layer, MoE layers with 8 experts in 4 groups (2 kept per token, then its top 4) behind a
sigmoid router with a non-zero expert bias, weights renormalised and scaled by 2.5, a shared expert;
and an MTP layer (``model.layers.3.*``) that must not be read:

- TP1: one rank holds everything; logprobs and top-k;
- TP2·EP2 on 2 ranks, from the same model in DeepSeek's block-scaled fp8 on-disk format (32×32
  blocks, partial at the edges; TP slices that cut through blocks): the heads and the latent
  down-projections split over TP, the experts in two groups of four, each rank's own rows; compared
  with transformers on the dequantized checkpoint.

Logprobs within 1e-4 of the oracle (fp32). Negative controls (``deepseek_controls.py``, TP1·EP2): the
same model with the plain RoPE instead of YaRN, without ``mscale_all_dim``, without its expert
groups or without the routed scaling factor is far from HF, and so is the directly projected,
halves-layout checkpoint (``q_lora_rank`` null, ``rope_interleave`` false) loaded without
interleaving its rotary rows (measured logit differences ~9.1, ~7.7, ~10.3, ~9.2 and ~14.6); podium's
build matches HF on both (1.2e-5, 9.5e-6).
"""

from __future__ import annotations

import controls
import pytest
import torch
from harness.teacher_groups import assert_matches_oracle, ragged_batch, start_group

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

VOCAB = 256


def test_describes_mla_yarn_dense_first_layer_and_grouped_sigmoid_routing(tiny_deepseek_v3_checkpoint):
    from podium.teacher.model.checkpoint_loader import describe_model

    desc = describe_model(tiny_deepseek_v3_checkpoint)
    assert (desc.family, desc.num_layers, desc.is_mla, desc.head_dim) == ("deepseek_v3", 3, True, 24)
    assert (desc.q_lora_rank, desc.kv_lora_rank, desc.qk_nope_head_dim, desc.qk_rope_head_dim, desc.v_head_dim) == (
        48, 32, 16, 8, 12)
    assert desc.rope_scaling == {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16,
                                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5}
    assert desc.moe_layers == (False, True, True)
    assert (desc.num_experts, desc.moe_topk, desc.moe_router_num_groups, desc.moe_router_group_topk) == (8, 4, 4, 2)
    assert (desc.moe_score_function, desc.moe_expert_bias, desc.moe_routed_scaling_factor) == ("sigmoid", True, 2.5)
    assert (desc.moe_ffn_hidden_size, desc.moe_shared_ffn_hidden_size) == (32, 32)


def test_fp8_weights_are_read_dequantized_slice_by_slice(tiny_deepseek_v3_fp8_checkpoints):
    """A rank's slice of an fp8 weight (rows and columns cutting through 32×32 blocks) is
    ``q · scale_inv`` of the blocks covering it, read without the rest of the tensor."""
    from safetensors.torch import load_file

    from podium.apps.tiny_fp8 import dequantize_fp8_blocks
    from podium.teacher.model.hf import SafetensorsCheckpoint

    fp8, _ = tiny_deepseek_v3_fp8_checkpoints
    raw = load_file(str(fp8 / "model.safetensors"))
    name = "model.layers.1.self_attn.q_b_proj.weight"  # [96, 48]: 3 × 2 blocks, the last column block partial
    assert raw[name].dtype == torch.float8_e4m3fn and raw[name + "_scale_inv"].shape == (3, 2)
    assert raw["model.layers.1.mlp.gate.weight"].dtype == torch.float32  # the router is not quantized
    whole = dequantize_fp8_blocks(raw[name], raw[name + "_scale_inv"], (32, 32))
    ckpt = SafetensorsCheckpoint(fp8, fp8_block=(32, 32))
    assert torch.equal(ckpt.read(name), whole)
    before = ckpt.bytes_read
    assert torch.equal(ckpt.read(name, rows=slice(24, 72), cols=slice(20, 48)), whole[24:72, 20:48])
    assert ckpt.bytes_read - before == 48 * 28 + 4 * 3 * 2  # its fp8 bytes and the 3 × 2 scales covering it
    expert = "model.layers.2.mlp.experts.5.down_proj.weight"
    assert torch.equal(ckpt.read(expert, cols=slice(16, 32)),
                       dequantize_fp8_blocks(raw[expert], raw[expert + "_scale_inv"], (32, 32))[:, 16:32])


@pytest.fixture
def deepseek_tp1(ray_cluster, tiny_deepseek_v3_checkpoint):
    yield from start_group(tiny_deepseek_v3_checkpoint)


@pytest.fixture
def deepseek_fp8_tp2_ep2(ray_cluster, tiny_deepseek_v3_fp8_checkpoints):
    yield from start_group(tiny_deepseek_v3_fp8_checkpoints[0], per_node=2, tp=2, expert_model_parallel_size=2)


def test_deepseek_tp1(deepseek_tp1, tiny_deepseek_v3_checkpoint):
    assert_matches_oracle(deepseek_tp1, tiny_deepseek_v3_checkpoint, ragged_batch(VOCAB, seed=71), top_k=4)


def test_deepseek_fp8_tp2_ep2_heads_latents_and_experts_split(deepseek_fp8_tp2_ep2, tiny_deepseek_v3_fp8_checkpoints):
    _, dequantized = tiny_deepseek_v3_fp8_checkpoints
    info = deepseek_fp8_tp2_ep2.worker_info
    assert sorted(i.tp_rank for i in info) == sorted(i.ep_rank for i in info) == [0, 1]
    for lengths in [(3, 9, 1), (16, 2, 7, 7, 11)]:  # odd counts: ranks get different tokens
        assert_matches_oracle(deepseek_fp8_tp2_ep2, dequantized, ragged_batch(VOCAB, lengths, seed=70 + len(lengths)),
                              top_k=3)


def test_the_oracle_catches_yarn_mscale_groups_scale_and_rope_layout_left_out(
        tiny_deepseek_v3_checkpoint, tiny_deepseek_v3_qproj_checkpoint, tmp_path):
    """Negative controls (``deepseek_controls.py``): each feature of the tiny checkpoints matters."""
    both = controls.run("deepseek_controls.py", tmp_path, [tiny_deepseek_v3_checkpoint,
                                                          tiny_deepseek_v3_qproj_checkpoint])
    yarn, halves = both[str(tiny_deepseek_v3_checkpoint)], both[str(tiny_deepseek_v3_qproj_checkpoint)]
    assert yarn["right"] < 1e-4 and halves["right"] < 1e-4, both
    wrong = [yarn["no_yarn"], yarn["no_mscale_all_dim"], yarn["no_groups"], yarn["no_scale"],
             halves["halves_not_interleaved"]]
    assert min(wrong) > 1e-2, both
