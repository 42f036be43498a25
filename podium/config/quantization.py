"""Quantized HF checkpoints: which ones podium reads, read from ``config.json``'s ``quantization_config``.

This module owns the rule (no torch: ``plan`` applies it on the login node, the worker's describer
again): podium reads unquantized weights,

- block-scaled fp8 as DeepSeek-V3 and Kimi K2 ship it, any family (``quant_method: fp8``,
  ``weight_block_size: [br, bc]``, ``fmt: e4m3``, ``activation_scheme: dynamic``; each quantized
  ``X.weight`` float8 e4m3 beside a float32 ``X.weight_scale_inv`` of ``[ceil(rows / br),
  ceil(cols / bc)]``), dequantized as each rank reads its slices
  (:class:`podium.teacher.model.hf.safetensors_io.SafetensorsCheckpoint`);
- the formats of :data:`READABLE_QUANTIZATION`, for their family only (gpt-oss's MXFP4 experts:
  :mod:`podium.teacher.model.hf.mxfp4`);

and refuses any other quantization, naming its ``quant_method`` (:func:`quantization_problems`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The one quantized format podium reads (DeepSeek-V3's, Kimi K2's): float8 e4m3 weights, each with
# a float32 ``weight_scale_inv`` per block of weight_block_size rows × columns, dequantized as read.
FP8 = "fp8"
MXFP4 = "mxfp4"
# model_type -> the quant_methods podium dequantizes as it reads, for that family alone
READABLE_QUANTIZATION: dict[str, tuple[str, ...]] = {"gpt_oss": (MXFP4,)}


def quant_method(config: Mapping[str, Any]) -> str | None:
    """The checkpoint's ``quantization_config.quant_method`` (None: not quantized)."""
    quant = config.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, Mapping):
        return str(quant)
    return str(quant.get("quant_method") or "unknown")


def fp8_block_size(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """The (rows, columns) of a block-scaled fp8 checkpoint's scale blocks, or None (not fp8)."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping) or quant.get("quant_method") != FP8:
        return None
    block = quant.get("weight_block_size")
    if (isinstance(block, (list, tuple)) and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        return int(block[0]), int(block[1])
    return None


def quantization_problems(config: Mapping[str, Any]) -> list[str]:
    """Why podium cannot read a quantized checkpoint's weights (nothing for an unquantized one, or
    for DeepSeek's block-scaled fp8: see :data:`FP8`)."""
    method = quant_method(config)
    if method is None or method in READABLE_QUANTIZATION.get(str(config.get("model_type")), ()):
        return []
    if method != FP8:
        return [f"quantization_config.quant_method={method!r}: podium reads unquantized weights, block-scaled fp8 "
                f"({FP8!r} with weight_block_size, as DeepSeek-V3 ships) and gpt-oss's {MXFP4!r} experts only; "
                "serve a dequantized (bf16/fp32) copy"]
    quant = config["quantization_config"]
    problems = []
    if fp8_block_size(config) is None:
        problems.append(f"quantization_config.weight_block_size={quant.get('weight_block_size')!r}: podium reads "
                        "fp8 weights scaled per block (a [rows, columns] block size, weight_scale_inv per block); "
                        "per-tensor or per-channel scales are not read")
    if (fmt := quant.get("fmt", "e4m3")) != "e4m3":
        problems.append(f"quantization_config.fmt={fmt!r}: podium reads float8 e4m3 weights only")
    if (scheme := quant.get("activation_scheme", "dynamic")) != "dynamic":
        problems.append(f"quantization_config.activation_scheme={scheme!r}: podium dequantizes the weights and "
                        "computes in the teacher's precision; static activation scales are not applied")
    return problems
