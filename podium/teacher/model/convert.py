"""``podium convert``: write a Megatron ``torch_dist`` checkpoint from an HF directory.

This module owns :func:`convert_hf_to_torch_dist`. It starts ``TP × PP`` local processes (spawn;
for an MoE model with expert parallelism, ``PP × lcm(TP, EP × ETP)``: the fewest the layout rule of
:mod:`podium.config.layout` accepts), each builds its model stage and reads only its slices of the
HF safetensors and only its own experts (the same map as a direct HF load, so no process holds the
whole model unless TP = PP = EP = 1), and all of them save together with ``dist_checkpointing``.
The result is written into a temp directory next to the destination and renamed into place only
when complete, so a concurrent reader sees either nothing or the whole checkpoint, and two
concurrent converters cannot interleave their files.

The output directory holds the ``torch_dist`` files plus the HF ``config.json`` (the architecture,
needed to load it), the generation config and tokenizer files when present, and
``podium_convert.json`` (source, layout, precision, podium version). A ``torch_dist`` checkpoint
loads at any TP/PP layout, and an MoE one at any EP/expert-TP too (resharding: each expert is
saved under its global index, whichever EP rank wrote it).

Like every entry point that saves with ``dist_checkpointing``, the calling program must guard its
main code with ``if __name__ == "__main__":`` (spawned processes re-import ``__main__``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podium.config.layout import SHORT_NAMES, ParallelLayout
from podium.rendezvous.atomic import fsync_dir

if TYPE_CHECKING:  # pragma: no cover
    from podium.teacher.model.hf import ModelDescription

logger = logging.getLogger(__name__)

PROVENANCE = "podium_convert.json"
_COPIED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)


def _convert_rank(
    rank: int,
    world_size: int,
    rendezvous: str,
    src: str,
    out_dir: str,
    parallel: dict[str, int],
    precision: str,
    overrides: dict[str, Any],
) -> None:
    """One spawned rank: parallel state, model stage from HF slices, collective save."""
    import torch

    from podium.teacher.cpu.cuda_shims import apply_cuda_shims
    from podium.teacher.model.checkpoint_loader import build_and_load
    from podium.teacher.model.parallel import destroy_parallel, init_parallel
    from podium.teacher.model.torch_dist import save_torch_dist

    apply_cuda_shims()
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    init_parallel(rank, world_size, rendezvous, parallel)
    try:
        loaded = build_and_load(src, parallel, precision, overrides, where="convert megatron_cfg_overrides")
        if loaded.checkpoint.kind != "hf":
            raise ValueError(f"checkpoint {src}: convert reads HF directories, this is {loaded.checkpoint.kind}")
        save_torch_dist(loaded.model, out_dir)
    finally:
        destroy_parallel()


@dataclass(frozen=True)
class _Plan:
    """What a conversion writes: the HF source, its description, the saved precision and layout,
    and how many processes write it."""

    source: Path
    desc: ModelDescription
    precision: str
    parallel: dict[str, int]
    world: int


def convert_hf_to_torch_dist(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    etp: int = 1,
    precision: str | None = None,
    megatron_cfg_overrides: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert the HF checkpoint ``src`` into a ``torch_dist`` checkpoint at ``dst``; return ``dst``.

    ``tp``/``pp``: tensor/pipeline-parallel sizes of the writing layout, i.e. ``tp × pp`` local
    processes share the work (the saved checkpoint loads at any layout); ``ep``/``etp``: expert
    parallel and expert-TP sizes of the writing layout for an MoE model (each process then reads
    only its own experts; ``PP × lcm(TP, EP × ETP)`` processes). ``precision``: ``fp32``/``bf16``/``fp16``
    of the saved tensors (default: the HF config's dtype, else bf16). ``dst`` must not exist unless ``overwrite``; the
    result appears there atomically (temp dir + rename).
    """
    plan = _plan(src, tp, pp, ep, etp, precision)
    dst = _destination(dst, overwrite)
    tmp = dst.parent / f".{dst.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    started = time.perf_counter()
    try:
        _write_ranks(plan, tmp, dict(megatron_cfg_overrides or {}))
        _write_companions(plan, tmp, started)
        fsync_dir(tmp, files=True)
        _publish(tmp, dst, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("converted %s -> %s (%s, saved at %s) in %.1fs", src, dst, plan.precision,
                " ".join(f"{SHORT_NAMES[k]}{v}" for k, v in plan.parallel.items()), time.perf_counter() - started)
    return dst


def _plan(src: str | os.PathLike[str], tp: int, pp: int, ep: int, etp: int, precision: str | None) -> _Plan:
    """The source checked (an HF directory of a known architecture), the precision, and the writing
    layout checked against the architecture, all before any process starts."""
    from podium.config.precision import from_hf_config, normalise_precision
    from podium.teacher.model.checkpoint_loader import describe_checkpoint, resolve_checkpoint
    from podium.teacher.model.megatron_config import check_model_layout

    resolved = resolve_checkpoint(src)
    if resolved.kind != "hf":
        raise ValueError(f"checkpoint {src}: not an HF directory (it is {resolved.kind}); nothing to convert")
    desc = describe_checkpoint(resolved)  # unknown architectures fail here, before any process starts
    try:
        precision = normalise_precision(precision) if precision else from_hf_config(desc.hf_config)
    except ValueError as exc:
        raise ValueError(f"convert: --precision {exc}") from None
    if min(int(tp), int(pp), int(ep), int(etp)) < 1:
        raise ValueError(f"convert: tp ({tp}), pp ({pp}), ep ({ep}) and etp ({etp}) must be ≥ 1")
    parallel = {"tensor_model_parallel_size": int(tp), "pipeline_model_parallel_size": int(pp)}
    if desc.is_moe or int(ep) > 1 or int(etp) > 1:
        parallel.update(expert_model_parallel_size=int(ep), expert_tensor_parallel_size=int(etp))
    check_model_layout(desc, parallel, where=f"convert {src}: ")
    # the fewest processes that hold the layout (config.layout's rule): TP·PP, or more ranks of
    # attention data parallelism where EP·ETP needs them
    world = ParallelLayout.on_fewest_workers(parallel).world_size
    return _Plan(source=resolved.path, desc=desc, precision=precision, parallel=parallel, world=world)


def _destination(dst: str | os.PathLike[str], overwrite: bool) -> Path:
    """``dst`` as an absolute path, its parent created; ``ValueError`` if it exists without ``overwrite``."""
    dst = Path(dst).expanduser().absolute()
    if dst.exists() and not overwrite:
        raise ValueError(f"convert: destination {dst} exists (pass overwrite=True, or --overwrite, to replace it)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    return dst


def _write_ranks(plan: _Plan, out: Path, overrides: dict[str, Any]) -> None:
    """Start the plan's processes (spawn), which build their model stages and save them into ``out``."""
    import torch.multiprocessing as mp

    rendezvous_dir = tempfile.mkdtemp(prefix="podium-convert-")
    try:
        mp.start_processes(
            _convert_rank,
            args=(plan.world, f"file://{rendezvous_dir}/store", str(plan.source), str(out), plan.parallel,
                  plan.precision, overrides),
            nprocs=plan.world,
            join=True,
            start_method="spawn",
        )
    finally:
        shutil.rmtree(rendezvous_dir, ignore_errors=True)


def _write_companions(plan: _Plan, out: Path, started: float) -> None:
    """The HF config, generation config and tokenizer files beside the tensors, and the provenance."""
    from podium import __version__

    for name in _COPIED_FILES:
        if (plan.source / name).is_file():
            shutil.copy2(plan.source / name, out / name)
    provenance = {
        "source": str(plan.source),
        "architecture": plan.desc.architecture,
        "vocab_size": plan.desc.vocab_size,
        "precision": plan.precision,
        "saved_layout": plan.parallel,
        "podium_version": __version__,
        "created_unix": time.time(),
        "seconds": round(time.perf_counter() - started, 3),
    }
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")


def _publish(tmp: Path, dst: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``dst`` (replacing an old ``dst`` only when ``overwrite``)."""
    old = None
    if dst.exists():
        if not overwrite:
            raise ValueError(f"convert: destination {dst} appeared while converting (another convert?)")
        old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:12]}"
        os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except OSError as exc:
        if old is not None:
            os.rename(old, dst)
        raise ValueError(f"convert: could not move the result into {dst}: {exc}") from exc
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
