"""A teacher's Megatron ``TransformerConfig``, built from its architecture and its planned spec.

This module owns the translation from (HF architecture description, planned ``TeacherSpec``,
``megatron_cfg_overrides``) to a Megatron ``TransformerConfig``:

- the parallel layout (TP/PP/CP/EP/ETP) goes into the config as well as into ``parallel_state``
  (layers per pipeline stage come from the config; without it every stage builds all layers), and
  ``check_model_layout`` says, without importing megatron, whether that layout can split the model;
- ``megatron_cfg_overrides`` are applied to the config by the rule the plan already applied on the
  login node (:mod:`podium.config.megatron_keys`, with this node's megatron-core release): fields
  applied, keys an inference teacher does not use logged and skipped, anything else an error naming
  its key and the closest valid one (never ignored silently);
- for an MoE model, the checkpoint's experts and routing, the inference routing settings and the
  token dispatcher for this device (``moe_settings``);
- the padded vocabulary size (a multiple of ``make_vocab_size_divisible_by × TP``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from podium.config.architecture import attention_tp_problem
from podium.config.errors import refusal
from podium.config.layout import PARALLEL_SIZES
from podium.config.megatron_fields import fields_of, release_of
from podium.config.megatron_keys import split_keys
from podium.config.precision import torch_dtype
from podium.teacher.model.hf import ModelDescription

if TYPE_CHECKING:  # pragma: no cover
    from megatron.core.transformer.transformer_config import TransformerConfig

logger = logging.getLogger(__name__)

DEFAULT_VOCAB_DIVISOR = 128

def te_available() -> bool:
    """TransformerEngine is used only when it is importable and CUDA is present."""
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = DEFAULT_VOCAB_DIVISOR) -> int:
    multiple = max(1, divisible_by) * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def installed_release() -> tuple[str, frozenset[str]]:
    """The megatron-core release of this Python (``major.minor``) and its ``TransformerConfig``
    fields: the list podium ships for it (:mod:`podium.config.megatron_fields`, checked against the
    dataclass in CI), else, for a release podium ships none for, the dataclass's own."""
    import megatron.core
    from megatron.core.transformer.transformer_config import TransformerConfig

    try:
        release = release_of(megatron.core.__version__)
    except ValueError:  # a build without a release number: its own fields
        release = str(megatron.core.__version__)
    shipped = fields_of(release)
    return release, shipped if shipped is not None else frozenset(f.name for f in dataclasses.fields(TransformerConfig))


def split_overrides(overrides: Mapping[str, Any],
                    where: str = "megatron_cfg_overrides") -> tuple[dict[str, Any], dict[str, Any]]:
    """(TransformerConfig overrides, podium model options) by the rule the plan applies
    (:mod:`podium.config.megatron_keys`), with this node's megatron-core release; skipped keys are
    logged, refused and unknown ones raise ``ValueError`` naming ``where.<key>`` each."""
    release, fields = installed_release()
    split = split_keys(dict(overrides or {}), lambda key: f"{where}.{key}", release=release, fields=fields)
    for path, why in split.skipped.items():
        logger.info("%s: skipped: %s", path, why)
    if split.problems:
        raise refusal(split.problems)  # a ValueError, worded as the plan words it
    return split.config, split.model


def check_model_layout(desc: ModelDescription, parallel: Mapping[str, int], where: str = "") -> None:
    """``ValueError`` when the parallel layout cannot split this architecture (no megatron import)."""
    tp = int(parallel.get("tensor_model_parallel_size", 1))
    pp = int(parallel.get("pipeline_model_parallel_size", 1))
    cp = int(parallel.get("context_parallel_size", 1))
    who = f"{where}{desc.architecture}"
    problem = attention_tp_problem(desc.num_attention_heads, desc.num_query_groups, desc.head_dim, tp)
    if problem:
        raise ValueError(f"{who}: {problem}")
    if desc.ffn_hidden_size % tp:
        raise ValueError(f"{who}: TP{tp} must divide the MLP size ({desc.ffn_hidden_size})")
    if desc.num_layers % pp:
        raise ValueError(f"{who}: PP{pp} must divide the number of layers ({desc.num_layers})")
    ep = int(parallel.get("expert_model_parallel_size", 1))
    etp = int(parallel.get("expert_tensor_parallel_size", 1))
    if not desc.is_moe and (ep > 1 or etp > 1):
        raise ValueError(f"{who}: has no routed experts; expert_model_parallel_size={ep} / "
                         f"expert_tensor_parallel_size={etp} need an MoE model (set them to 1)")
    if desc.is_moe:
        if desc.num_experts % ep:
            raise ValueError(f"{who}: EP{ep} must divide the experts ({desc.num_experts}): "
                             f"{desc.num_experts} experts / EP{ep} is not a whole number per rank")
        if desc.moe_ffn_hidden_size % etp:
            raise ValueError(f"{who}: expert-TP{etp} must divide the experts' MLP size ({desc.moe_ffn_hidden_size})")
        if desc.moe_shared_ffn_hidden_size % tp:
            raise ValueError(f"{who}: TP{tp} must divide the shared expert's MLP size "
                             f"({desc.moe_shared_ffn_hidden_size}; it is split over the attention TP)")
    if cp > 1 and not te_available():
        raise ValueError(f"{who}: CP{cp} needs TransformerEngine's attention on CUDA (not available here)")


def _activation(desc: ModelDescription) -> tuple[Any, bool]:
    import torch.nn.functional as F

    if desc.activation == "swiglu":
        return F.silu, True
    if desc.activation in ("gelu_tanh", "geglu_tanh"):  # GPT-2's; Gemma's gated
        return functools.partial(F.gelu, approximate="tanh"), desc.activation == "geglu_tanh"
    if desc.activation == "quick_geglu":  # gpt-oss: x·σ(1.702x) of the gate (clamped: the config's)
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        return quick_gelu, True
    if desc.activation == "squared_relu":
        from megatron.core.activations import squared_relu

        return squared_relu, False
    return F.gelu, False


def build_transformer_config(
    desc: ModelDescription,
    parallel: Mapping[str, int],
    precision: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    use_cpu_initialization: bool | None = None,
    where: str = "megatron_cfg_overrides",
) -> TransformerConfig:
    """The inference ``TransformerConfig`` of a teacher (parallel sizes included, see module doc)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    config_overrides, _ = split_overrides(overrides or {}, where)
    _check_parallel_overrides(config_overrides, parallel, where)
    check_model_layout(desc, parallel)
    dtype = torch_dtype(precision)
    activation, gated = _activation(desc)
    if use_cpu_initialization is None:
        use_cpu_initialization = not torch.cuda.is_available()
    kwargs: dict[str, Any] = dict(
        num_layers=desc.num_layers,
        hidden_size=desc.hidden_size,
        ffn_hidden_size=desc.ffn_hidden_size,
        num_attention_heads=desc.num_attention_heads,
        num_query_groups=desc.num_query_groups,
        kv_channels=desc.head_dim,
        normalization=desc.normalization,
        layernorm_epsilon=desc.norm_eps,
        activation_func=activation,
        gated_linear_unit=gated,
        add_bias_linear=desc.any_linear_bias,
        add_qkv_bias=desc.qkv_bias,
        qk_layernorm=desc.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        apply_query_key_layer_scaling=False,
        attention_softmax_in_fp32=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        sequence_parallel=False,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=False,  # weights come from the checkpoint
        **{key: int(parallel.get(key, 1)) for key in PARALLEL_SIZES},
    )
    kwargs.update(window_settings(desc))
    kwargs.update(sink_and_glu_settings(desc))
    if desc.is_hybrid:
        kwargs.update(hybrid_settings(desc))
    config_cls: type[TransformerConfig] = TransformerConfig
    if desc.is_mla:
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config_cls = MLATransformerConfig
        kwargs.update(mla_settings(desc))
    kwargs.update(config_overrides)
    if desc.is_moe:
        kwargs.update(moe_settings(desc, parallel, config_overrides, where))
    try:
        config = config_cls(**kwargs)
    except (AssertionError, ValueError, TypeError) as exc:
        raise ValueError(f"{desc.architecture}: invalid Megatron TransformerConfig ({exc})") from exc
    if desc.position_embedding_type == "yarn":
        set_yarn(config, desc.rope_scaling or {})
    return config


def _check_parallel_overrides(config_overrides: Mapping[str, Any], parallel: Mapping[str, int], where: str) -> None:
    """Parallel sizes come from the spec; an override may repeat them but not contradict them."""
    for key in PARALLEL_SIZES:
        if key in config_overrides and int(config_overrides[key]) != int(parallel.get(key, 1)):
            raise ValueError(
                f"{where}: {key}={config_overrides[key]} contradicts the planned layout "
                f"({key}={parallel.get(key, 1)}); set it in the teacher's parallel sizes instead"
            )


def window_settings(desc: ModelDescription) -> dict[str, Any]:
    """The sliding window (on every layer, or on Gemma 3's and gpt-oss's sliding layers only) and
    an explicit softmax scale; nothing for a model without them."""
    settings: dict[str, Any] = {}
    if desc.sliding_window:
        settings["window_size"] = (desc.sliding_window - 1, 0)
        if desc.window_layers:  # only these layers slide (megatron: 1 = windowed)
            settings["window_attn_skip_freq"] = [int(w) for w in desc.window_layers]
    if desc.softmax_scale is not None:
        settings["softmax_scale"] = desc.softmax_scale
    return settings


def sink_and_glu_settings(desc: ModelDescription) -> dict[str, Any]:
    """gpt-oss: attention sinks (a learnt offset per head in each softmax's denominator) and the GLU
    ``act(clamp(gate)) · (clamp(up) + glu_linear_offset)``; nothing for the other families."""
    settings: dict[str, Any] = {}
    if desc.attention_sinks:
        settings["softmax_type"] = "learnable"
    if desc.glu_linear_offset:
        settings["glu_linear_offset"] = desc.glu_linear_offset
    if desc.activation_clamp is not None:
        settings["activation_func_clamp_value"] = desc.activation_clamp
    return settings


def set_yarn(config: Any, scaling: Mapping[str, Any]) -> None:
    """YaRN's fields on ``config``: megatron-core's ``GPTModel`` reads them (``yarn_*``) from its config
    by name and its attention scales cos/sin by the attention factor they give, but megatron-core 0.16's
    ``TransformerConfig`` declares none of them (Megatron-Bridge's providers add them the same way).
    transformers' attention factor is ``0.1·ln(factor) + 1`` unless both ``mscale`` and
    ``mscale_all_dim`` are set (their ratio): megatron-core's rule with both None, or both given;
    ``truncate`` is megatron-core's ``correction_range_round_to_int``."""
    both = bool(scaling.get("mscale")) and bool(scaling.get("mscale_all_dim"))
    config.yarn_rotary_scaling_factor = float(scaling["factor"])
    config.yarn_original_max_position_embeddings = int(scaling["original_max_position_embeddings"])
    config.yarn_beta_fast = float(scaling.get("beta_fast") or 32.0)
    config.yarn_beta_slow = float(scaling.get("beta_slow") or 1.0)
    config.yarn_mscale = float(scaling["mscale"]) if both else None
    config.yarn_mscale_all_dim = float(scaling["mscale_all_dim"]) if both else None
    config.yarn_correction_range_round_to_int = bool(scaling.get("truncate", True))


def mla_settings(desc: ModelDescription) -> dict[str, Any]:
    """Multi-latent attention (DeepSeek-V3): ``MLATransformerConfig``'s fields. Its query and key/value
    latent norms are the spec's q/k layernorms (``qk_layernorm``); RoPE on ``qk_pos_emb_head_dim``
    of each head, YaRN with DeepSeek's ``mscale``/``mscale_all_dim`` (the softmax scale follows from
    them: megatron-core's MLA computes it as transformers does) or the plain RoPE."""
    yarn = desc.rope_scaling if (desc.rope_scaling or {}).get("rope_type") == "yarn" else None
    settings: dict[str, Any] = dict(
        multi_latent_attention=True,
        q_lora_rank=desc.q_lora_rank or None,
        kv_lora_rank=desc.kv_lora_rank,
        qk_head_dim=desc.qk_nope_head_dim,
        qk_pos_emb_head_dim=desc.qk_rope_head_dim,
        v_head_dim=desc.v_head_dim,
        qk_layernorm=True,
        rotary_base=desc.rotary_base,
        rope_type="yarn" if yarn else "rope",
        rotary_scaling_factor=1.0,  # YaRN's factor; 1: the softmax scale is 1/sqrt(q head dim)
    )
    if yarn:
        settings.update(rotary_scaling_factor=float(yarn["factor"]),
                        original_max_position_embeddings=int(yarn["original_max_position_embeddings"]),
                        beta_fast=float(yarn["beta_fast"]), beta_slow=float(yarn["beta_slow"]),
                        mscale=float(yarn["mscale"]), mscale_all_dim=float(yarn["mscale_all_dim"]))
    return settings


def hybrid_settings(desc: ModelDescription) -> dict[str, Any]:
    """The Mamba-2 part of a hybrid model's config. Without CUDA the mixer takes the path that runs
    the conv and the scan separately (``use_mamba_mem_eff_path=False``; the fused one needs
    ``causal-conv1d`` and ``mamba-ssm`` on CUDA)."""
    import torch

    return dict(is_hybrid_model=True, mamba_num_heads=desc.mamba_num_heads, mamba_head_dim=desc.mamba_head_dim,
                mamba_num_groups=desc.mamba_num_groups, mamba_state_dim=desc.mamba_state_dim,
                use_mamba_mem_eff_path=torch.cuda.is_available())


def moe_dispatcher(parallel: Mapping[str, int], requested: str | None) -> str:
    """The token dispatcher: on CUDA the recipe's (default ``alltoall``); on CPU/gloo
    ``alltoall`` (with the CPU shims), or ``allgather`` where expert-TP exceeds attention-TP
    (gloo cannot all-gather tensors of different sizes, which ``alltoall`` would need there)."""
    import torch

    if torch.cuda.is_available():
        return requested or "alltoall"
    tp = int(parallel.get("tensor_model_parallel_size", 1))
    etp = int(parallel.get("expert_tensor_parallel_size", 1))
    chosen = "allgather" if etp > tp else "alltoall"
    if chosen == "allgather":
        logger.info("expert-TP%d > TP%d on CPU/gloo: allgather token dispatcher", etp, tp)
    if requested not in (None, chosen):
        logger.info("moe_token_dispatcher_type=%r needs CUDA; using %r on CPU/gloo", requested, chosen)
    return chosen


# What an inference teacher's routing must be, whatever the recipe trained with: dropless (no
# capacity, no padding to it), the router's own top-k weights (no scaling), no sinkhorn (it changes
# routing even in eval), no losses, no jitter.
MOE_INFERENCE: dict[str, Any] = {
    "moe_expert_capacity_factor": None,
    "moe_pad_expert_input_to_capacity": False,
    "moe_router_topk_scaling_factor": None,
    "moe_router_load_balancing_type": "none",
    "moe_aux_loss_coeff": 0.0,
    "moe_z_loss_coeff": None,
    "moe_input_jitter_eps": None,
}


def moe_settings(desc: ModelDescription, parallel: Mapping[str, int], overrides: Mapping[str, Any],
                 where: str = "megatron_cfg_overrides") -> dict[str, Any]:
    """The MoE part of the TransformerConfig: the experts and routing of the checkpoint (an
    override may repeat them, not contradict them), the inference settings (forced, logged when an
    override differs) and the dispatcher for this device."""
    import torch

    from_checkpoint: dict[str, Any] = {
        "num_moe_experts": desc.num_experts,
        "moe_router_topk": desc.moe_topk,
        "moe_ffn_hidden_size": desc.moe_ffn_hidden_size,
        # HF norm_topk_prob: top-k of the logits, softmax over those k (renormalised); without it,
        # softmax over all experts first, the top-k probabilities as they are
        "moe_router_pre_softmax": not desc.norm_topk_prob,
        "moe_layer_freq": [int(m) for m in desc.moe_layers],
        # Qwen2-MoE: sigmoid(x · gateᵀ) · shared_expert(x) added to the routed output (Megatron's
        # SharedExpertMLP with its gate computes exactly that)
        "moe_shared_expert_intermediate_size": desc.moe_shared_ffn_hidden_size or None,
        "moe_shared_expert_gate": desc.moe_shared_expert_gate,
        # Nemotron-H, GLM-4.5: sigmoid scores, top-k picked with the checkpoint's per-expert bias
        "moe_router_score_function": desc.moe_score_function,
        "moe_router_enable_expert_bias": desc.moe_expert_bias,
        "moe_latent_size": desc.moe_latent_size or None,
        # GLM-4.5: top-k among the best groups of experts (each scored by its top 2 = topk / group_topk)
        "moe_router_num_groups": desc.moe_router_num_groups or None,
        "moe_router_group_topk": desc.moe_router_group_topk or None,
    }
    for key, value in from_checkpoint.items():
        if key in overrides and overrides[key] != value:
            raise ValueError(f"{where}: {key}={overrides[key]!r} contradicts the checkpoint ({desc.architecture}: "
                             f"{key}={value!r}); remove it")
    forced = dict(MOE_INFERENCE)
    if not te_available():
        forced.update(moe_grouped_gemm=False, moe_router_fusion=False, moe_permute_fusion=False)
    if desc.moe_shared_ffn_hidden_size and (desc.moe_latent_size or not torch.cuda.is_available()):
        # it runs the shared expert on a CUDA stream; megatron refuses it with latent projections
        forced["moe_shared_expert_overlap"] = False
    # the top-k weights' scale is the checkpoint's (routed_scaling_factor of Nemotron-H and GLM-4.5;
    # None elsewhere)
    forced["moe_router_topk_scaling_factor"] = desc.moe_routed_scaling_factor
    if desc.moe_expert_bias:
        forced["moe_router_dtype"] = "fp32"  # as HF's router: the bias-shifted choice in fp32
    for key, value in forced.items():
        if key in overrides and overrides[key] != value:
            logger.info("%s: %s=%r is a training setting; an inference teacher uses %r", where, key, overrides[key],
                        value)
    dispatcher = moe_dispatcher(parallel, overrides.get("moe_token_dispatcher_type"))
    return {**from_checkpoint, **forced, "moe_token_dispatcher_type": dispatcher}
