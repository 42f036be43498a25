"""What podium replaces inside megatron-core to make an inference forward on the local spec faster.

This module owns the patches applied to megatron-core for speed, not for correctness: each one is
exact where it applies and hands anything else to Megatron's own code. ``megatron_model`` installs
them when it builds a model on the local spec (no TransformerEngine: CPU, or a GPU without TE); the
TE path keeps TE's fused kernels. The CPU-only shims that megatron-core needs to run at all are
another matter: they live in ``cuda_shims``, applied by the worker and by ``convert``.

``fast_rotary`` (:func:`install_fast_rotary`)
    Megatron's unfused RoPE recomputes cos/sin for every layer and concatenates halves: ~10% of a
    forward on CPU. Replaced module-wide, once per process.
``lean_swiglu`` (:func:`install_lean_swiglu`)
    Megatron's unfused SwiGLU adds ``glu_linear_offset`` (0.0) to a full-size tensor and keeps one
    more temporary. Replaced per MLP instance.

Measured on two CPU cores (4 × 512 Llama, 32k vocab, 8 × 512 tokens, fp32): SDPA attention (the
local spec's core attention, ``megatron_model``), these two and the chunked head in ``logprobs``
brought the non-matmul time of a forward from ~1.25 s to the level of HF transformers'.
"""

from __future__ import annotations

from typing import Any

_ROTARY_PATCH_ATTR = "__podium_fast_rotary__"


def install_fast_rotary() -> None:
    """Faster unfused RoPE for the local spec (inference): cos/sin once per frequency tensor, no cats.

    Megatron's unfused ``apply_rotary_pos_emb`` recomputes ``cos``/``sin`` of the frequencies for
    every layer, negates and concatenates halves (``rotate_half``) and concatenates an empty
    pass-through part: ~60 ms per call for 8 × 512 tokens × 8 heads on two CPU cores, about 10% of a
    forward. This version computes ``t·cos`` and adds the rotated halves in place with ``addcmul_``
    (same numbers to ~5e-7). It is used only where it is exact: no fusion, no packed sequences,
    no interleaving, no MLA, ``mscale == 1``, rotary dim == head dim, no autograd; anything else
    goes to Megatron's function. Installed once per process by ``megatron_model.build_gpt_model``
    when the local spec is used; the TE path keeps TE's fused RoPE.
    """
    import megatron.core.transformer.attention as attention_module
    import torch

    original = attention_module.apply_rotary_pos_emb
    if getattr(original, _ROTARY_PATCH_ATTR, False):
        return
    cache: dict[str, Any] = {"freqs": None}

    def apply_rotary_pos_emb(t: Any, freqs: Any, config: Any, cu_seqlens: Any = None, mscale: float = 1.0,
                             cp_group: Any = None) -> Any:
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
