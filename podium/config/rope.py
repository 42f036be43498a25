"""What a checkpoint's ``config.json`` asks of RoPE: its type, the share of each head it rotates, and
DeepSeek's YaRN as megatron-core's multi-latent attention takes it (no torch: ``plan`` and the
describers read it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def rope_type(config: Mapping[str, Any]) -> str:
    """The RoPE type a config asks for (transformers 5 ``rope_parameters`` or 4.x ``rope_scaling``)."""
    for key in ("rope_scaling", "rope_parameters"):
        params = config.get(key)
        if isinstance(params, Mapping) and (params.get("rope_type") or params.get("type")):
            return str(params.get("rope_type") or params.get("type"))
    return "default"


def partial_rotary_factor(config: Mapping[str, Any], default: float = 1.0) -> float:
    """The share of each head's dimensions RoPE rotates (``partial_rotary_factor``, top level or in
    ``rope_parameters``)."""
    params = config.get("rope_parameters")
    inner = params.get("partial_rotary_factor") if isinstance(params, Mapping) else None
    value = inner if inner is not None else config.get("partial_rotary_factor")
    return float(value) if value is not None else default


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config's RoPE parameters as one mapping (transformers 5 ``rope_parameters`` over 4.x
    ``rope_scaling``), ``rope_type`` filled in."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(config.get(key), Mapping):
            params.update(config[key])
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def deepseek_yarn(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """DeepSeek's YaRN as megatron-core's MLA takes it (None: not YaRN). transformers scales the rotary
    cos/sin by ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` only when both are set, else
    by ``mscale(factor)``, and the softmax by ``mscale(factor, mscale_all_dim)²``; megatron-core always
    takes the ratio: without ``mscale_all_dim`` that is (1, 0) (:func:`_deepseek_problems` refuses
    ``mscale_all_dim`` without ``mscale``)."""
    params = rope_parameters(config)
    if params["rope_type"] != "yarn":
        return None
    original = int(params.get("original_max_position_embeddings") or 4096)
    factor = params.get("factor") or int(config.get("max_position_embeddings") or original) / original
    mscale, all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if not all_dim:
        mscale, all_dim = 1.0, 0.0
    return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": original,
            "beta_fast": float(params.get("beta_fast") or 32), "beta_slow": float(params.get("beta_slow") or 1),
            "mscale": float(mscale or 1.0), "mscale_all_dim": float(all_dim)}


def gpt_oss_rope(config: Mapping[str, Any]) -> dict[str, Any]:
    """gpt-oss's RoPE (``rope_type``, ``rope_theta`` and YaRN's fields): transformers 5's
    ``rope_parameters`` or 4.x's ``rope_scaling`` + ``rope_theta``, over transformers' defaults (YaRN
    ×32 of 4096 positions, base 150000)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if not params:
        params = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                  "original_max_position_embeddings": 4096}
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    params.setdefault("rope_theta", config.get("rope_theta", 150000.0))
    return params
