"""The tensors of an HF checkpoint directory, read lazily, a slice at a time.

This module owns :class:`SafetensorsCheckpoint`: the tensors of a directory (``model.safetensors``
or a sharded ``model.safetensors.index.json``), opened lazily with ``safe_open``; ``read`` reads
only the requested rows/columns from disk and counts the bytes it read.

Block-scaled fp8 (DeepSeek-V3's ``quantization_config``: ``quant_method: fp8``,
``weight_block_size: [br, bc]``): a weight ``X.weight`` stored as float8 e4m3 beside a float32
``X.weight_scale_inv`` of ``[ceil(rows / br), ceil(cols / bc)]`` is read dequantized,
``X[i, j] · scale_inv[i // br, j // bc]`` in float32: only the requested rows/columns of the weight
and the scale blocks covering them are read, so no rank ever holds more than its slice of one tensor
(never the model) in fp32 before it is copied into its parameter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.config.checkpoints import SAFE_INDEX, SAFE_SINGLE

SCALE_INV = "_scale_inv"  # a block-scaled fp8 weight's scales: ``X.weight`` + this

if TYPE_CHECKING:  # pragma: no cover
    import torch


class SafetensorsCheckpoint:
    """The tensors of an HF checkpoint directory, read lazily (single file or sharded index)."""

    def __init__(self, path: str | os.PathLike[str], fp8_block: tuple[int, int] | None = None) -> None:
        self.path = Path(path)
        self.fp8_block = fp8_block  # block-scaled fp8 weights are dequantized as read (module doc)
        index = self.path / SAFE_INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"checkpoint {self.path}: {SAFE_INDEX} has no weight_map")
            self._files = {name: self.path / fname for name, fname in weight_map.items()}
        elif (self.path / SAFE_SINGLE).is_file():
            from safetensors import safe_open

            single = self.path / SAFE_SINGLE
            with safe_open(str(single), framework="pt") as handle:
                self._files = dict.fromkeys(handle.keys(), single)
        else:
            raise ValueError(f"checkpoint {self.path}: neither {SAFE_SINGLE} nor {SAFE_INDEX} found")
        self._handles: dict[Path, Any] = {}
        self.bytes_read = 0

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def names(self) -> list[str]:
        return list(self._files)

    def _handle(self, name: str) -> Any:
        if name not in self._files:
            raise KeyError(name)
        file = self._files[name]
        handle = self._handles.get(file)
        if handle is None:
            from safetensors import safe_open

            if not file.is_file():
                raise ValueError(f"checkpoint {self.path}: shard {file.name} (for tensor {name!r}) is missing")
            handle = safe_open(str(file), framework="pt")
            self._handles[file] = handle
        return handle

    def _slice(self, name: str) -> Any:
        try:
            return self._handle(name).get_slice(name)
        except KeyError:
            raise ValueError(f"checkpoint {self.path}: tensor {name!r} is missing") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        """Read ``name[rows, cols]`` (only those bytes are read from disk); a block-scaled fp8 weight
        dequantized (module doc)."""
        if self.fp8_block is not None and name + SCALE_INV in self._files:
            return self._read_fp8(name, rows, cols)
        sl = self._slice(name)
        shape = sl.get_shape()
        if cols is not None:
            tensor = sl[rows or slice(None), cols]
        elif rows is not None:
            tensor = sl[rows]
        else:
            tensor = sl[:] if len(shape) > 0 else sl[()]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def _read_fp8(self, name: str, rows: slice | None, cols: slice | None) -> torch.Tensor:
        """``name[rows, cols]`` dequantized with the scale blocks that cover it (module doc)."""
        assert self.fp8_block is not None
        sl = self._slice(name)
        shape = tuple(sl.get_shape())
        if len(shape) != 2:
            raise ValueError(f"checkpoint {self.path}: fp8 tensor {name!r} has shape {shape}; block scales need 2-D")
        br, bc = self.fp8_block
        expected = (-(-shape[0] // br), -(-shape[1] // bc))
        scale_sl = self._slice(name + SCALE_INV)
        if tuple(scale_sl.get_shape()) != expected:
            raise ValueError(f"checkpoint {self.path}: {name + SCALE_INV!r} has shape {tuple(scale_sl.get_shape())}, "
                             f"expected {expected} for {name!r} {shape} in {br}×{bc} blocks")
        r0, r1, _ = (rows or slice(None)).indices(shape[0])
        c0, c1, _ = (cols or slice(None)).indices(shape[1])
        weight = sl[r0:r1, c0:c1]
        scale = scale_sl[r0 // br: -(-r1 // br), c0 // bc: -(-c1 // bc)]
        self.bytes_read += weight.numel() * weight.element_size() + scale.numel() * scale.element_size()
        scale = scale.float().repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)
        scale = scale[r0 - (r0 // br) * br:, c0 - (c0 // bc) * bc:][: r1 - r0, : c1 - c0]
        return weight.float() * scale

    def read_at(self, name: str, *index: int | slice) -> torch.Tensor:
        """Read ``name[index]`` for any number of leading dimensions (a fused expert tensor's
        ``[e, :, cols]``; only those bytes are read from disk)."""
        tensor = self._slice(name)[index]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        self._handles.clear()
