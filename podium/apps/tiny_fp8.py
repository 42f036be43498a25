"""A tiny checkpoint in DeepSeek-V3's block-scaled fp8 on-disk format, and its dequantized copy.

``make_fp8_checkpoint(source, path, dequantized)`` quantizes a tiny checkpoint
(:mod:`.tiny_models`) as DeepSeek-V3 ships its weights: each linear weight of the layers as float8
e4m3 with a float32 ``<name>_scale_inv`` per block (``weight ≈ q · scale_inv`` block by block, the
last row/column blocks partial), the config's ``quantization_config`` saying so; and writes the same
model dequantized (plain float32, no ``quantization_config``) for the HF oracle, which cannot read
fp8 on CPU. ``dequantize_fp8_blocks`` is the formula a reader must match.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

FP8_MAX = 448.0  # the largest float8 e4m3 value


def _quantizable(name: str, tensor: torch.Tensor) -> bool:
    """What DeepSeek-V3 ships in fp8: the layers' linear weights (not norms, not the router)."""
    return (name.startswith("model.layers.") and name.endswith(".weight") and tensor.dim() == 2
            and "norm" not in name and not name.endswith("mlp.gate.weight"))


def quantize_fp8_blocks(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` as DeepSeek-V3 stores it: float8 e4m3 values and a float32 ``scale_inv`` per
    ``block`` (the last row/column blocks partial), ``weight ≈ q · scale_inv`` block by block."""
    br, bc = block
    rows, cols = weight.shape
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = torch.zeros(nr * br, nc * bc, dtype=torch.float32)
    padded[:rows, :cols] = weight.float()
    blocks = padded.reshape(nr, br, nc, bc)
    scale_inv = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)
    q = (blocks / scale_inv[:, None, :, None]).reshape(nr * br, nc * bc)[:rows, :cols].to(torch.float8_e4m3fn)
    return q, scale_inv


def dequantize_fp8_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The dequantization formula: ``q[i, j] · scale_inv[i // br, j // bc]`` in float32."""
    rows, cols = q.shape
    scale = scale_inv.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)[:rows, :cols]
    return q.float() * scale


def make_fp8_checkpoint(source: str | os.PathLike[str], path: str | os.PathLike[str],
                        dequantized: str | os.PathLike[str], block: tuple[int, int] = (32, 32)) -> Path:
    """Write ``source`` (a tiny checkpoint) in DeepSeek-V3's on-disk fp8 format to ``path``: each
    quantizable weight (:func:`_quantizable`) as float8 e4m3 plus ``<name>_scale_inv``, the config's
    ``quantization_config`` saying so; and the same model dequantized (plain float32, no
    ``quantization_config``) to ``dequantized``, for the oracle. Returns ``path``."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    source, path, dequantized = Path(source), Path(path), Path(dequantized)
    tensors = load_file(str(source / "model.safetensors"))
    quantized: dict[str, torch.Tensor] = {}
    plain: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if _quantizable(name, tensor):
            q, scale_inv = quantize_fp8_blocks(tensor, block)
            quantized[name], quantized[name + "_scale_inv"] = q, scale_inv
            plain[name] = dequantize_fp8_blocks(q, scale_inv, block)
        else:
            quantized[name] = plain[name] = tensor
    config = json.loads((source / "config.json").read_text())
    for where, weights, conf in (
        (path, quantized, {**config, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                             "activation_scheme": "dynamic",
                                                             "weight_block_size": list(block)}}),
        (dequantized, plain, config),
    ):
        where.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(where / "model.safetensors"), metadata={"format": "pt"})
        (where / "config.json").write_text(json.dumps(conf, indent=2))
        if (source / "generation_config.json").is_file():
            shutil.copy(source / "generation_config.json", where / "generation_config.json")
    return path
