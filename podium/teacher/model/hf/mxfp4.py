"""MXFP4 weights as gpt-oss ships its experts: read, dequantized, one tensor at a time.

This module owns the MXFP4 format (OCP Microscaling FP4, as transformers' ``integrations/mxfp4``
lays it out for ``quantization_config.quant_method == "mxfp4"``):

- ``<name>_blocks`` uint8 ``[..., rows, G, 16]``: 32 FP4 (E2M1) values per block, two per byte, the
  low nibble first (value ``2j`` is byte ``j``'s bits 0-3, value ``2j + 1`` its bits 4-7); a nibble's
  bit 3 is the sign, bits 0-2 index the magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4, 6``;
- ``<name>_scales`` uint8 ``[..., rows, G]``: one E8M0 exponent per block, biased by 127 (the block's
  values are multiplied by ``2^(scale - 127)``);
- a row's ``G·32`` values are its columns; transformers then transposes the last two dimensions
  (gpt-oss's ``gate_up_proj_blocks`` ``[E, 2·ffn, hidden/32, 16]`` is ``gate_up_proj`` ``[E, hidden,
  2·ffn]``): rows of the blocks are output units, as megatron's linear layers want them.

:func:`dequantize_mxfp4` turns blocks and scales into float32 (exact: every MXFP4 value is a float32
and a bfloat16); :func:`quantize_mxfp4` is its inverse on values already on the grid and rounds
others to the nearest grid value (what the tiny MXFP4 checkpoints of the tests are written with).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

BLOCK = 32  # values per scale
SCALE_BIAS = 127
MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1, by the nibble's low 3 bits


def _grid() -> torch.Tensor:
    import torch

    return torch.tensor(MAGNITUDES + tuple(-m for m in MAGNITUDES), dtype=torch.float32)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``[..., rows, G·32]`` from ``blocks`` uint8 ``[..., rows, G, 16]`` and ``scales``
    uint8 ``[..., rows, G]`` (see the module doc)."""
    import torch

    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4: blocks and scales must be uint8 (got {blocks.dtype}, {scales.dtype})")
    if tuple(blocks.shape[:-1]) != tuple(scales.shape) or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4: blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match "
                         f"([..., G, {BLOCK // 2}] and [..., G])")
    grid = _grid()
    values = torch.stack([grid[(blocks & 0x0F).long()], grid[(blocks >> 4).long()]], dim=-1)  # [..., G, 16, 2]
    values = values.reshape(*blocks.shape[:-1], BLOCK)
    values = torch.ldexp(values, scales.to(torch.int32)[..., None] - SCALE_BIAS)
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK)


def quantize_mxfp4(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, scales) of ``values`` ``[..., n]`` (``n`` a multiple of 32): each block's exponent the
    smallest that brings its largest magnitude within 6, each value rounded to the nearest grid value."""
    import torch

    if values.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4: the last dimension ({values.shape[-1]}) must be a multiple of {BLOCK}")
    x = values.float().reshape(*values.shape[:-1], values.shape[-1] // BLOCK, BLOCK)
    peak = x.abs().amax(dim=-1).clamp_min(2.0**-126)
    exponent = torch.ceil(torch.log2(peak / MAGNITUDES[-1])).clamp(-SCALE_BIAS, SCALE_BIAS).to(torch.int32)
    scaled = torch.ldexp(x, -exponent[..., None])
    magnitudes = torch.tensor(MAGNITUDES)
    code = (scaled.abs()[..., None] - magnitudes).abs().argmin(dim=-1)  # nearest magnitude, its index
    code = code + 8 * ((scaled < 0) & (code > 0)).long()
    pairs = code.reshape(*code.shape[:-1], BLOCK // 2, 2).to(torch.uint8)
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks, (exponent + SCALE_BIAS).to(torch.uint8)
