"""Precision: the one list of precisions podium serves and every spelling it accepts for them.

Recipes (``precision: bfloat16``), NeMo RL configs (``"32"``), HF configs (``torch_dtype:
float32``) and ``podium convert --precision`` all go through :func:`normalise_precision`; the
worker turns the result into a torch dtype with :func:`torch_dtype`. Light: torch is imported only
inside :func:`torch_dtype`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:  # pragma: no cover
    import torch

Precision = Literal["bf16", "fp16", "fp32"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
DEFAULT_PRECISION: Precision = "bf16"

# Other spellings -> podium's name (NeMo RL, HF `torch_dtype`, PyTorch Lightning's "32"/"16").
_ALIASES: Mapping[str, Precision] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "32": "fp32",
}
_TORCH_NAMES: Mapping[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def normalise_precision(value: Any) -> Precision:
    """podium's name for ``value`` (``ValueError`` listing the accepted names otherwise)."""
    text = str(value).strip().lower().removeprefix("torch.")
    name = _ALIASES.get(text, text)
    if name not in PRECISIONS:
        raise ValueError(f"must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return name  # type: ignore[return-value]


def from_hf_config(config: Mapping[str, Any], default: Precision = DEFAULT_PRECISION) -> Precision:
    """The precision an HF ``config.json`` stores its weights in (``torch_dtype``/``dtype``)."""
    raw: Any | None = config.get("torch_dtype") or config.get("dtype")
    if raw is None:
        return default
    try:
        return normalise_precision(raw)
    except ValueError:
        return default


def torch_dtype(precision: str) -> torch.dtype:
    import torch

    return getattr(torch, _TORCH_NAMES[normalise_precision(precision)])
