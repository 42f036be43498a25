"""GLM-4.5 / 4.6 teachers (``Glm4MoeForCausalLM``) against HF transformers, on the real Megatron group
(Ray, CPU/gloo, megatron-core's ``GPTModel`` with MoE layers, the local spec), on the tiny checkpoint
in which every feature GLM adds over the Llama family moves the logits: RoPE on half of an explicit
``head_dim``, q/k RMSNorm, q/k/v bias, a dense first layer (``first_k_dense_replace``), then MoE
layers with 8 experts in 2 groups (each token keeps 1 group, then its top 2 experts there) behind a
sigmoid router with a non-zero expert bias, weights renormalised and scaled by 2.5, and a shared
expert:

- TP1: one rank holds everything; logprobs and top-k;
- TP2·EP2 on 2 ranks: attention (fused q/k/v with bias, per-head norms, partial RoPE) and the shared
  expert split over TP, the routed experts in two groups of four (one per EP rank), each rank's own
  rows (uneven counts).

Logprobs within 1e-4 of the oracle (fp32). Negative controls (``glm_controls.py``, TP1·EP2): the same
model without its expert groups, with RoPE on the whole head, or without the routed scaling factor
is far from HF (measured logit differences ~11, ~13, ~11; podium's build 1e-5).
"""

from __future__ import annotations

import controls
import pytest
from harness.teacher_groups import assert_matches_oracle, ragged_batch, start_group

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

VOCAB = 256


def test_describes_partial_rope_dense_first_layer_and_grouped_sigmoid_routing(tiny_glm4_moe_checkpoint):
    from podium.teacher.model.checkpoint_loader import describe_model

    desc = describe_model(tiny_glm4_moe_checkpoint)
    assert (desc.family, desc.num_layers, desc.head_dim, desc.rotary_percent) == ("glm4_moe", 3, 24, 0.5)
    assert (desc.qk_norm, desc.qkv_bias, desc.attn_out_bias) == (True, True, False)
    assert desc.moe_layers == (False, True, True)
    assert (desc.num_experts, desc.moe_topk, desc.moe_router_num_groups, desc.moe_router_group_topk) == (8, 2, 2, 1)
    assert (desc.moe_score_function, desc.moe_expert_bias, desc.moe_routed_scaling_factor) == ("sigmoid", True, 2.5)
    assert (desc.moe_ffn_hidden_size, desc.moe_shared_ffn_hidden_size, desc.moe_shared_expert_gate) == (32, 32, False)


@pytest.fixture
def glm_tp1(ray_cluster, tiny_glm4_moe_checkpoint):
    yield from start_group(tiny_glm4_moe_checkpoint)


@pytest.fixture
def glm_tp2_ep2(ray_cluster, tiny_glm4_moe_checkpoint):
    yield from start_group(tiny_glm4_moe_checkpoint, per_node=2, tp=2, expert_model_parallel_size=2)


def test_glm_tp1(glm_tp1, tiny_glm4_moe_checkpoint):
    assert_matches_oracle(glm_tp1, tiny_glm4_moe_checkpoint, ragged_batch(VOCAB, seed=61), top_k=4)


def test_glm_tp2_ep2_attention_and_shared_expert_split_experts_in_two_groups(glm_tp2_ep2, tiny_glm4_moe_checkpoint):
    info = glm_tp2_ep2.worker_info
    assert sorted(i.tp_rank for i in info) == sorted(i.ep_rank for i in info) == [0, 1]
    for lengths in [(3, 9, 1), (16, 2, 7, 7, 11)]:  # odd counts: ranks get different tokens
        assert_matches_oracle(glm_tp2_ep2, tiny_glm4_moe_checkpoint,
                              ragged_batch(VOCAB, lengths, seed=60 + len(lengths)), top_k=3)


def test_the_oracle_catches_glm_routing_groups_rope_share_and_scale_left_out(tiny_glm4_moe_checkpoint, tmp_path):
    """Negative controls (``glm_controls.py``): each feature of the tiny checkpoint matters."""
    diffs = controls.run("glm_controls.py", tmp_path, [tiny_glm4_moe_checkpoint])[str(tiny_glm4_moe_checkpoint)]
    assert diffs["right"] < 1e-4, diffs
    assert min(diffs["no_groups"], diffs["full_rotary"], diffs["no_scale"]) > 1e-2, diffs
