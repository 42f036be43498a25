"""TransformerConfig from (architecture, layout, precision, overrides): layout in the config,
overrides applied, unknown keys reported."""

from __future__ import annotations

import pytest
import torch

from podium.teacher.model.checkpoint_loader import describe_model
from podium.teacher.model.megatron_config import build_transformer_config, padded_vocab_size, split_overrides

pytestmark = [pytest.mark.megatron]

LAYOUT = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}


def test_layout_and_architecture_go_into_the_config(tiny_checkpoints):
    desc = describe_model(tiny_checkpoints["qwen3"])
    cfg = build_transformer_config(desc, LAYOUT, "bf16")
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (2, 2)
    assert (cfg.num_layers, cfg.kv_channels, cfg.num_query_groups, cfg.qk_layernorm) == (2, 24, 2, True)
    assert cfg.params_dtype == torch.bfloat16 and cfg.bf16 and cfg.normalization == "RMSNorm"
    assert cfg.gated_linear_unit and not cfg.add_bias_linear and not cfg.perform_initialization
    gpt2 = build_transformer_config(describe_model(tiny_checkpoints["gpt2"]), {}, "fp32")
    assert gpt2.add_bias_linear and gpt2.add_qkv_bias and not gpt2.gated_linear_unit
    assert gpt2.normalization == "LayerNorm" and gpt2.layernorm_epsilon == 1e-5


def test_overrides_applied_and_unknown_keys_reported(tiny_llama_checkpoint):
    desc = describe_model(tiny_llama_checkpoint)
    cfg = build_transformer_config(desc, {}, "fp32", {"layernorm_zero_centered_gamma": True, "optimizer": {"lr": 1}})
    assert cfg.layernorm_zero_centered_gamma is True
    # the key named by its path and the closest valid key (difflib), not a list of fields sharing a word
    with pytest.raises(ValueError, match=r"^teacher 'x'\.hidden_sise: unknown key: not a TransformerConfig field of "
                       r"megatron-core 0\.\d+ \(installed here\).* \(did you mean 'hidden_size'\?\)$"):
        build_transformer_config(desc, {}, "fp32", {"hidden_sise": 3}, where="teacher 'x'")
    with pytest.raises(ValueError, match="tensor_model_parallel_size=4 contradicts the planned layout"):
        build_transformer_config(desc, {"tensor_model_parallel_size": 2}, "fp32", {"tensor_model_parallel_size": 4})
    config_part, model_part = split_overrides({"make_vocab_size_divisible_by": 64, "num_layers": 4})
    assert config_part == {"num_layers": 4} and model_part == {"make_vocab_size_divisible_by": 64}


def test_todays_nemo_rl_teacher_keys_are_skipped_on_the_node_as_the_plan_said(caplog):
    """The keys a NeMo RL teacher block carries today, which the node refused: skipped with the
    reason the plan noted (one rule, podium.config.megatron_keys); fp32_lm_head is no override."""
    keys = {"use_fused_linear_logprobs": False, "fused_linear_logprobs_chunk_size": 256, "segment_size": 2,
            "mtp_num_layers": 5, "mtp_loss_scaling_factor": 0.3, "make_vocab_size_divisible_by": 64,
            "hidden_dropout": 0.0}
    with caplog.at_level("INFO"):
        config_part, model_part = split_overrides(keys, "teacher 'm' megatron_cfg_overrides")
    assert config_part == {"hidden_dropout": 0.0} and model_part == {"make_vocab_size_divisible_by": 64}
    assert ("teacher 'm' megatron_cfg_overrides.segment_size: skipped: NeMo RL's NVLink-domain pinning"
            in caplog.text)
    assert "megatron_cfg_overrides.mtp_num_layers: skipped: multi-token prediction" in caplog.text
    with pytest.raises(ValueError, match=r"^x\.fp32_lm_head: a teacher setting: set it in the teacher block"):
        split_overrides({"fp32_lm_head": "tf32"}, "x")


def test_padded_vocab():
    assert padded_vocab_size(101, 1) == 128
    assert padded_vocab_size(101, 2) == 256
    assert padded_vocab_size(151936, 8, 128) == 152576
    assert padded_vocab_size(256, 2, 1) == 256


def test_moe_routing_comes_from_the_checkpoint_and_inference_settings_are_forced(
        no_cuda, tiny_qwen3_moe_checkpoint, tiny_qwen3_moe_unnormed_checkpoint, tiny_mixtral_checkpoint, caplog):
    """On CPU/gloo (``no_cuda``: a GPU node's devices hidden), as the dispatcher checks below assume."""
    qwen = describe_model(tiny_qwen3_moe_checkpoint)
    assert (qwen.num_experts, qwen.moe_topk, qwen.moe_ffn_hidden_size, qwen.moe_layers) == (4, 2, 32,
                                                                                           (True, False, True))
    # a recipe trained with capacity, sinkhorn and a flex dispatcher: an inference teacher is dropless
    recipe = {"moe_expert_capacity_factor": 1.0, "moe_router_load_balancing_type": "sinkhorn",
              "moe_token_dispatcher_type": "flex", "moe_router_dtype": "fp32"}
    with caplog.at_level("INFO"):
        cfg = build_transformer_config(qwen, {"expert_model_parallel_size": 2}, "fp32", recipe)
    assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == (4, 2, 32)
    assert cfg.moe_router_pre_softmax is False  # norm_topk_prob: softmax over the k chosen
    assert cfg.moe_layer_freq == [1, 0, 1] and cfg.moe_router_score_function == "softmax"
    assert cfg.moe_expert_capacity_factor is None and cfg.moe_router_topk_scaling_factor is None
    assert cfg.moe_router_load_balancing_type == "none" and cfg.moe_router_dtype == "fp32"  # honoured
    assert cfg.moe_token_dispatcher_type == "alltoall" and not cfg.moe_grouped_gemm  # CPU/gloo
    assert "moe_expert_capacity_factor=1.0 is a training setting" in caplog.text
    assert "'flex' needs CUDA" in caplog.text
    unnormed = build_transformer_config(describe_model(tiny_qwen3_moe_unnormed_checkpoint), {}, "fp32")
    assert unnormed.moe_router_pre_softmax is True  # softmax over all experts, top-k weights as they are
    mixtral = describe_model(tiny_mixtral_checkpoint)
    assert mixtral.norm_topk_prob and mixtral.moe_layers == (True, True) and not mixtral.qk_norm
    # expert-TP above attention-TP: gloo cannot all-gather unequal tensors, allgather dispatcher
    wide = build_transformer_config(mixtral, {"expert_model_parallel_size": 2, "expert_tensor_parallel_size": 2},
                                    "fp32")
    assert wide.moe_token_dispatcher_type == "allgather"


def test_moe_layouts_and_overrides_that_cannot_work_name_the_arithmetic(tiny_qwen3_moe_checkpoint,
                                                                        tiny_llama_checkpoint):
    qwen = describe_model(tiny_qwen3_moe_checkpoint)
    with pytest.raises(ValueError, match=r"EP3 must divide the experts \(4\): 4 experts / EP3 is not a whole number"):
        build_transformer_config(qwen, {"expert_model_parallel_size": 3}, "fp32")
    with pytest.raises(ValueError, match=r"expert-TP3 must divide the experts' MLP size \(32\)"):
        build_transformer_config(qwen, {"expert_tensor_parallel_size": 3}, "fp32")
    contradicts = r"moe_router_topk=4 contradicts the checkpoint \(Qwen3MoeForCausalLM: moe_router_topk=2\)"
    with pytest.raises(ValueError, match=contradicts):
        build_transformer_config(qwen, {}, "fp32", {"moe_router_topk": 4})
    with pytest.raises(ValueError, match="LlamaForCausalLM: has no routed experts; expert_model_parallel_size=2"):
        build_transformer_config(describe_model(tiny_llama_checkpoint), {"expert_model_parallel_size": 2}, "fp32")


def test_qwen2_moe_shared_expert_and_its_gate_come_from_the_checkpoint(tiny_qwen2_moe_checkpoint):
    from podium.teacher.model.hf import describe_hf_config

    desc = describe_model(tiny_qwen2_moe_checkpoint)
    assert (desc.moe_shared_ffn_hidden_size, desc.moe_shared_expert_gate) == (48, True)
    assert desc.qkv_bias and not desc.attn_out_bias and not desc.norm_topk_prob
    assert desc.moe_layers == (True, False, True)
    cfg = build_transformer_config(desc, {"expert_model_parallel_size": 2}, "fp32")
    assert (cfg.moe_shared_expert_intermediate_size, cfg.moe_shared_expert_gate) == (48, True)
    assert cfg.add_qkv_bias and not cfg.add_bias_linear
    assert cfg.moe_router_pre_softmax and not cfg.moe_shared_expert_overlap
    import dataclasses

    odd = dataclasses.replace(desc, moe_shared_ffn_hidden_size=49)
    with pytest.raises(ValueError, match=r"TP2 must divide the shared expert's MLP size \(49"):
        build_transformer_config(odd, {"tensor_model_parallel_size": 2}, "fp32")
    # a shared expert on a family podium maps without one is refused, not dropped
    qwen3 = dict(desc.hf_config, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe")
    with pytest.raises(ValueError, match="shared experts are mapped for Qwen2MoeForCausalLM only"):
        describe_hf_config(qwen3, "ckpt")
