"""Megatron ``torch_dist`` checkpoints: detection, loading with resharding, saving.

This module owns podium's use of ``megatron.core.dist_checkpointing``:

- which directory is a ``torch_dist`` checkpoint is decided in :mod:`podium.config.checkpoints`
  (``metadata.json`` with ``sharded_backend: torch_dist``, or a run directory's latest iteration);
- :func:`checkpoint_padded_vocab`: the global (padded) vocabulary size stored in the checkpoint,
  so the model is built with the same global shapes whatever the new TP is;
- :func:`load_torch_dist`: every rank asks for its own shards of the model's sharded state dict;
  ``dist_checkpointing`` reads them from whatever layout the checkpoint was saved at (resharding
  between TP/PP layouts);
- :func:`save_torch_dist`: write the model's sharded state dict (callers write into a temp dir and
  rename, see ``podium.teacher.model.convert``). Saving starts a spawn-context multiprocessing manager
  that re-imports ``__main__``: entry points that save need an ``if __name__ == "__main__":`` guard.

The architecture of a ``torch_dist`` checkpoint comes from an HF ``config.json`` stored with it
(``podium convert`` copies it), or one level up, or from an explicit ``hf_config`` path.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

EMBEDDING_KEY = "embedding.word_embeddings.weight"


def find_hf_config(dist_dir: Path, hf_config: str | os.PathLike[str] | None = None) -> Path:
    """The ``config.json`` describing a torch_dist checkpoint's architecture."""
    candidates = [Path(hf_config)] if hf_config else [dist_dir / "config.json", dist_dir.parent / "config.json"]
    for cand in candidates:
        if cand.is_dir():
            cand = cand / "config.json"
        if cand.is_file():
            return cand
    raise ValueError(
        f"checkpoint {dist_dir}: torch_dist checkpoint without an HF config.json (looked at "
        f"{', '.join(str(c) for c in candidates)}); pass hf_config=<path to config.json>"
    )


def checkpoint_padded_vocab(dist_dir: str | os.PathLike[str]) -> int:
    """Global (padded) vocabulary rows of the checkpoint's embedding."""
    from megatron.core import dist_checkpointing

    meta = dist_checkpointing.load_tensors_metadata(str(dist_dir))
    if EMBEDDING_KEY not in meta:
        raise ValueError(f"checkpoint {dist_dir}: tensor {EMBEDDING_KEY!r} is missing")
    return int(meta[EMBEDDING_KEY].global_shape[0])


def _without_extra_state(sharded: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sharded.items() if not k.endswith("_extra_state")}


def load_torch_dist(model: Any, dist_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Load this rank's shards into ``model`` (any TP/PP layout); return stats.

    Raises ``ValueError`` naming the checkpoint and the keys when the checkpoint lacks tensors the
    model needs, or shapes differ.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    sharded = _without_extra_state(model.sharded_state_dict())
    try:
        state = dist_checkpointing.load(sharded, str(dist_dir), strict=StrictHandling.RAISE_UNEXPECTED)
    except Exception as exc:  # megatron raises CheckpointingException / KeyError / RuntimeError
        raise ValueError(f"checkpoint {dist_dir}: torch_dist load failed: {exc}") from exc
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing:
        raise ValueError(f"checkpoint {dist_dir}: no value for model key(s) {missing[:8]}")
    logger.info("loaded %d tensors from torch_dist checkpoint %s", len(state), dist_dir)
    return {"parameters": len(state)}


def save_torch_dist(model: Any, dist_dir: str | os.PathLike[str]) -> None:
    """Save ``model`` (all ranks call this) into the empty directory ``dist_dir``."""
    from megatron.core import dist_checkpointing

    Path(dist_dir).mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(_without_extra_state(model.sharded_state_dict()), str(dist_dir))
