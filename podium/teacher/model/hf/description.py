"""What podium needs to know about an HF checkpoint's architecture, read from its ``config.json``.

This module owns ``describe_hf_config``, which fills a :class:`.model_description.ModelDescription`
from the config of the families podium maps by hand, one describer per family (``_DESCRIBERS``):

- ``llama``: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm), and the MoE models Qwen3-MoE
  (q/k norm, layer mix by ``decoder_sparse_step`` / ``mlp_only_layers``, ``norm_topk_prob``),
  Qwen2-MoE (Qwen3-MoE's routing and layer mix, q/k/v bias, a shared expert behind a sigmoid gate)
  and Mixtral;
- ``glm4_moe``: GLM-4.5 / 4.6: Llama-style attention with q/k/v bias, optional q/k RMSNorm
  (``use_qk_norm``) and partial RoPE (``partial_rotary_factor`` of ``head_dim``); the first
  ``first_k_dense_replace`` layers dense, the rest MoE: a sigmoid router whose top-k is chosen with
  a per-expert bias (``e_score_correction_bias``), optionally among the best ``topk_group`` of
  ``n_group`` expert groups, weights renormalised and scaled by ``routed_scaling_factor``, plus
  ``n_shared_experts`` ungated shared experts; the map is the Llama family's;
- ``deepseek_v3``: DeepSeek-V3 and Kimi K2 (``DeepseekV3ForCausalLM``): multi-latent attention
  (queries through a ``q_lora_rank`` bottleneck or projected directly, keys and values from a shared
  ``kv_lora_rank`` latent, RoPE on ``qk_rope_head_dim`` of each head, stored interleaved unless
  ``rope_interleave`` is false) with DeepSeek's YaRN (``mscale``/``mscale_all_dim``: the rotary
  concentration and the softmax scale); the first ``first_k_dense_replace`` layers dense, the rest
  MoE as GLM-4.5's (sigmoid router with ``e_score_correction_bias``, expert groups,
  ``routed_scaling_factor``, ``n_shared_experts``);
- ``gemma3``: Gemma 3 text (``Gemma3ForCausalLM``): sliding-window layers by ``layer_types`` with
  their own RoPE base, global layers with the model's (default or linear), q/k RMSNorm, softmax
  scale ``query_pre_attn_scalar^-0.5``, gated tanh-GELU, a norm after the attention and after the
  MLP, the embedding scaled by ``√hidden``, tied embeddings, ``(1 + w)`` norms (the map adds the 1);
  a multimodal checkpoint (``Gemma3ForConditionalGeneration``) is served as its language model;
- ``gpt_oss``: gpt-oss, sinks, YaRN, fused or MXFP4 experts (described and mapped in :mod:`.gpt_oss`);
- ``gpt2``: GPT-2;
- ``nemotron_h``: Nemotron-H / Nemotron 3, hybrid layers by ``hybrid_override_pattern`` (or
  transformers' ``layers_block_type``): Mamba-2 mixers, attention without positions, squared-ReLU
  MLPs and MoE layers (sigmoid router with an expert bias, a shared expert, optional latent
  projections around the routed experts).

Anything else is a ``ValueError`` naming the checkpoint, the architecture and the supported list
(the list itself, architecture -> family, is :data:`podium.config.checkpoints.ARCHITECTURE_FAMILIES`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from podium.config.architecture import (
    GEMMA3_LAYER_TYPES,
    GLM_PARTIAL_ROTARY,
    field_problems,
    gemma3_layer_types,
    gemma3_rope,
    language_config,
)
from podium.config.checkpoints import ARCHITECTURE_FAMILIES, SUPPORTED_ARCHITECTURES
from podium.config.rope import deepseek_yarn, partial_rotary_factor
from podium.teacher.model.hf.model_description import MOE_NAMES, SHARED_EXPERT_NAMES, ModelDescription

# HF architecture name -> family (the one list: config.checkpoints).
_FAMILIES = ARCHITECTURE_FAMILIES

__all__ = ["MOE_NAMES", "SHARED_EXPERT_NAMES", "ModelDescription", "describe_hf_config"]


def _rope(config: Mapping[str, Any], checkpoint: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling) from either transformers 5 ``rope_parameters`` or 4.x fields."""
    params = dict(config.get("rope_parameters") or {})
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = dict(config.get("rope_scaling") or {}) or {k: v for k, v in params.items() if k != "rope_theta"}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type in (None, "default"):
        return float(theta), None
    if rope_type == "linear":
        return float(theta), {"rope_type": "linear", "factor": float(scaling["factor"])}
    if rope_type == "llama3":
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        for key, expected in fixed.items():
            if float(scaling.get(key, expected)) != float(expected):
                raise ValueError(
                    f"checkpoint {checkpoint}: rope scaling llama3 with {key}={scaling.get(key)} is not "
                    f"supported (Megatron's llama3 scaling fixes {key}={expected})"
                )
        return float(theta), {"rope_type": "llama3", "factor": float(scaling.get("factor", 8.0))}
    raise ValueError(
        f"checkpoint {checkpoint}: rope scaling type {rope_type!r} is not supported "
        "(supported: default, linear, llama3)"
    )


def describe_hf_config(config: Mapping[str, Any], checkpoint: str = "<config>") -> ModelDescription:
    """Normalise an HF ``config.json`` mapping; unknown architectures are a ``ValueError``."""
    archs = list(config.get("architectures") or [])
    arch = next((a for a in archs if a in _FAMILIES), None)
    if arch is None:
        raise ValueError(
            f"checkpoint {checkpoint}: architecture {archs or config.get('model_type')!r} is not supported "
            f"for direct HF loading (supported: {', '.join(SUPPORTED_ARCHITECTURES)}); convert it with "
            "megatron-bridge to a torch_dist checkpoint"
        )
    family = _FAMILIES[arch]
    _refused_fields(config, arch, checkpoint)  # a quantization podium cannot read, a field it cannot honour
    return _DESCRIBERS[family](config, arch, family, checkpoint)


def decoder_fields(config: Mapping[str, Any], *, max_positions: int, eps: float) -> dict[str, Any]:
    """The shape fields every RMSNorm decoder family reads alike (layers, widths, heads, KV groups,
    head_dim, vocabulary, positions, norm); ``max_positions``/``eps``: the family's defaults."""
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    return dict(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", max_positions)),
        normalization="RMSNorm",
        norm_eps=float(config.get("rms_norm_eps", eps)),
    )


def expert_count(config: Mapping[str, Any], arch: str, checkpoint: str, experts_keys: tuple[str, ...],
                 topk_keys: tuple[str, ...] = ("num_experts_per_tok",)) -> tuple[int, int]:
    """(routed experts, top-k) from the first of each family's key names that is set; ValueError
    naming the checkpoint when they cannot route (no expert, or a top-k outside 1..experts)."""
    experts = int(next((config[k] for k in experts_keys if config.get(k)), 0))
    topk = int(next((config[k] for k in topk_keys if config.get(k)), 0))
    if experts < 1 or not 1 <= topk <= experts:
        raise ValueError(f"checkpoint {checkpoint}: {arch} with {experts} experts and num_experts_per_tok={topk}")
    return experts, topk


def sigmoid_router_fields(config: Mapping[str, Any], experts: int, topk: int, dense: int,
                          shared_default: int) -> dict[str, Any]:
    """GLM-4.5's and DeepSeek-V3's experts: ``dense`` first layers dense, then MoE; a sigmoid router
    with expert bias, expert groups and a routed scale; ``n_shared_experts`` (default
    ``shared_default``) shared experts of the routed experts' size."""
    layers = int(config["num_hidden_layers"])
    ffn = int(config["moe_intermediate_size"])
    groups = int(config.get("n_group") or 1)
    shared = config.get("n_shared_experts", shared_default)
    return dict(
        num_experts=experts,
        moe_topk=topk,
        moe_ffn_hidden_size=ffn,
        norm_topk_prob=True,
        moe_layers=tuple(i >= dense for i in range(layers)),
        moe_shared_ffn_hidden_size=ffn * int(shared or 0),
        moe_score_function="sigmoid",
        moe_expert_bias=True,
        moe_routed_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
        moe_router_num_groups=groups if groups > 1 else 0,
        moe_router_group_topk=int(config.get("topk_group") or 1) if groups > 1 else 0,
    )


def _describe_gpt2(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    """GPT-2: learned positions, LayerNorm, GELU, biases on every linear layer."""
    act = config.get("activation_function", "gelu_new")
    activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    if act not in activations:
        raise ValueError(f"checkpoint {checkpoint}: GPT-2 activation_function {act!r} is not supported")
    if config.get("scale_attn_by_inverse_layer_idx") or not config.get("scale_attn_weights", True):
        raise ValueError(
            f"checkpoint {checkpoint}: GPT-2 attention scaling options "
            "scale_attn_by_inverse_layer_idx/scale_attn_weights=False are not supported"
        )
    hidden = int(config["n_embd"])
    heads = int(config["n_head"])
    return ModelDescription(
        architecture=arch,
        family=family,
        num_layers=int(config["n_layer"]),
        hidden_size=hidden,
        ffn_hidden_size=int(config.get("n_inner") or 4 * hidden),
        num_attention_heads=heads,
        num_query_groups=heads,
        head_dim=hidden // heads,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config["n_positions"]),
        normalization="LayerNorm",
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        activation=activations[act],
        position_embedding_type="learned_absolute",
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        hf_config=dict(config),
    )


def _describe_llama(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    """The Llama family: RoPE, RMSNorm, SwiGLU; Qwen's q/k/v bias and q/k norm; routed experts."""
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"checkpoint {checkpoint}: hidden_act {act!r} is not supported (SwiGLU needs silu)")
    model_type = config.get("model_type", "")
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and config.get("use_sliding_window"):
        raise ValueError(f"checkpoint {checkpoint}: {model_type} with use_sliding_window=true is not supported")
    theta, scaling = _rope(config, checkpoint)
    attention_bias = bool(config.get("attention_bias", False))
    sliding = config.get("sliding_window") if model_type in ("mistral", "mixtral") else None
    layers = int(config["num_hidden_layers"])
    return ModelDescription(
        architecture=arch,
        family=family,
        **decoder_fields(config, max_positions=2048, eps=1e-6),
        activation="swiglu",
        position_embedding_type="rope",
        rotary_base=theta,
        rope_scaling=scaling,
        # Qwen2: q/k/v bias, none on o_proj; Qwen2-MoE says so with ``qkv_bias`` (transformers 5;
        # always on before it)
        qkv_bias=(attention_bias or arch == "Qwen2ForCausalLM"
                  or (arch == "Qwen2MoeForCausalLM" and bool(config.get("qkv_bias", True)))),
        attn_out_bias=attention_bias and arch not in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        sliding_window=int(sliding) if sliding else None,
        **(_moe_fields(config, arch, layers, checkpoint) if arch in MOE_NAMES else {}),
        hf_config=dict(config),
    )


def _moe_fields(config: Mapping[str, Any], arch: str, layers: int, checkpoint: str) -> dict[str, Any]:
    """The routed-expert fields of a Qwen3-MoE / Qwen2-MoE / Mixtral config (names differ by family
    and by transformers version: ``num_experts`` or ``num_local_experts``)."""
    experts, topk = expert_count(config, arch, checkpoint, ("num_experts", "num_local_experts"))
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    if shared and arch != "Qwen2MoeForCausalLM":
        raise ValueError(f"checkpoint {checkpoint}: {arch} with shared_expert_intermediate_size={shared}: "
                         "shared experts are mapped for Qwen2MoeForCausalLM only")
    # Qwen2-MoE: a shared expert (when its size is > 0; with 0 transformers' is an empty MLP whose
    # output is 0) always behind its sigmoid gate
    fields: dict[str, Any] = dict(moe_shared_ffn_hidden_size=shared, moe_shared_expert_gate=bool(shared))
    if arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        step = int(config.get("decoder_sparse_step") or 1)
        dense = {int(i) for i in (config.get("mlp_only_layers") or [])}
        moe_layers = tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
        ffn = int(config["moe_intermediate_size"])
        norm = bool(config.get("norm_topk_prob", False))
    else:  # Mixtral: every layer, experts of intermediate_size, top-k weights renormalised
        moe_layers = (True,) * layers
        ffn = int(config["intermediate_size"])
        norm = True
    return dict(num_experts=experts, moe_topk=topk, moe_ffn_hidden_size=ffn, norm_topk_prob=norm,
                moe_layers=moe_layers, **fields)


# transformers' ``layers_block_type`` names -> the ``hybrid_override_pattern`` symbols.
HYBRID_SYMBOLS = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*",
                  "mlp": "-", "moe": "E"}


def hybrid_pattern(config: Mapping[str, Any], checkpoint: str) -> str:
    """The layer pattern of a Nemotron-H config: ``hybrid_override_pattern`` (published
    checkpoints) or ``layers_block_type`` (what transformers >= 5.3 writes)."""
    pattern = config.get("hybrid_override_pattern")
    if not pattern:
        kinds = list(config.get("layers_block_type") or [])
        unknown = sorted({k for k in kinds if k not in HYBRID_SYMBOLS})
        if unknown or not kinds:
            raise ValueError(f"checkpoint {checkpoint}: layers_block_type {unknown or kinds!r} is not a hybrid "
                             f"layer list (known: {sorted(HYBRID_SYMBOLS)})")
        pattern = "".join(HYBRID_SYMBOLS[k] for k in kinds)
    if set(pattern) - set("M*-E"):
        raise ValueError(f"checkpoint {checkpoint}: hybrid_override_pattern {pattern!r} has symbols other than "
                         "M (Mamba-2), * (attention), - (MLP), E (MoE)")
    return str(pattern)


def _refuse(checkpoint: str, config: Mapping[str, Any], key: str, supported: Any, default: Any) -> None:
    value = config.get(key, default)
    if value != supported:
        raise ValueError(f"checkpoint {checkpoint}: NemotronH with {key}={value!r} is not supported "
                         f"(Megatron's hybrid model needs {key}={supported!r})")


def _describe_nemotron_h(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    """Nemotron-H: hybrid Mamba-2 / attention (no positions) / squared-ReLU MLP / MoE layers, one
    pre-norm RMSNorm per layer; MTP heads (``mtp.*``) are not part of the teacher."""
    for key, supported, default in (("mamba_hidden_act", "silu", "silu"), ("mlp_hidden_act", "relu2", "relu2"),
                                    ("use_bias", False, False), ("mamba_proj_bias", False, False),
                                    ("use_conv_bias", True, True), ("n_group", 1, 1), ("n_shared_experts", 1, 1),
                                    ("attention_bias", False, False), ("mlp_bias", False, False)):
        _refuse(checkpoint, config, key, supported, default)
    pattern = hybrid_pattern(config, checkpoint)
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    mamba_heads = int(config["mamba_num_heads"])
    moe: dict[str, Any] = {}
    if "E" in pattern:
        experts = int(config.get("n_routed_experts") or config.get("num_local_experts") or 0)
        topk = int(config.get("num_experts_per_tok") or 0)
        if experts < 1 or not 1 <= topk <= experts:
            raise ValueError(f"checkpoint {checkpoint}: {arch} with {experts} experts and num_experts_per_tok={topk}")
        if topk > 1 and not config.get("norm_topk_prob", True):
            raise ValueError(f"checkpoint {checkpoint}: {arch} with norm_topk_prob=false is not supported "
                             "(Megatron renormalises sigmoid top-k weights)")
        moe = dict(num_experts=experts, moe_topk=topk, moe_ffn_hidden_size=int(config["moe_intermediate_size"]),
                   norm_topk_prob=True, moe_layers=tuple(c == "E" for c in pattern),
                   moe_shared_ffn_hidden_size=int(config.get("moe_shared_expert_intermediate_size") or 0),
                   moe_score_function="sigmoid", moe_expert_bias=True,
                   moe_routed_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
                   moe_latent_size=int(config.get("moe_latent_size") or 0))
    return ModelDescription(
        architecture=arch,
        family=family,
        num_layers=len(pattern),
        hidden_size=hidden,
        ffn_hidden_size=int(config.get("intermediate_size") or 0),
        num_attention_heads=heads,
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        normalization="RMSNorm",
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        activation="squared_relu",
        position_embedding_type="none",
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        hybrid_pattern=pattern,
        mamba_num_heads=mamba_heads,
        mamba_head_dim=int(config["mamba_head_dim"]),
        mamba_num_groups=int(config.get("n_groups") or config.get("mamba_n_groups") or 1),
        mamba_state_dim=int(config["ssm_state_size"]),
        mamba_conv_kernel=int(config.get("conv_kernel") or config.get("mamba_d_conv") or 4),
        **moe,
        hf_config=dict(config),
    )


def _refused_fields(config: Mapping[str, Any], arch: str, checkpoint: str) -> None:
    """``ValueError`` naming every field podium cannot honour (the rule the plan applies:
    :func:`podium.config.architecture.field_problems`)."""
    problems = field_problems(config)
    if problems:
        raise ValueError(f"checkpoint {checkpoint}: {arch} with {'; '.join(problems)}")


def _describe_glm4_moe(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    """GLM-4.5 / 4.6 (see the module doc). MTP layers (``num_nextn_predict_layers``, stored as
    layers past ``num_hidden_layers``) are not part of the teacher."""
    experts, topk = expert_count(config, arch, checkpoint, ("n_routed_experts", "num_local_experts"))
    dense = int(config.get("first_k_dense_replace", 1))
    theta, _ = _rope(config, checkpoint)
    return ModelDescription(
        architecture=arch,
        family=family,
        **decoder_fields(config, max_positions=2048, eps=1e-5),
        activation="swiglu",
        position_embedding_type="rope",
        rotary_base=theta,
        rotary_percent=partial_rotary_factor(config, GLM_PARTIAL_ROTARY),
        qkv_bias=bool(config.get("attention_bias", False)),  # q/k/v only: o_proj has none
        qk_norm=bool(config.get("use_qk_norm", False)),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        **sigmoid_router_fields(config, experts, topk, dense, shared_default=1),
        hf_config=dict(config),
    )


def _describe_gemma3(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    """Gemma 3 text (see the module doc); of a multimodal checkpoint, its language model."""
    config = language_config(config)
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    rope = gemma3_rope(config)
    full = rope["full_attention"]
    sliding = tuple(kind == GEMMA3_LAYER_TYPES[0] for kind in gemma3_layer_types(config))
    window = config.get("sliding_window")
    if len(sliding) != layers:
        raise ValueError(f"checkpoint {checkpoint}: {arch} with {len(sliding)} layer_types for {layers} layers")
    return ModelDescription(
        architecture=arch,
        family=family,
        **decoder_fields(config, max_positions=131072, eps=1e-6),
        activation="geglu_tanh",
        position_embedding_type="rope",
        rotary_base=float(full["rope_theta"]),
        rope_scaling=({"rope_type": "linear", "factor": float(full["factor"])} if full["rope_type"] == "linear"
                      else None),
        qk_norm=True,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        sliding_window=int(window) if window and any(sliding) else None,
        window_layers=sliding if window and any(sliding) else (),
        local_rotary_base=float(rope["sliding_attention"]["rope_theta"]),
        softmax_scale=float(config.get("query_pre_attn_scalar", 256)) ** -0.5,
        embedding_scale=hidden**0.5,
        post_norms=True,
        hf_config=dict(config),
    )


def _describe_deepseek_v3(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    """DeepSeek-V3 / Kimi K2 (see the module doc). The MTP layers (``num_nextn_predict_layers``,
    stored as ``model.layers.{num_hidden_layers + i}.*``) are not part of the teacher."""
    heads = int(config["num_attention_heads"])
    layers = int(config["num_hidden_layers"])
    experts, topk = expert_count(config, arch, checkpoint, ("n_routed_experts", "num_local_experts"))
    nope, rope = int(config["qk_nope_head_dim"]), int(config["qk_rope_head_dim"])
    dense = int(config.get("first_k_dense_replace") or 0)  # then MoE on every layer (moe_layer_freq 1)
    theta, _ = _rope(config, checkpoint) if deepseek_yarn(config) is None else (_rope_theta(config), None)
    return ModelDescription(
        architecture=arch,
        family=family,
        num_layers=layers,
        hidden_size=int(config["hidden_size"]),
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=heads,
        head_dim=nope + rope,
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
        normalization="RMSNorm",
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        activation="swiglu",
        position_embedding_type="rope",
        rotary_base=theta,
        rope_scaling=deepseek_yarn(config),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        **sigmoid_router_fields(config, experts, topk, dense, shared_default=0),
        kv_lora_rank=int(config["kv_lora_rank"]),
        q_lora_rank=int(config.get("q_lora_rank") or 0),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        v_head_dim=int(config["v_head_dim"]),
        rope_interleave=bool(config.get("rope_interleave", True)),
        hf_config=dict(config),
    )


def _rope_theta(config: Mapping[str, Any]) -> float:
    params = config.get("rope_parameters")
    inner = params.get("rope_theta") if isinstance(params, Mapping) else None
    return float(inner if inner is not None else config.get("rope_theta", 10000.0))


def _describe_gpt_oss(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    from podium.teacher.model.hf.gpt_oss import describe_gpt_oss  # beside its map (it imports this module)
    return describe_gpt_oss(config, arch, family, checkpoint)


# Family (``ARCHITECTURE_FAMILIES``' values) -> its describer.
_DESCRIBERS: dict[str, Callable[[Mapping[str, Any], str, str, str], ModelDescription]] = {
    "llama": _describe_llama,
    "glm4_moe": _describe_glm4_moe,
    "deepseek_v3": _describe_deepseek_v3,
    "gemma3": _describe_gemma3,
    "gpt_oss": _describe_gpt_oss,
    "gpt2": _describe_gpt2,
    "nemotron_h": _describe_nemotron_h,
}
