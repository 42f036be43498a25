"""Megatron-core GPTModel for a teacher: its layer spec and construction.

This module owns the inference-only ``GPTModel`` of one rank (its ``TransformerConfig`` comes from
``megatron_config``):

- the TransformerEngine layer spec when TE is importable on a CUDA machine, the local spec
  otherwise, with the core attention replaced by ``SDPACoreAttention`` (PyTorch's
  ``scaled_dot_product_attention``: causal, GQA, optional sliding window, gpt-oss's attention sinks);
- on the local spec, the inference patches of ``megatron_patches`` (RoPE, SwiGLU);
- Gemma 3's post-norms, local RoPE and embedding scale (:mod:`.gemma3`);
- RoPE base, scaling and rotary share (GLM: half the head) from the architecture, pre/post process
  from ``parallel_state``, eval mode, no gradients.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from podium.teacher.model.hf import ModelDescription
from podium.teacher.model.megatron_config import te_available
from podium.teacher.model.megatron_patches import install_fast_rotary, install_lean_swiglu

if TYPE_CHECKING:  # pragma: no cover
    from megatron.core.transformer.transformer_config import TransformerConfig


def _slides(config: Any, layer_number: int) -> bool:
    """Whether layer ``layer_number`` (1-based) takes the sliding window: megatron-core's rule
    (``is_layer_window_attention``) for ``window_attn_skip_freq`` (None: every layer; an int ``n``:
    all but every ``n``-th; a list: 1 where the layer slides, Gemma 3's)."""
    skip = config.window_attn_skip_freq
    if skip is None:
        return True
    return bool(skip[layer_number - 1]) if isinstance(skip, list) else layer_number % skip != 0


def _softmax_offset(config: Any) -> Any:
    """gpt-oss's attention sinks (``config.softmax_type == "learnable"``): a parameter
    ``softmax_offset`` of this rank's heads, as megatron's ``DotProductAttention`` holds it (TP splits
    it with the heads); None for megatron's plain softmax."""
    import torch

    if config.softmax_type == "vanilla":
        return None
    if config.softmax_type != "learnable":
        raise NotImplementedError(f"SDPACoreAttention: softmax_type={config.softmax_type!r}")
    heads = config.num_attention_heads // config.tensor_model_parallel_size
    return torch.nn.Parameter(torch.zeros(heads, dtype=config.params_dtype))


def _sharded_state_dict(module: Any, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
    """The core attention's ``sharded_state_dict`` (``podium convert``): with sinks, megatron's
    ``DotProductAttention``'s (``softmax_offset`` split over TP along the heads, so a torch_dist
    checkpoint saved at one TP loads at another); megatron's default otherwise."""
    from megatron.core import parallel_state
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    if module.softmax_offset is None:
        return MegatronModule.sharded_state_dict(module, prefix, sharded_offsets, metadata)
    return make_sharded_tensors_for_checkpoint(
        module.state_dict(prefix="", keep_vars=True), prefix, {"softmax_offset": 0}, sharded_offsets,
        tp_group=parallel_state.get_tensor_model_parallel_group(), dp_cp_group=(metadata or {}).get("dp_cp_group"))


def _with_sink(q: Any, k: Any, v: Any, mask: Any, causal: bool, offset: Any) -> tuple[Any, Any, Any, bool]:
    """(K, V, mask, causal) for SDPA with a sink per head: ``exp(offset_h)`` joins each softmax's
    denominator, exactly, as one more key: zero key and value (it takes probability from the real keys
    and adds nothing to the output), its logit the head's offset, the last column of an additive float
    mask ``[1 or b, heads, sq, sk + 1]`` that is -inf where ``mask`` (True: attend) or causality masks."""
    import torch

    sq, sk = q.shape[2], k.shape[2]
    if mask is None:
        i = torch.arange(sq, device=q.device)[:, None]  # causal as SDPA's is_causal: j <= i
        mask = (torch.arange(sk, device=q.device)[None, :] <= i) if causal else torch.ones(
            sq, sk, dtype=torch.bool, device=q.device)
    allowed = mask if mask.dim() == 4 else mask[None, None]
    scores = torch.zeros(allowed.shape[0], q.shape[1], sq, sk + 1, dtype=q.dtype, device=q.device)
    scores[..., :sk].masked_fill_(~allowed, float("-inf"))
    scores[..., sk] = offset.to(q.dtype)[None, :, None]
    zero = torch.zeros_like(k[:, :, :1])
    return torch.cat([k, zero], dim=2), torch.cat([v, zero], dim=2), scores, False


def _sdpa_core_attention_cls() -> type:
    """The ``SDPACoreAttention`` class (defined on first use: megatron is imported lazily)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule

    gqa_native = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")

    class SDPACoreAttention(MegatronModule):
        """Megatron core attention on ``torch.nn.functional.scaled_dot_product_attention``.

        Inputs ``query``/``key [s, b, heads, k_channels]``, ``value [s, b, heads, v_channels]``
        (this rank's heads; MLA's value heads are narrower), output ``[sq, b, np·v_channels]``.
        Causal when no mask is given (right padding keeps valid positions exact); GQA without
        repeating K/V where torch supports it; sliding window from ``config.window_size`` (left, 0)
        on the layers ``config.window_attn_skip_freq`` says slide (all when it is None). Inference
        only (no dropout). gpt-oss's attention sinks (``softmax_type="learnable"``):
        :func:`_softmax_offset`, :func:`_with_sink`.
        """

        def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                     attention_dropout: float | None = None, softmax_scale: float | None = None,
                     k_channels: int | None = None, v_channels: int | None = None,  # MLA's q/k and v head dims
                     cp_comm_type: str | None = None, pg_collection: Any = None) -> None:
            super().__init__(config=config)
            if config.context_parallel_size > 1:
                raise ValueError("context parallelism needs TransformerEngine's attention (CP > 1 on the local spec)")
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
            self.window = config.window_size if _slides(config, layer_number) else None
            self.softmax_offset = _softmax_offset(config)

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
            sq, b, nq, _ = query.shape
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
            elif (self.window is not None and self.window[0] is not None and self.window[0] >= 0
                  and sk > self.window[0] + 1):
                i = torch.arange(sq, device=q.device)[:, None]
                j = torch.arange(sk, device=q.device)[None, :]
                mask = (j <= i) & (i - j <= self.window[0])
                causal = False
            if self.softmax_offset is not None:
                k, v, mask, causal = _with_sink(q, k, v, mask, causal, self.softmax_offset)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.softmax_scale, **kwargs
            )
            return out.permute(2, 0, 1, 3).reshape(sq, b, nq * v.shape[-1])

    SDPACoreAttention.sharded_state_dict = _sharded_state_dict  # megatron saves the sinks split over TP
    return SDPACoreAttention


def layer_spec(desc: ModelDescription, use_te: bool, config: TransformerConfig | None = None) -> Any:
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
        spec = specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=desc.qk_norm)
    else:
        spec = specs.get_gpt_layer_local_spec(qk_layernorm=desc.qk_norm, normalization=desc.normalization)
        spec.submodules.self_attention.submodules.core_attention = _sdpa_core_attention_cls()
    if desc.post_norms:
        from podium.teacher.model.gemma3 import gemma3_layer_spec

        gemma3_layer_spec(spec, desc.local_rotary_base or desc.rotary_base, desc.window_layers, use_te)
    return spec


def build_gpt_model(
    desc: ModelDescription,
    config: TransformerConfig,
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
    if desc.position_embedding_type in ("rope", "yarn"):  # yarn: its fields on the config (set_yarn)
        kwargs.update(rotary_base=desc.rotary_base, rotary_percent=desc.rotary_percent)
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
    if desc.embedding_scale is not None:
        from podium.teacher.model.gemma3 import scale_embeddings

        scale_embeddings(model, desc.embedding_scale)
    if torch.cuda.is_available():
        model = model.cuda(torch.cuda.current_device())
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model
