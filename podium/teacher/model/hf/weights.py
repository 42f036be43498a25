"""HF tensors into a Megatron-core model, each rank reading only its slices.

This module owns ``load_hf_weights``: for every parameter the rank's model holds, the HF tensor(s)
it comes from and the rank's slice of them (the family's map, :data:`.registry.WEIGHT_MAPS`; the
slice arithmetic, :mod:`.slices`), checked against the parameter's shape and copied into it. No
rank reads a full tensor it only holds part of, nothing is written next to the checkpoint. Block-scaled
fp8 weights (DeepSeek-V3's ``quantization_config``) are dequantized slice by slice as they are read
(:class:`.safetensors_io.SafetensorsCheckpoint`).
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING, Any

from podium.config.quantization import fp8_block_size
from podium.teacher.model.hf.description import ModelDescription
from podium.teacher.model.hf.registry import WEIGHT_MAPS
from podium.teacher.model.hf.safetensors_io import SafetensorsCheckpoint
from podium.teacher.model.hf.slices import RankLayout, SliceReader

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

# TransformerEngine spec names -> local spec names (the maps speak local-spec names).
_TE_TO_LOCAL = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
    "mixer.in_proj.layer_norm_weight": "norm.weight",  # a Mamba layer's pre-norm (hybrid TE spec)
}

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# Buffers that hold checkpoint values (Nemotron-H's expert bias; fp32 whatever the parameters' dtype).
_CHECKPOINT_BUFFERS = ("router.expert_bias",)


def _global_layer_numbers(model: Any) -> dict[int, int]:
    """Local decoder layer index -> global 0-based layer index (PP stages hold a range)."""
    return {i: int(layer.layer_number) - 1 for i, layer in enumerate(model.decoder.layers)}


def _targets(model: Any) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of the model and the buffers that hold checkpoint values."""
    return list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if b is not None and n.endswith(_CHECKPOINT_BUFFERS)]


_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def mtp_tensors(ckpt: SafetensorsCheckpoint, desc: ModelDescription) -> list[str]:
    """The checkpoint's multi-token-prediction tensors, which a teacher never reads: Nemotron-H's
    ``mtp.*``, DeepSeek-V3's and GLM-4.5's layers past ``num_hidden_layers`` (``model.layers.{L}.*``)."""
    def is_mtp(name: str) -> bool:
        match = _HF_LAYER_RE.match(name)
        return name.startswith("mtp.") or (match is not None and int(match.group(1)) >= desc.num_layers)

    return [name for name in ckpt.names() if is_mtp(name)]


def _log_skipped(ckpt: SafetensorsCheckpoint, desc: ModelDescription, where: str | os.PathLike[str]) -> None:
    skipped = mtp_tensors(ckpt, desc)
    if skipped:
        logger.info("%s: %d multi-token-prediction tensors (mtp.*, layers past num_hidden_layers) not loaded: a "
                    "teacher does not use them", where, len(skipped))


def _source(reader: SliceReader, name: str, layers: dict[int, int],
            where: str | os.PathLike[str]) -> torch.Tensor | None:
    """The rank's tensor for Megatron parameter ``name`` (None: the family's map does not know it)."""
    layer: int | None = None
    local = name
    match = _LAYER_RE.match(name)
    if match:
        layer = layers[int(match.group(1))]
        local = _TE_TO_LOCAL.get(match.group(2), match.group(2))
    try:
        return WEIGHT_MAPS[reader.desc.family](reader, layer, local)
    except KeyError as exc:
        raise ValueError(f"checkpoint {where}: tensor {exc.args[0]!r} is missing") from None


def _check(tensor: torch.Tensor | None, param: torch.Tensor, name: str, reader: SliceReader,
           where: str | os.PathLike[str]) -> torch.Tensor | None:
    """``tensor`` to copy into ``param``, or None for a bias the HF model does not have (zeros);
    ``ValueError`` for a parameter the map does not know, an empty slice or a shape that differs."""
    desc, lay = reader.desc, reader.lay
    if tensor is None:
        raise ValueError(f"checkpoint {where}: no HF source for Megatron parameter {name!r} "
                         f"({desc.architecture} map)")
    if tensor.numel() == 0:
        if not name.endswith(".bias"):  # a slice that selected nothing: never load it as zeros
            raise ValueError(f"checkpoint {where}: the {desc.architecture} map selected no rows for Megatron "
                             f"parameter {name!r} (TP rank {lay.tp_rank}/{lay.tp_size})")
        return None
    if tuple(tensor.shape) != tuple(param.shape):
        raise ValueError(f"checkpoint {where}: tensor for Megatron parameter {name!r} has shape "
                         f"{tuple(tensor.shape)}, expected {tuple(param.shape)} (TP rank {lay.tp_rank}/"
                         f"{lay.tp_size})")
    return tensor


def load_hf_weights(
    model: Any,
    checkpoint: str | os.PathLike[str],
    desc: ModelDescription,
    layout: RankLayout,
) -> dict[str, Any]:
    """Fill every parameter of this rank's ``model`` from the HF checkpoint; return load stats.

    Raises ``ValueError`` naming the checkpoint and the key for a missing tensor, a shape that does
    not match, or a Megatron parameter the map does not know.
    """
    import torch

    ckpt = SafetensorsCheckpoint(checkpoint, fp8_block=fp8_block_size(desc.hf_config))
    reader = SliceReader(ckpt, desc, layout)
    layers = _global_layer_numbers(model)
    loaded = 0
    _log_skipped(ckpt, desc, checkpoint)
    with torch.no_grad():
        for name, param in _targets(model):
            tensor = _check(_source(reader, name, layers, checkpoint), param, name, reader, checkpoint)
            if tensor is None:
                param.zero_()  # a bias the HF model does not have
                continue
            param.copy_(tensor)
            loaded += 1
    stats = {"parameters": loaded, "bytes_read": ckpt.bytes_read}
    ckpt.close()
    logger.info("loaded %d parameters (%.1f MB read) from %s", loaded, ckpt.bytes_read / 2**20, checkpoint)
    return stats
