"""The tensors of an HF checkpoint directory, read lazily, a slice at a time.

This module owns :class:`SafetensorsCheckpoint`: the tensors of a directory (``model.safetensors``
or a sharded ``model.safetensors.index.json``), opened lazily with ``safe_open``; ``read`` reads
only the requested rows/columns from disk and counts the bytes it read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.config.checkpoints import SAFE_INDEX, SAFE_SINGLE

if TYPE_CHECKING:  # pragma: no cover
    import torch


class SafetensorsCheckpoint:
    """The tensors of an HF checkpoint directory, read lazily (single file or sharded index)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
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
        """Read ``name[rows, cols]`` (only those bytes are read from disk)."""
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

    def read_at(self, name: str, *index: int | slice) -> torch.Tensor:
        """Read ``name[index]`` for any number of leading dimensions (a fused expert tensor's
        ``[e, :, cols]``; only those bytes are read from disk)."""
        tensor = self._slice(name)[index]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        self._handles.clear()
