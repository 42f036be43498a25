"""Megatron-core GPTModel for a teacher: its TransformerConfig, layer spec and construction.

This module owns the translation from (HF architecture description, planned ``TeacherSpec``,
``megatron_cfg_overrides``) to a Megatron ``TransformerConfig`` and an inference-only ``GPTModel``:

- the parallel layout (TP/PP/CP/EP/ETP) goes into the config as well as into ``parallel_state``
  (layers per pipeline stage come from the config; without it every stage builds all layers);
- ``megatron_cfg_overrides`` are applied to the config; keys that are neither ``TransformerConfig``
  fields nor known NeMo RL training-only keys are an error listing them (they are never ignored
  silently); known training-only keys are logged and skipped;
- the TransformerEngine layer spec when TE is importable on a CUDA machine, the local spec
  otherwise, with the core attention replaced by :class:`SDPACoreAttention` (PyTorch's
  ``scaled_dot_product_attention``: causal, GQA, optional sliding window) and a lean SwiGLU
  forward on its MLPs (:func:`install_lean_swiglu`);
- the padded vocabulary size (a multiple of ``make_vocab_size_divisible_by × TP``);
- :func:`install_fast_rotary`: the one function podium replaces inside megatron-core (the unfused
  RoPE used by the local spec; inference only, exact where applied).

Measured on two CPU cores (4 × 512 Llama, 32k vocab, 8 × 512 tokens, fp32): SDPA attention,
the RoPE and SwiGLU changes and the chunked head in ``logprobs`` brought the non-matmul time of a
forward from ~1.25 s to the level of HF transformers'.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import math
from typing import TYPE_CHECKING, Any, Mapping

from podium.config.layout import PARALLEL_SIZES
from podium.config.precision import torch_dtype
from podium.teacher.hf_checkpoint import ModelDescription

if TYPE_CHECKING:  # pragma: no cover
    from megatron.core.transformer.transformer_config import TransformerConfig

logger = logging.getLogger(__name__)

DEFAULT_VOCAB_DIVISOR = 128

# Keys of a NeMo RL ``megatron_cfg`` that matter only for training (or are handled elsewhere):
# skipped with a log line, not an error.
TRAINING_ONLY_KEYS: frozenset[str] = frozenset(
    {
        "enabled",
        "empty_unused_memory_level",
        "activation_checkpointing",
        "converter_type",
        "optimizer",
        "scheduler",
        "distributed_data_parallel_config",
        "train_iters",
        "freeze_moe_router",
        "moe_router_load_balancing_type",  # inference routing is forced (see moe_settings)
        "moe_router_bias_update_rate",
        "moe_permute_fusion",
        "apply_rope_fusion",
        "defer_fp32_logits",
        "env_vars",
        "sequence_parallel",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "pipeline_dtype",
        "bias_activation_fusion",
        "force_overwrite_initial_ckpt",
        "fp8_cfg",
    }
)
# Keys podium uses itself (not TransformerConfig fields).
MODEL_KEYS: frozenset[str] = frozenset({"make_vocab_size_divisible_by"})
def te_available() -> bool:
    """TransformerEngine is used only when it is importable and CUDA is present."""
    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = DEFAULT_VOCAB_DIVISOR) -> int:
    multiple = max(1, divisible_by) * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def split_overrides(overrides: Mapping[str, Any], where: str = "megatron_cfg_overrides") -> tuple[dict[str, Any], dict[str, Any]]:
    """(TransformerConfig overrides, podium model options); unknown keys raise ``ValueError``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    config_overrides: dict[str, Any] = {}
    model_options: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in dict(overrides or {}).items():
        if key in MODEL_KEYS:
            model_options[key] = value
        elif key in TRAINING_ONLY_KEYS:
            logger.info("%s: %r is training-only; not used by an inference teacher", where, key)
        elif key in fields:
            config_overrides[key] = value
        else:
            unknown.append(key)
    if unknown:
        close = sorted(f for f in fields if any(u.split("_")[0] in f for u in unknown))[:12]
        raise ValueError(
            f"{where}: unknown key(s) {sorted(unknown)}: not TransformerConfig fields nor known "
            f"training-only keys{'; similar fields: ' + ', '.join(close) if close else ''}"
        )
    return config_overrides, model_options


def check_model_layout(desc: ModelDescription, parallel: Mapping[str, int], where: str = "") -> None:
    """``ValueError`` when the parallel layout cannot split this architecture (no megatron import)."""
    tp = int(parallel.get("tensor_model_parallel_size", 1))
    pp = int(parallel.get("pipeline_model_parallel_size", 1))
    cp = int(parallel.get("context_parallel_size", 1))
    who = f"{where}{desc.architecture}"
    if desc.num_query_groups % tp or desc.num_attention_heads % tp:
        raise ValueError(
            f"{who}: TP{tp} must divide the attention heads ({desc.num_attention_heads}) "
            f"and the KV groups ({desc.num_query_groups})"
        )
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
    if desc.activation == "gelu_tanh":
        return functools.partial(F.gelu, approximate="tanh"), False
    return F.gelu, False


def build_transformer_config(
    desc: ModelDescription,
    parallel: Mapping[str, int],
    precision: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    use_cpu_initialization: bool | None = None,
    where: str = "megatron_cfg_overrides",
) -> "TransformerConfig":
    """The inference ``TransformerConfig`` of a teacher (parallel sizes included, see module doc)."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    config_overrides, _ = split_overrides(overrides or {}, where)
    # Parallel sizes come from the spec; an override may repeat them but not contradict them.
    for key in PARALLEL_SIZES:
        if key in config_overrides and int(config_overrides[key]) != int(parallel.get(key, 1)):
            raise ValueError(
                f"{where}: {key}={config_overrides[key]} contradicts the planned layout "
                f"({key}={parallel.get(key, 1)}); set it in the teacher's parallel sizes instead"
            )
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
    if desc.sliding_window:
        kwargs["window_size"] = (desc.sliding_window - 1, 0)
    kwargs.update(config_overrides)
    if desc.is_moe:
        kwargs.update(moe_settings(desc, parallel, config_overrides, where))
    try:
        return TransformerConfig(**kwargs)
    except (AssertionError, ValueError, TypeError) as exc:
        raise ValueError(f"{desc.architecture}: invalid Megatron TransformerConfig ({exc})") from exc


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
        "moe_router_score_function": "softmax",
        "moe_layer_freq": [int(m) for m in desc.moe_layers],
        # Qwen2-MoE: sigmoid(x · gateᵀ) · shared_expert(x) added to the routed output (Megatron's
        # SharedExpertMLP with its gate computes exactly that)
        "moe_shared_expert_intermediate_size": desc.moe_shared_ffn_hidden_size or None,
        "moe_shared_expert_gate": desc.moe_shared_expert_gate,
    }
    for key, value in from_checkpoint.items():
        if key in overrides and overrides[key] != value:
            raise ValueError(f"{where}: {key}={overrides[key]!r} contradicts the checkpoint ({desc.architecture}: "
                             f"{key}={value!r}); remove it")
    forced = dict(MOE_INFERENCE)
    if not te_available():
        forced.update(moe_grouped_gemm=False, moe_router_fusion=False, moe_permute_fusion=False)
    if desc.moe_shared_ffn_hidden_size and not torch.cuda.is_available():
        forced["moe_shared_expert_overlap"] = False  # it runs the shared expert on a CUDA stream
    for key, value in forced.items():
        if key in overrides and overrides[key] != value:
            logger.info("%s: %s=%r is a training setting; an inference teacher uses %r", where, key, overrides[key], value)
    dispatcher = moe_dispatcher(parallel, overrides.get("moe_token_dispatcher_type"))
    return {**from_checkpoint, **forced, "moe_token_dispatcher_type": dispatcher}


# ----------------------------------------------------------------------------------------------
# Core attention on torch SDPA
# ----------------------------------------------------------------------------------------------


def _sdpa_core_attention_cls() -> type:
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule

    gqa_native = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")

    class SDPACoreAttention(MegatronModule):
        """Megatron core attention on ``torch.nn.functional.scaled_dot_product_attention``.

        Inputs ``query [sq, b, np, hn]``, ``key/value [sk, b, ng, hn]`` (this rank's heads),
        output ``[sq, b, np·hn]``. Causal when no mask is given (right padding keeps valid
        positions exact); GQA without repeating K/V where torch supports it; sliding window from
        ``config.window_size`` (left, 0). Inference only (no dropout).
        """

        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str,
            attention_dropout: float | None = None,
            softmax_scale: float | None = None,
            cp_comm_type: str | None = None,
            pg_collection: Any = None,
        ) -> None:
            super().__init__(config=config)
            if config.context_parallel_size > 1:
                raise ValueError("context parallelism needs TransformerEngine's attention (CP > 1 on the local spec)")
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
            self.window = config.window_size

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: Any = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            if packed_seq_params is not None or attention_bias is not None:
                raise NotImplementedError("SDPACoreAttention: packed sequences / attention bias")
            sq, b, nq, hn = query.shape
            # Views only: the kernel takes strided inputs and writes its output in the query's
            # layout, so the result below is already [s, b, h·d] in memory (copying to a [b, s]
            # layout first cost more than it saved in the kernel).
            q = query.permute(1, 2, 0, 3)
            k = key.permute(1, 2, 0, 3)
            v = value.permute(1, 2, 0, 3)
            groups = k.shape[1]
            kwargs: dict[str, Any] = {}
            if groups != nq:
                if gqa_native:
                    kwargs["enable_gqa"] = True
                else:
                    k = k.repeat_interleave(nq // groups, dim=1)
                    v = v.repeat_interleave(nq // groups, dim=1)
            mask = None
            causal = True
            sk = k.shape[2]
            if attention_mask is not None:
                mask = ~attention_mask.to(torch.bool)  # Megatron: True = masked out
                causal = False
            elif self.window is not None and self.window[0] is not None and self.window[0] >= 0 and sk > self.window[0] + 1:
                i = torch.arange(sq, device=q.device)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                mask = (j <= i) & (i - j <= self.window[0])
                causal = False
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.softmax_scale, **kwargs
            )
            return out.permute(2, 0, 1, 3).reshape(sq, b, nq * hn)

    return SDPACoreAttention


_ROTARY_PATCH_ATTR = "__podium_fast_rotary__"


def install_fast_rotary() -> None:
    """Faster unfused RoPE for the local spec (inference): cos/sin once per frequency tensor, no cats.

    Megatron's unfused ``apply_rotary_pos_emb`` recomputes ``cos``/``sin`` of the frequencies for
    every layer, negates and concatenates halves (``rotate_half``) and concatenates an empty
    pass-through part: ~60 ms per call for 8 × 512 tokens × 8 heads on two CPU cores, about 10% of a
    forward. This version computes ``t·cos`` and adds the rotated halves in place with ``addcmul_``
    (same numbers to ~5e-7). It is used only where it is exact: no fusion, no packed sequences,
    no interleaving, no MLA, ``mscale == 1``, rotary dim == head dim, no autograd; anything else
    goes to Megatron's function. Installed once per process by :func:`build_gpt_model` when the
    local spec is used; the TE path keeps TE's fused RoPE.
    """
    import torch
    import megatron.core.transformer.attention as attention_module

    original = attention_module.apply_rotary_pos_emb
    if getattr(original, _ROTARY_PATCH_ATTR, False):
        return
    cache: dict[str, Any] = {"freqs": None}

    def apply_rotary_pos_emb(t: Any, freqs: Any, config: Any, cu_seqlens: Any = None, mscale: float = 1.0, cp_group: Any = None) -> Any:
        dim = t.shape[-1]
        if (
            cu_seqlens is not None
            or config.apply_rope_fusion
            or config.rotary_interleaved
            or config.multi_latent_attention
            or mscale != 1.0
            or freqs.shape[-1] != dim
            or dim % 2
            or torch.is_grad_enabled()
        ):
            return original(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale, cp_group=cp_group)
        if cache["freqs"] is not freqs or cache["dtype"] != t.dtype:
            cache.update(freqs=freqs, dtype=t.dtype, cos=torch.cos(freqs).to(t.dtype), sin=torch.sin(freqs).to(t.dtype))
        cos, sin = cache["cos"], cache["sin"]
        half = dim // 2
        out = t * cos
        out[..., :half].addcmul_(t[..., half:], sin[..., :half], value=-1)
        out[..., half:].addcmul_(t[..., :half], sin[..., half:])
        return out

    setattr(apply_rotary_pos_emb, _ROTARY_PATCH_ATTR, True)
    attention_module.apply_rotary_pos_emb = apply_rotary_pos_emb


def _lean_swiglu_forward(mlp: Any, hidden_states: Any, per_token_scale: Any = None, **kwargs: Any) -> Any:
    """Megatron's MLP forward with a leaner SwiGLU for inference (see :func:`install_lean_swiglu`)."""
    import torch
    import torch.nn.functional as F

    cfg = mlp.config
    if (
        per_token_scale is not None
        or torch.is_grad_enabled()
        or not cfg.gated_linear_unit
        or mlp.activation_func is not F.silu
        or cfg.bias_activation_fusion
        or cfg.use_te_activation_func
        or cfg.activation_func_clamp_value is not None
        or cfg.glu_linear_offset != 0.0
    ):
        return type(mlp).forward(mlp, hidden_states, per_token_scale=per_token_scale, **kwargs)
    intermediate, bias = mlp.linear_fc1(hidden_states)
    if bias is not None:
        intermediate = intermediate + bias
    gate, up = torch.chunk(intermediate, 2, dim=-1)
    activated = F.silu(gate)
    activated.mul_(up)
    return mlp.linear_fc2(activated)


def install_lean_swiglu(model: Any) -> int:
    """Give each local-spec MLP of ``model`` the lean SwiGLU forward; return how many.

    Megatron's unfused gated path computes ``silu(gate) * (up + glu_linear_offset)``: an extra
    full-size add of 0.0 and one more temporary. Here ``silu(gate)`` is multiplied by ``up`` in
    place (same numbers). The instance's ``forward`` is replaced (the module class and its
    construction stay Megatron's); anything other than plain SwiGLU inference falls back to it.
    """
    import types

    from megatron.core.transformer.mlp import MLP

    count = 0
    for module in model.modules():
        if type(module) is MLP:
            module.forward = types.MethodType(_lean_swiglu_forward, module)
            count += 1
    return count


def layer_spec(desc: ModelDescription, use_te: bool, config: "TransformerConfig | None" = None) -> Any:
    """TE spec (GPU with TransformerEngine) or the local spec with SDPA core attention; for an
    MoE model the decoder block's per-layer specs (dense and MoE layers as ``moe_layer_freq``
    says; local experts as ``SequentialMLP``)."""
    from megatron.core.models.gpt import gpt_layer_specs as specs

    if desc.is_moe:
        if config is None:
            raise ValueError(f"{desc.architecture}: an MoE layer spec needs the TransformerConfig")
        block = specs.get_gpt_decoder_block_spec(config, use_transformer_engine=use_te,
                                                 normalization=desc.normalization)
        if not use_te:
            for spec in block.layer_specs:
                spec.submodules.self_attention.submodules.core_attention = _sdpa_core_attention_cls()
        return block
    if use_te:
        return specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=desc.qk_norm)
    spec = specs.get_gpt_layer_local_spec(qk_layernorm=desc.qk_norm, normalization=desc.normalization)
    spec.submodules.self_attention.submodules.core_attention = _sdpa_core_attention_cls()
    return spec


def build_gpt_model(
    desc: ModelDescription,
    config: "TransformerConfig",
    padded_vocab: int,
    *,
    use_te: bool | None = None,
) -> Any:
    """This rank's ``GPTModel`` stage (pre/post process from ``parallel_state``), in eval mode."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    if use_te is None:
        use_te = te_available()
    if not use_te and desc.position_embedding_type == "rope":
        install_fast_rotary()
    kwargs: dict[str, Any] = {}
    if desc.position_embedding_type == "rope":
        kwargs.update(rotary_base=desc.rotary_base, rotary_percent=1.0)
        scaling = desc.rope_scaling or {}
        if scaling.get("rope_type") == "llama3":
            kwargs.update(rope_scaling=True, rope_scaling_factor=float(scaling["factor"]))
        elif scaling.get("rope_type") == "linear":
            kwargs.update(seq_len_interpolation_factor=float(scaling["factor"]))
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(desc, use_te, config),
        vocab_size=padded_vocab,
        max_sequence_length=desc.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=desc.tied_embeddings,
        position_embedding_type=desc.position_embedding_type,
        **kwargs,
    )
    if not use_te:
        install_lean_swiglu(model)
    if torch.cuda.is_available():
        model = model.cuda(torch.cuda.current_device())
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model
