"""``podium plan`` of the teacher families added after the first nine: GLM-4.5-, Gemma 3-, DeepSeek-V3- and
Kimi K2-shaped ``config.json`` files are planned and described (experts over EP, MoE, multi-latent
attention and fp8 needs); a quantization podium cannot read is refused for any family; each checkpoint
field podium cannot honour is refused at plan time naming the field, and the worker's describer
refuses the same (one rule: ``podium.config.architecture.field_problems``). Configs only: no weights are read."""

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


# DeepSeek-V3's config.json as published (transformers 4 field names, its fp8 quantization_config)
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "n_shared_experts": 1, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "max_position_embeddings": 163840, "num_nextn_predict_layers": 1, "attention_bias": False,
    "tie_word_embeddings": False,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
# Kimi K2: the same architecture under its own model_type and values (one expert group, 384 experts)
KIMI_K2 = {**DEEPSEEK_V3, "model_type": "kimi_k2", "n_routed_experts": 384, "n_group": 1, "topk_group": 1,
           "num_attention_heads": 64, "num_key_value_heads": 64, "first_k_dense_replace": 1,
           "routed_scaling_factor": 2.827, "rope_theta": 50000.0,
           "rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0}}


@pytest.mark.parametrize("config", [DEEPSEEK_V3, KIMI_K2], ids=["deepseek_v3", "kimi_k2"])
def test_deepseek_v3_and_kimi_k2_in_fp8_are_planned_and_described(tmp_path: Path, config: dict[str, Any]) -> None:
    from podium.config.checkpoints import checkpoint_needs

    plan = _plan(tmp_path, config)
    require_checkpoints(plan)  # nothing refused
    (teacher,) = plan.teachers
    needs = " ".join(checkpoint_needs(teacher.model_name, teacher))
    heads = config["num_attention_heads"]
    assert f"attention: multi-latent (kv_lora_rank=512, q_lora_rank=1536, YaRN on qk_rope_head_dim=64); TP8 gives " \
           f"each rank {heads // 8} of the {heads} heads" in needs
    assert "weights: fp8 (e4m3) in 128×128 blocks with weight_scale_inv, dequantized" in needs
    assert f"experts: {config['n_routed_experts']} over EP8" in needs
    desc = describe_hf_config(config)
    assert (desc.family, desc.is_mla, desc.head_dim, desc.v_head_dim, desc.num_layers) == (
        "deepseek_v3", True, 192, 128, 61)
    dense = config["first_k_dense_replace"]
    assert desc.moe_layers == (False,) * dense + (True,) * (61 - dense)
    assert desc.rope_scaling is not None and desc.rope_scaling["factor"] == config["rope_scaling"]["factor"]
    assert (desc.moe_router_num_groups, desc.moe_router_group_topk) == ((8, 4) if config["n_group"] > 1 else (0, 0))


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_scaling": {"type": "dynamic", "factor": 4.0}},
     "rope_parameters.rope_type='dynamic': DeepSeek-V3 is mapped with the default RoPE or YaRN"),
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "mscale": 0}},
     "rope_parameters.mscale=0 with mscale_all_dim=1.0"),
    ({"rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "truncate": False}}, "rope_parameters.truncate=false"),
    ({"topk_method": "group_limited_greedy"}, "topk_method='group_limited_greedy': DeepSeek-V3 routes with noaux_tc"),
    ({"scoring_func": "softmax"}, "scoring_func='softmax': DeepSeek-V3's router is mapped with sigmoid scores only"),
    ({"norm_topk_prob": False}, "norm_topk_prob=false: megatron-core renormalises sigmoid top-k weights"),
    ({"moe_layer_freq": 2}, "moe_layer_freq=2: every layer from first_k_dense_replace on is MoE"),
    ({"attention_bias": True}, "attention_bias=true: megatron-core's MLA projections have no bias"),
    ({"n_group": 8, "topk_group": 2}, "n_group=8, topk_group=2, num_experts_per_tok=8: transformers scores a group"),
    ({"quantization_config": {"quant_method": "awq", "bits": 4}},
     "quantization_config.quant_method='awq': podium reads unquantized weights, block-scaled fp8"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}},
     "quantization_config.weight_block_size=None: podium reads fp8 weights scaled per block"),
    ({"quantization_config": {**DEEPSEEK_V3["quantization_config"], "fmt": "e5m2"}},
     "quantization_config.fmt='e5m2': podium reads float8 e4m3 weights only"),
])
def test_a_deepseek_field_or_quantization_podium_cannot_honour_is_refused_at_plan_and_by_the_describer(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    config = {**DEEPSEEK_V3, **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        require_checkpoints(_plan(tmp_path, config))
    with pytest.raises(ValueError, match=re.escape(message)):
        describe_hf_config(config)


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
     "quantization_config.quant_method='bitsandbytes': podium reads unquantized weights, block-scaled fp8"),
])
def test_a_gpt_oss_field_or_quantization_podium_cannot_honour_is_refused_at_plan_and_by_the_describer(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    config = {**GPT_OSS_120B, **change}
    with pytest.raises(ConfigError, match=re.escape(message)):
        require_checkpoints(_plan(tmp_path, config))
    with pytest.raises(ValueError, match=re.escape(message)):
        describe_hf_config(config)


def test_a_quantization_podium_cannot_read_is_refused_for_any_family(tmp_path: Path) -> None:
    config = {**GLM45, "quantization_config": {"quant_method": "gptq", "bits": 4}}
    with pytest.raises(ConfigError, match=re.escape("quantization_config.quant_method='gptq'")):
        require_checkpoints(_plan(tmp_path, config))
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 64,
             "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
             "quantization_config": {"quant_method": "bitsandbytes"}}
    with pytest.raises(ValueError, match=re.escape("quantization_config.quant_method='bitsandbytes'")):
        describe_hf_config(llama)


def test_mla_latents_that_tp_cannot_split_are_refused_at_plan(tmp_path: Path) -> None:
    config = {**DEEPSEEK_V3, "q_lora_rank": 1540, "kv_lora_rank": 500}
    with pytest.raises(ConfigError) as err:
        require_checkpoints(_plan(tmp_path, config))
    assert "q_lora_rank=1540: TP8 must divide the query latent (1540 / 8 is not whole)" in str(err.value)
    assert "kv_lora_rank=500, qk_rope_head_dim=64: TP8 must divide the key/value latent and the rotary key " \
           "(500 + 64 = 564; / 8 is not whole)" in str(err.value)
