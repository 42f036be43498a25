"""Checkpoint names: normalising them for deduplication, and recognising their format.

A teacher's checkpoint is written in a recipe either as a local path or as a Hugging Face hub id
(`Qwen/Qwen3-1.7B`). Local paths are normalised (``~``, relative to the recipe's directory, trailing
``/``, symlinks) so two spellings of one directory dedup to one teacher. A hub id stays as written;
it is resolved from the local HF cache when the model is loaded, never here.

| format       | what is on disk                                                          |
|--------------|--------------------------------------------------------------------------|
| ``hf``       | ``config.json`` + ``*.safetensors`` (or ``model.safetensors.index.json``) |
| ``torch_dist`` | Megatron dist_checkpointing: ``metadata.json`` with ``sharded_backend: torch_dist``, directly or in the ``iter_*`` named by ``latest_checkpointed_iteration.txt`` |
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CheckpointFormat = Literal["hf", "torch_dist"]

# `org/name` with the characters the hub allows; anything else is a path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class CheckpointRef:
    name: str  # normalised path, or the hub id as written
    is_local: bool

    @property
    def exists(self) -> bool:
        return self.is_local and Path(self.name).exists()


def normalise_checkpoint(raw: str, base_dir: Path) -> CheckpointRef:
    """Normalise a checkpoint as written in a recipe (``base_dir``: the recipe's directory)."""
    text = raw.strip()
    explicit_path = text.startswith(("/", "~", "./", "../")) or text in (".", "..")
    candidate = (base_dir / Path(text).expanduser()) if not explicit_path else Path(text).expanduser()
    if not candidate.is_absolute():
        candidate = base_dir / candidate
    if not explicit_path and _HUB_ID.match(text.rstrip("/")) and not candidate.exists():
        return CheckpointRef(text.rstrip("/"), is_local=False)
    # realpath resolves symlinks of the parts that exist and drops a trailing '/'.
    return CheckpointRef(os.path.realpath(candidate), is_local=True)


def detect_format(path: str | Path) -> CheckpointFormat | None:
    """The checkpoint format of a local directory, or None if it is neither format."""
    root = Path(path)
    if not root.is_dir():
        return None
    if (root / "config.json").is_file() and (
        any(root.glob("*.safetensors")) or (root / "model.safetensors.index.json").is_file()
    ):
        return "hf"
    if torch_dist_dir(root) is not None:
        return "torch_dist"
    return None


def torch_dist_dir(root: Path) -> Path | None:
    """The directory holding a torch_dist checkpoint's metadata (itself or its latest iteration)."""
    if _is_torch_dist(root):
        return root
    tracker = root / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        text = tracker.read_text().strip()
        sub = root / ("release" if text == "release" else f"iter_{int(text):07d}") if text else None
        if sub is not None and _is_torch_dist(sub):
            return sub
    return None


def _is_torch_dist(path: Path) -> bool:
    meta = path / "metadata.json"
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("sharded_backend") == "torch_dist"
    except (OSError, ValueError, AttributeError):
        return False
