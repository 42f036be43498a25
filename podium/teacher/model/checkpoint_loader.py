"""Which checkpoint a teacher names, and this rank's model built and filled from it.

This module owns the decision HF-directory vs ``torch_dist`` and the sequence
"describe architecture → TransformerConfig → GPTModel stage (hybrid: MambaModel) → weights" for one
rank, used by the Ray worker and by ``convert``. ``parallel_state`` must already be initialised.

Checkpoint forms accepted by :func:`resolve_checkpoint`: a local directory in a format of
:mod:`podium.config.checkpoints` (HF, or ``torch_dist`` whose architecture comes from a
``config.json`` stored with it), or an HF hub id (``org/name``) already in the local HF cache: the
snapshot the plan pinned (``TeacherSpec.revision``), found by the planner's own rule
(:func:`podium.config.checkpoints.checkpoint_dir`); nothing is downloaded.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.config.checkpoints import HF_CONFIG, CheckpointError, checkpoint_dir, find_checkpoint
from podium.teacher.model.hf import ModelDescription, describe_hf_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A checkpoint podium can load: its kind, where its tensors are, where its config is."""

    name: str  # as the teacher names it
    kind: str  # "hf" | "torch_dist"
    path: Path  # the HF dir, or the torch_dist dir (an iter_ dir when a run dir was given)
    config_path: Path


def resolve_checkpoint(name: str | os.PathLike[str], hf_config: str | os.PathLike[str] | None = None,
                       revision: str | None = None) -> ResolvedCheckpoint:
    """The checkpoint a teacher names: a local directory, or a hub id's snapshot in the local HF
    cache (commit ``revision``, the one the plan pinned), found and judged by the planner's rules
    (:func:`podium.config.checkpoints.checkpoint_dir`, :func:`~podium.config.checkpoints.find_checkpoint`).
    A ``ValueError`` naming it and why otherwise (a pinned snapshot gone from the cache: the id,
    the revision, the cache and the command that fetches it)."""
    from podium.teacher.model.torch_dist import find_hf_config

    text = str(name)
    try:
        path = checkpoint_dir(text, revision)
        if not path.exists():
            raise ValueError(f"checkpoint {text}: no such directory")
        found = find_checkpoint(path)
    except CheckpointError as exc:
        raise ValueError(str(exc)) from None
    if path != Path(os.path.expanduser(text)):
        logger.info("checkpoint %s: snapshot %s", text, path)
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


def describe_model(name: str | os.PathLike[str], hf_config: str | os.PathLike[str] | None = None,
                   revision: str | None = None) -> ModelDescription:
    """The architecture of the checkpoint ``name`` (a hub id: its snapshot ``revision``; no torch, no megatron)."""
    return describe_checkpoint(resolve_checkpoint(name, hf_config, revision))


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
    revision: str | None = None,
) -> LoadedModel:
    """Build this rank's GPTModel stage and fill it from ``checkpoint`` (HF slices or torch_dist; a
    hub id: its snapshot ``revision``)."""
    from megatron.core import parallel_state

    from podium.teacher.model import megatron_config, megatron_model
    from podium.teacher.model.hf import RankLayout, load_hf_weights

    started = time.perf_counter()
    resolved = resolve_checkpoint(checkpoint, hf_config, revision)
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
