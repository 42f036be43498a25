"""Which checkpoint a teacher names, and this rank's model built and filled from it.

This module owns the decision HF-directory vs ``torch_dist`` and the sequence
"describe architecture → TransformerConfig → GPTModel stage (hybrid: MambaModel) → weights" for one
rank, used by the Ray worker and by ``convert``. ``parallel_state`` must already be initialised.

Checkpoint forms accepted by :func:`resolve_checkpoint`: a local directory in a format of
:mod:`podium.config.checkpoints` (HF, or ``torch_dist`` whose architecture comes from a
``config.json`` stored with it), or an HF hub id (``org/name``) already in the local HF cache
(nothing is downloaded).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.config.checkpoints import HF_CONFIG, CheckpointError, find_checkpoint
from podium.teacher.model.hf import ModelDescription, describe_hf_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A checkpoint podium can load: its kind, where its tensors are, where its config is."""

    name: str  # as the teacher names it
    kind: str  # "hf" | "torch_dist"
    path: Path  # the HF dir, or the torch_dist dir (an iter_ dir when a run dir was given)
    config_path: Path


def _hub_cache_lookup(name: str) -> Path | None:
    if name.count("/") != 1 or name.startswith(("/", ".")):
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not in the cache (or no hub library): not an error here
        return None


def resolve_checkpoint(name: str | os.PathLike[str],
                       hf_config: str | os.PathLike[str] | None = None) -> ResolvedCheckpoint:
    """The checkpoint a teacher names: a local directory (decided by
    :func:`podium.config.checkpoints.find_checkpoint`, the rule the planner uses) or a hub id
    already in the local HF cache."""
    from podium.teacher.model.torch_dist import find_hf_config

    text = str(name)
    path = Path(os.path.expanduser(text))
    if not path.exists():
        cached = _hub_cache_lookup(text)
        if cached is None:
            raise ValueError(
                f"checkpoint {text}: no such directory (and not an HF hub id in the local cache; "
                "podium does not download weights)"
            )
        path = cached
    try:
        found = find_checkpoint(path)
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None
    if found.kind == "torch_dist":
        return ResolvedCheckpoint(text, "torch_dist", found.path, find_hf_config(found.path, hf_config))
    return ResolvedCheckpoint(text, "hf", found.path, Path(hf_config) if hf_config else found.path / HF_CONFIG)


def describe_checkpoint(resolved: ResolvedCheckpoint) -> ModelDescription:
    import json

    try:
        config = json.loads(resolved.config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"checkpoint {resolved.name}: cannot read {resolved.config_path} ({exc})") from exc
    return describe_hf_config(config, resolved.name)


def describe_model(name: str | os.PathLike[str], hf_config: str | os.PathLike[str] | None = None) -> ModelDescription:
    """The architecture of the checkpoint ``name`` (no torch, no megatron)."""
    return describe_checkpoint(resolve_checkpoint(name, hf_config))


@dataclass
class LoadedModel:
    """This rank's model stage and what was learnt while loading it."""

    model: Any
    desc: ModelDescription
    checkpoint: ResolvedCheckpoint
    padded_vocab_size: int
    config: Any
    load_seconds: float
    stats: dict[str, Any] = field(default_factory=dict)


def build_and_load(
    checkpoint: str | os.PathLike[str],
    parallel: Mapping[str, int],
    precision: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    hf_config: str | os.PathLike[str] | None = None,
    where: str = "megatron_cfg_overrides",
) -> LoadedModel:
    """Build this rank's GPTModel stage and fill it from ``checkpoint`` (HF slices or torch_dist)."""
    from megatron.core import parallel_state

    from podium.teacher.model import megatron_config, megatron_model
    from podium.teacher.model.hf import RankLayout, load_hf_weights

    started = time.perf_counter()
    resolved = resolve_checkpoint(checkpoint, hf_config)
    desc = describe_checkpoint(resolved)
    _, options = megatron_config.split_overrides(overrides or {}, where)
    tp = int(parallel.get("tensor_model_parallel_size", 1))
    if resolved.kind == "torch_dist":
        from podium.teacher.model.torch_dist import checkpoint_padded_vocab

        padded = checkpoint_padded_vocab(resolved.path)
        if padded % tp:
            raise ValueError(
                f"checkpoint {resolved.name}: its padded vocabulary ({padded} rows) is not divisible by TP{tp}"
            )
        if padded < desc.vocab_size:
            raise ValueError(
                f"checkpoint {resolved.name}: embedding has {padded} rows < vocab_size {desc.vocab_size} in its config"
            )
    else:
        divisor = int(options.get("make_vocab_size_divisible_by", megatron_config.DEFAULT_VOCAB_DIVISOR))
        padded = megatron_config.padded_vocab_size(desc.vocab_size, tp, divisor)
    config = megatron_config.build_transformer_config(desc, parallel, precision, overrides, where=where)
    if desc.is_hybrid:
        from podium.teacher.model.hybrid_model import build_hybrid_model

        model = build_hybrid_model(desc, config, padded)
    else:
        model = megatron_model.build_gpt_model(desc, config, padded)
    if resolved.kind == "torch_dist":
        from podium.teacher.model.torch_dist import load_torch_dist

        stats = load_torch_dist(model, resolved.path)
    else:
        layout = RankLayout(
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            tp_size=tp,
            padded_vocab_size=padded,
            ep_rank=parallel_state.get_expert_model_parallel_rank(),
            ep_size=parallel_state.get_expert_model_parallel_world_size(),
            etp_rank=parallel_state.get_expert_tensor_parallel_rank(),
            etp_size=parallel_state.get_expert_tensor_parallel_world_size(),
        )
        stats = load_hf_weights(model, resolved.path, desc, layout)
    elapsed = time.perf_counter() - started
    return LoadedModel(model, desc, resolved, padded, config, elapsed, stats)
