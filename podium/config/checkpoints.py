"""Checkpoint names: normalising them for deduplication, and recognising their format.

A teacher's checkpoint is written in a recipe either as a local path or as a Hugging Face hub id
(`Qwen/Qwen3-1.7B`). Local paths are normalised (``~``, relative to the recipe's directory, trailing
``/``, symlinks) so two spellings of one directory dedup to one teacher. A hub id stays as written;
it is resolved from the local HF cache when the model is loaded, never here.

==============  ================================================================================
format          what is on disk
==============  ================================================================================
``hf``          ``config.json`` + ``model.safetensors`` (or ``model.safetensors.index.json``)
``torch_dist``  Megatron dist_checkpointing: ``metadata.json`` with ``sharded_backend:
                torch_dist``, directly or in the ``iter_*`` named by
                ``latest_checkpointed_iteration.txt``
==============  ================================================================================

Both the planner (before anything is submitted) and the worker (on the allocation) decide with
:func:`find_checkpoint`, so a checkpoint ``plan`` accepts is one the worker can load.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from podium.config.architecture import architecture_needs, experts_of, layout_problems
from podium.config.layout import ParallelLayout

CheckpointFormat = Literal["hf", "torch_dist"]

# The HF architectures podium loads (``config.json`` ``architectures``), by the family of name
# maps that reads them (``podium.teacher.model.hf``): the one list, checked at plan time.
ARCHITECTURE_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "llama",  # + routed experts (mlp.gate, mlp.experts.E.*_proj)
    "Qwen2MoeForCausalLM": "llama",  # + routed experts as Qwen3-MoE, a gated mlp.shared_expert, q/k/v bias
    "MixtralForCausalLM": "llama",  # + routed experts (block_sparse_moe.gate, .experts.E.w1/w3/w2)
    "GPT2LMHeadModel": "gpt2",
    "NemotronHForCausalLM": "nemotron_h",  # hybrid Mamba-2 / attention / (latent) MoE layers
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(ARCHITECTURE_FAMILIES)

HF_CONFIG = "config.json"
SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
METADATA = "metadata.json"
LATEST = "latest_checkpointed_iteration.txt"

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


class CheckpointError(ValueError):
    """A local checkpoint directory podium cannot load; the message names the path and why."""


@dataclass(frozen=True)
class LocalCheckpoint:
    """A local checkpoint podium can load: its format and the directory holding its tensors."""

    kind: CheckpointFormat
    path: Path  # the HF dir, or the torch_dist dir (the ``iter_*`` one when a run dir was given)


def find_checkpoint(path: str | Path) -> LocalCheckpoint:
    """The checkpoint ``path`` designates (see the module table); :class:`CheckpointError` if none.

    The one rule for what podium loads: the planner checks a recipe's checkpoints with it before
    anything is submitted, and the worker resolves the same directory with it on the allocation.
    """
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"checkpoint {root} does not exist")
    if not root.is_dir():
        raise CheckpointError(f"checkpoint {root} is not a directory")
    dist = torch_dist_dir(root)
    if dist is not None:
        return LocalCheckpoint("torch_dist", dist)
    if (root / HF_CONFIG).is_file() and ((root / SAFE_SINGLE).is_file() or (root / SAFE_INDEX).is_file()):
        return LocalCheckpoint("hf", root)
    raise CheckpointError(
        f"checkpoint {root} is neither an HF directory ({HF_CONFIG} + {SAFE_SINGLE} or {SAFE_INDEX}) "
        f"nor a Megatron torch_dist checkpoint ({METADATA}, or {LATEST} naming an iteration)"
    )


def detect_format(path: str | Path) -> CheckpointFormat | None:
    """The format of a local checkpoint directory, or None if podium cannot load it."""
    try:
        return find_checkpoint(path).kind
    except CheckpointError:
        return None


def checkpoint_problem(path: str | Path, layout: ParallelLayout | None = None) -> str | None:
    """Why podium cannot load the local checkpoint ``path`` (its format, its architecture, or a
    ``layout`` that cannot split it: :func:`podium.config.architecture.layout_problems`), or None
    when it can."""
    try:
        found = find_checkpoint(path)
    except CheckpointError as exc:
        return str(exc)
    if found.kind != "hf":
        return None
    try:
        config = json.loads((found.path / HF_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        return f"checkpoint {found.path}: unreadable {HF_CONFIG}: {exc}"
    archs = list(config.get("architectures") or [])
    if not any(a in ARCHITECTURE_FAMILIES for a in archs):
        return (f"checkpoint {found.path}: architecture {', '.join(archs) or config.get('model_type')!r} is not "
                f"supported (podium loads {', '.join(SUPPORTED_ARCHITECTURES)}); convert it to a Megatron "
                "torch_dist checkpoint with megatron-bridge, or serve another checkpoint")
    layout = layout or ParallelLayout()
    ep = layout.expert_model_parallel_size
    if ep > 1 and not experts_of(config):
        return (f"checkpoint {found.path}: expert_model_parallel_size={ep} but {', '.join(archs)} has no routed "
                "experts; set it to 1")
    problems = layout_problems(config, layout)
    return f"checkpoint {found.path}: {'; '.join(problems)}" if problems else None


def checkpoint_needs(path: str | Path, layout: ParallelLayout) -> list[str]:
    """What the local HF checkpoint ``path`` needs at ``layout``
    (:func:`podium.config.architecture.architecture_needs`); nothing where its config is not
    readable here (a hub id, a checkpoint only the compute nodes see, a torch_dist directory)."""
    try:
        config = json.loads((find_checkpoint(path).path / HF_CONFIG).read_text())
    except (CheckpointError, OSError, ValueError):
        return []
    return architecture_needs(config, layout) if isinstance(config, dict) else []


def torch_dist_dir(root: Path) -> Path | None:
    """The directory holding a torch_dist checkpoint's metadata (itself or its latest iteration).

    ``CheckpointError`` when ``latest_checkpointed_iteration.txt`` names an iteration that is not
    a torch_dist checkpoint (a half-written run directory should not pass as "no checkpoint").
    """
    if _is_torch_dist(root):
        return root
    tracker = root / LATEST
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    sub = root / (f"iter_{int(text):07d}" if text.isdigit() else text)
    if not _is_torch_dist(sub):
        raise CheckpointError(f"checkpoint {root}: {LATEST} names {text!r} but {sub} is not a torch_dist checkpoint")
    return sub


def _is_torch_dist(path: Path) -> bool:
    meta = path / METADATA
    if not meta.is_file():
        return False
    try:
        return json.loads(meta.read_text()).get("sharded_backend") == "torch_dist"
    except (OSError, ValueError, AttributeError):
        return False
