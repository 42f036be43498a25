"""``podium plan`` of the teacher families added after the first nine: a GLM-4.5-shaped ``config.json``
is planned and described (its experts over EP, its MoE needs); each checkpoint field podium cannot
honour is refused at plan time naming the field, and the worker's describer refuses the same
(one rule: ``podium.config.architecture.field_problems``). Configs only: no weights are read."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from podium.config.errors import ConfigError
from podium.config.plan import load_plan, require_checkpoints
from podium.teacher.model.hf import describe_hf_config

RECIPE = """\
on_policy_distillation:
  teacher_model_by_agent_name:
    math: {ckpt}
  default_teacher_alias: math
  non_colocated_teachers:
    default_teacher_cfg:
      tensor_model_parallel_size: 8
      expert_model_parallel_size: {ep}
      num_nodes: 1
      gpus_per_node: 8
      precision: bf16
      micro_batch_size: 1
"""

# GLM-4.5's shape (355B-A32B, as its config.json writes it: transformers 4 field names)
GLM45: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": 151552, "hidden_size": 5120,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 92, "num_attention_heads": 96,
    "num_key_value_heads": 8, "head_dim": 128, "partial_rotary_factor": 0.5, "rope_theta": 1000000,
    "rope_scaling": None, "attention_bias": True, "use_qk_norm": True, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "n_routed_experts": 160, "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 3, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
}


def _plan(tmp_path: Path, config: dict[str, Any]):
    """The plan of a one-teacher recipe at TP8 (EP8 for a model with routed experts)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "model.safetensors").write_bytes(b"")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(ckpt=ckpt, ep=8 if {"n_routed_experts", "num_local_experts"} & set(config) else 1))
    return load_plan(recipe)


def test_glm45_is_planned_and_described(tmp_path: Path) -> None:
    from podium.config.checkpoints import checkpoint_needs

    plan = _plan(tmp_path, GLM45)
    require_checkpoints(plan)  # nothing refused
    (teacher,) = plan.teachers
    needs = " ".join(checkpoint_needs(teacher.model_name, teacher))
    assert "experts: 160 over EP8 = 20 per rank, top-8" in needs
    desc = describe_hf_config(GLM45)
    assert (desc.family, desc.rotary_percent, desc.head_dim, desc.qk_norm, desc.qkv_bias) == (
        "glm4_moe", 0.5, 128, True, True)
    assert desc.moe_layers == (False,) * 3 + (True,) * 89
    assert (desc.moe_router_num_groups, desc.moe_shared_ffn_hidden_size, desc.moe_routed_scaling_factor) == (
        0, 1536, 2.5)


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     "rope_parameters.rope_type='yarn': GLM-4.5 is mapped with the default RoPE only"),
    ({"norm_topk_prob": False}, "norm_topk_prob=false: megatron-core renormalises sigmoid top-k weights"),
    ({"n_group": 4, "topk_group": 1},
     "n_group=4, topk_group=1, num_experts_per_tok=8: transformers scores a group by its top 2 experts, "
     "megatron-core by its top num_experts_per_tok / topk_group (8 / 1)"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu': GLM-4.5's MLPs are mapped as SwiGLU (silu) only"),
    ({"partial_rotary_factor": 0.3},
     "partial_rotary_factor=0.3: head_dim 128 × 0.3 = 38.4 is not a whole even number of rotary dimensions"),
])
def test_a_glm_field_podium_cannot_honour_is_refused_at_plan_and_by_the_describer(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    config = {**GLM45, **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        require_checkpoints(_plan(tmp_path, config))
    with pytest.raises(ValueError, match=re.escape(message)):
        describe_hf_config(config)


def test_glm_group_limited_routing_with_top_2_per_group_is_served(tmp_path: Path) -> None:
    # DeepSeek-V3's grouping (8 groups, 4 kept, top-8: 2 per group) is what megatron-core computes
    config = {**GLM45, "n_group": 8, "topk_group": 4}
    require_checkpoints(_plan(tmp_path, config))
    desc = describe_hf_config(config)
    assert (desc.moe_router_num_groups, desc.moe_router_group_topk) == (8, 4)


# Gemma 3 27B's text shape, as its config.json writes it (transformers 4 field names: one global RoPE
# with linear scaling, the sliding layers' base apart, a layer pattern instead of layer_types)
GEMMA3: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 262208, "hidden_size": 5376,
    "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
    "head_dim": 128, "query_pre_attn_scalar": 168, "sliding_window": 1024, "sliding_window_pattern": 6,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "attention_bias": False, "max_position_embeddings": 131072,
}


def test_gemma3_is_planned_and_described(tmp_path: Path) -> None:
    require_checkpoints(_plan(tmp_path, GEMMA3))  # TP8
    desc = describe_hf_config(GEMMA3)
    assert (desc.family, desc.rotary_base, desc.local_rotary_base, desc.sliding_window) == (
        "gemma3", 1e6, 1e4, 1024)
    assert desc.rope_scaling == {"rope_type": "linear", "factor": 8.0} and desc.tied_embeddings
    assert desc.window_layers == tuple((i + 1) % 6 != 0 for i in range(62))
    assert desc.softmax_scale == 168 ** -0.5 and desc.embedding_scale == 5376 ** 0.5


@pytest.mark.parametrize(("change", "message"), [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0: logit softcapping is not served"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0: logit softcapping is not served"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true: Gemma 3 is mapped causal"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 8.0}},
     "rope_parameters.full_attention.rope_type='yarn': supported: default, linear"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
     "rope_parameters.sliding_attention.rope_type='linear': the sliding layers' RoPE is mapped default only"),
    ({"hidden_activation": "silu"}, "hidden_activation='silu': Gemma 3's MLPs are mapped as gated tanh-GELU only"),
    ({"layer_types": ["chunked_attention"] * 62}, "layer_types ['chunked_attention']: supported"),
])
def test_a_gemma3_field_podium_cannot_honour_is_refused_at_plan_and_by_the_describer(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    config = {**GEMMA3, **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        require_checkpoints(_plan(tmp_path, config))
    with pytest.raises(ValueError, match=re.escape(message)):
        describe_hf_config(config)


def test_a_multimodal_gemma3_is_planned_as_its_language_model_with_transformers_defaults(tmp_path: Path) -> None:
    # Gemma 3 4B's multimodal config.json writes only what differs from Gemma3TextConfig's defaults
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
                              "num_hidden_layers": 34, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                              "sliding_window": 1024},
              "vision_config": {"model_type": "siglip_vision_model"}}
    require_checkpoints(_plan(tmp_path, config))  # TP8: the default 8 heads, 4 KV groups (2 ranks each)
    desc = describe_hf_config(config)
    assert (desc.architecture, desc.num_layers, desc.num_attention_heads, desc.head_dim, desc.vocab_size) == (
        "Gemma3ForConditionalGeneration", 34, 8, 256, 262208)
    assert desc.softmax_scale == 256 ** -0.5 and desc.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    capped = tmp_path / "capped"
    capped.mkdir()
    with pytest.raises(ConfigError, match=re.escape("attn_logit_softcapping=50.0")):  # read in text_config
        require_checkpoints(_plan(capped, {**config, "text_config": {**config["text_config"],
                                                                      "attn_logit_softcapping": 50.0}}))


# gpt-oss-120b's config.json as published (transformers 4 field names; MXFP4 experts)
GPT_OSS_120B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 18, "attention_bias": True,
    "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                           "truncate": False, "original_max_position_embeddings": 4096},
    "swiglu_limit": 7.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}


def test_gpt_oss_120b_is_planned_and_described_with_its_mxfp4_experts(tmp_path: Path) -> None:
    from podium.config.checkpoints import checkpoint_needs

    plan = _plan(tmp_path, GPT_OSS_120B)
    require_checkpoints(plan)  # TP8·EP8
    (teacher,) = plan.teachers
    needs = " ".join(checkpoint_needs(teacher.model_name, teacher))
    assert "experts: 128 over EP8 = 16 per rank, top-4" in needs
    assert "MXFP4 experts (quantization_config.quant_method='mxfp4'): each rank dequantizes its own experts" in needs
    desc = describe_hf_config(GPT_OSS_120B)
    assert (desc.family, desc.position_embedding_type, desc.rotary_base, desc.expert_quantization) == (
        "gpt_oss", "yarn", 150000.0, "mxfp4")
    assert desc.rope_scaling is not None and desc.rope_scaling["factor"] == 32.0
    assert desc.rope_scaling["truncate"] is False
    assert (desc.attention_sinks, desc.glu_linear_offset, desc.activation_clamp) == (True, 1.0, 7.0)
    assert desc.window_layers == (True, False) * 18 and desc.sliding_window == 128
    assert (desc.num_experts, desc.moe_topk, desc.moe_ffn_hidden_size) == (128, 4, 2880)


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "rope_parameters.rope_type='linear': gpt-oss is mapped with YaRN or the default RoPE only"),
    ({"rope_scaling": {**GPT_OSS_120B["rope_scaling"], "attention_factor": 1.5}},
     "rope_parameters.attention_factor=1.5: megatron-core derives YaRN's attention factor"),
    ({"swiglu_alpha": 1.5}, "swiglu_alpha=1.5: megatron-core's quick_gelu fixes the SwiGLU gain at 1.702"),
    ({"attention_bias": False}, "attention_bias=false: gpt-oss is mapped with its q/k/v and o_proj biases"),
    ({"layer_types": ["chunked_attention"] * 36}, "layer_types ['chunked_attention']: supported"),
    ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
     "quantization_config.quant_method='bitsandbytes': podium dequantizes only mxfp4 for gpt_oss; serve a "
     "dequantized (bf16/fp32) copy"),
])
def test_a_gpt_oss_field_or_quantization_podium_cannot_honour_is_refused_at_plan_and_by_the_describer(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    config = {**GPT_OSS_120B, **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        require_checkpoints(_plan(tmp_path, config))
    with pytest.raises(ValueError, match=re.escape(message)):
        describe_hf_config(config)


def test_a_quantized_checkpoint_of_another_family_is_refused_naming_its_method(tmp_path: Path) -> None:
    config = {**GLM45, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    message = "quantization_config.quant_method='fp8': podium reads no quantized glm4_moe weights"
    with pytest.raises(ConfigError, match=re.escape(message)):
        require_checkpoints(_plan(tmp_path, config))
