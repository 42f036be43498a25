"""Checkpoint names: normalising them for deduplication, finding where they are, recognising their format.

A teacher's checkpoint is written in a recipe either as a local path or as a Hugging Face hub id
(`Qwen/Qwen3-1.7B`). Local paths are normalised (``~``, relative to the recipe's directory, trailing
``/``, symlinks) so two spellings of one directory dedup to one teacher. A hub id stays as written
(it names the teacher) and is read from the local HF cache, which podium never fills: the cache
the nodes read, ``$HF_HUB_CACHE``, else ``$HF_HOME/hub`` (:func:`hub_cache_dir`, huggingface_hub's
rule), laid out as huggingface_hub writes it::

    <cache>/models--Qwen--Qwen3-1.7B/refs/main              the commit `main` named when it was fetched
    <cache>/models--Qwen--Qwen3-1.7B/snapshots/<commit>/    config.json, *.safetensors

The planner resolves a hub id on the login node (``refs/main`` to its commit: :func:`hub_snapshot`)
and pins that commit in the teacher's spec (``TeacherSpec.revision``); every node, at every
generation, reads exactly that snapshot (:func:`checkpoint_dir`). The layout is read here directly
(a few lines) rather than through huggingface_hub, which a trainer's light install lacks.

==============  ================================================================================
format          what is on disk
==============  ================================================================================
``hf``          ``config.json`` + ``model.safetensors`` (or ``model.safetensors.index.json``)
``torch_dist``  Megatron dist_checkpointing: ``metadata.json`` with ``sharded_backend:
                torch_dist``, directly or in the ``iter_*`` named by
                ``latest_checkpointed_iteration.txt``
==============  ================================================================================

Both the planner (before anything is submitted) and the worker (on the allocation) find the
directory with :func:`checkpoint_dir` and decide with :func:`find_checkpoint`, so a checkpoint
``plan`` accepts is one the worker can load.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
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
    # GLM-4.5/4.6: Llama-style names; sigmoid router with expert bias and groups, shared experts
    "Glm4MoeForCausalLM": "glm4_moe",
    # DeepSeek-V3 and Kimi K2: multi-latent attention with YaRN; GLM-4.5's routing; MTP layers not read
    "DeepseekV3ForCausalLM": "deepseek_v3",
    # Gemma 3 text: per-layer sliding window and RoPE base, post-norms, (1 + w) norms, scaled embedding
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # its language model (language_model.*); images not served
    # gpt-oss: attention sinks, per-layer window, YaRN, biased router and experts (fused, or MXFP4)
    "GptOssForCausalLM": "gpt_oss",
    "GPT2LMHeadModel": "gpt2",
    "NemotronHForCausalLM": "nemotron_h",  # hybrid Mamba-2 / attention / (latent) MoE layers
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(ARCHITECTURE_FAMILIES)

HF_CONFIG = "config.json"
SAFE_SINGLE = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
TORCH_BIN = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # weights podium does not read
METADATA = "metadata.json"
LATEST = "latest_checkpointed_iteration.txt"

# `org/name` with the characters the hub allows; anything else is a path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# What the cache's refs/ files hold and its snapshots/ are named by (huggingface_hub's REGEX_COMMIT_HASH).
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MAIN = "main"  # the ref a hub id without a revision names, as huggingface_hub reads it
# The cache folder, as huggingface_hub.constants computes it (checked against it in tests/config/test_hub_ids.py).
HUB_CACHE_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")  # the second: its legacy name
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})


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
    """A checkpoint podium cannot load (a directory, or a hub id not in the local HF cache); the
    message names it and why."""


def is_hub_id(name: str) -> bool:
    """Whether ``name`` has the form of a hub id (``org/name``); a recipe's path that exists wins
    (:func:`normalise_checkpoint`)."""
    return bool(_HUB_ID.match(name))


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def hf_home(env: Mapping[str, str] | None = None) -> str:
    """``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``."""
    env = _env(env)
    default = os.path.join(env.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")), "huggingface")
    return os.path.expandvars(os.path.expanduser(env.get("HF_HOME", default)))


def hub_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The HF hub cache this process (and a node started from its environment) reads:
    ``$HF_HUB_CACHE`` (legacy ``$HUGGINGFACE_HUB_CACHE``), else ``<HF_HOME>/hub``."""
    env = _env(env)
    chosen = env.get(HUB_CACHE_VARS[0], env.get(HUB_CACHE_VARS[1], os.path.join(hf_home(env), "hub")))
    return Path(os.path.expandvars(os.path.expanduser(chosen)))


def hub_offline(env: Mapping[str, str] | None = None) -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set true: huggingface_hub makes no request."""
    env = _env(env)
    value = env.get(OFFLINE_VARS[0]) or env.get(OFFLINE_VARS[1])
    return bool(value) and str(value).upper() in _TRUE


def fetch_command(repo_id: str, revision: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The command that puts ``repo_id`` (at ``revision``) into the cache this environment reads,
    run on a login node with network access: the cache named by the variable that chose it here."""
    env = _env(env)
    where = (f"HF_HUB_CACHE={shlex.quote(str(hub_cache_dir(env)))}" if any(v in env for v in HUB_CACHE_VARS)
             else f"HF_HOME={shlex.quote(hf_home(env))}")
    online = "HF_HUB_OFFLINE=0 " if hub_offline(env) else ""
    pinned = f" --revision {revision}" if revision else ""
    return f"{online}{where} hf download {repo_id}{pinned}"


@dataclass(frozen=True)
class HubSnapshot:
    """A hub id's snapshot in the local HF cache: the commit, and the directory holding its files."""

    repo_id: str
    revision: str
    path: Path


def hub_snapshot(repo_id: str, revision: str | None = None, env: Mapping[str, str] | None = None) -> HubSnapshot:
    """The snapshot of ``repo_id`` in the local HF cache: commit ``revision`` (pinned by the plan),
    or without one the commit ``refs/main`` names now. :class:`CheckpointError` naming the id, the
    revision, the cache searched and the command that fetches it, when it is not there."""
    if revision is not None and not COMMIT.match(revision):  # a path component below: a commit only
        raise CheckpointError(f"checkpoint {repo_id}: revision {revision!r} is not a commit hash (40 hex characters)")
    cache = hub_cache_dir(env)
    folder = _repo_folder(repo_id)
    repo = cache / folder
    commit = revision
    if commit is None:
        try:
            commit = (repo / "refs" / MAIN).read_text().strip()
        except OSError:
            commit = None
        if commit is None or not COMMIT.match(commit):
            raise CheckpointError(_not_cached(repo_id, None, cache, _what_is_there(repo, folder), env))
    snapshot = hub_snapshot_path(repo_id, commit, env)
    if not snapshot.is_dir():
        missing = f"no {folder}/snapshots/{commit}" + ("" if revision else f", which {folder}/refs/{MAIN} names")
        raise CheckpointError(_not_cached(repo_id, revision, cache, missing, env))
    return HubSnapshot(repo_id, commit, snapshot)


def pin_hub_id(repo_id: str) -> tuple[str | None, str | None]:
    """What the planner pins for a hub id: (the commit ``refs/main`` names in the local HF cache,
    None), or (None, why it is not there: :func:`hub_snapshot`'s words)."""
    try:
        return hub_snapshot(repo_id).revision, None
    except CheckpointError as exc:
        return None, str(exc)


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")  # huggingface_hub's repo_folder_name for a model


def hub_snapshot_path(repo_id: str, revision: str, env: Mapping[str, str] | None = None) -> Path:
    """Where the snapshot ``revision`` of ``repo_id`` is in the local HF cache (there or not)."""
    return hub_cache_dir(env) / _repo_folder(repo_id) / "snapshots" / revision


def _what_is_there(repo: Path, folder: str) -> str:
    if not repo.is_dir():
        return f"no {folder}"
    ref = repo / "refs" / MAIN
    if ref.is_file():
        return f"{folder}/refs/{MAIN} holds {ref.read_text().strip()[:60]!r}, not a commit"
    snapshots = sorted(p.name for p in (repo / "snapshots").glob("*") if p.is_dir())
    return f"no {folder}/refs/{MAIN}" + (f" (snapshots: {', '.join(snapshots)})" if snapshots else "")


def _not_cached(repo_id: str, revision: str | None, cache: Path, missing: str,
                env: Mapping[str, str] | None) -> str:
    what = ("a hub id not in the local HF cache" if revision is None else
            f"its snapshot {revision} (pinned when the teacher was planned) is not in the local HF cache")
    offline = " (HF_HUB_OFFLINE is set here)" if hub_offline(env) else ""
    again = "" if revision is None else ", or plan the teacher again (`podium up`) to pin the snapshot the cache has"
    return (f"checkpoint {repo_id}: {what} {cache} ({missing}); podium does not download weights: fetch it into "
            f"the cache the nodes read, on a login node with network access: "
            f"`{fetch_command(repo_id, revision, env)}`{offline}{again}")


def checkpoint_dir(name: str, revision: str | None = None) -> Path:
    """The directory the checkpoint ``name`` is read from, the one rule for the planner and every
    node: a hub id's snapshot in the local HF cache (commit ``revision``, pinned by the plan; without
    one, the commit ``refs/main`` names), else the path itself (a local path that exists wins over
    a hub id of the same spelling). :class:`CheckpointError` for a hub id not in the cache."""
    path = Path(os.path.expanduser(name))
    if revision is not None or (not path.exists() and is_hub_id(name)):
        return hub_snapshot(name, revision).path
    return path


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
        f"nor a Megatron torch_dist checkpoint ({METADATA}, or {LATEST} naming an iteration): {_missing(root)}"
    )


def _missing(root: Path) -> str:
    """What an HF directory lacks, in words: the plan names it."""
    has_config = (root / HF_CONFIG).is_file()
    bins = [name for name in TORCH_BIN if (root / name).is_file()]
    if has_config and bins:
        return (f"it holds {HF_CONFIG} and {bins[0]}, but podium reads safetensors weights only ({SAFE_SINGLE} or "
                f"{SAFE_INDEX}): save the model again with safe_serialization=True")
    if has_config:
        return f"it holds {HF_CONFIG} but no weights (neither {SAFE_SINGLE} nor {SAFE_INDEX})"
    weights = (root / SAFE_SINGLE).is_file() or (root / SAFE_INDEX).is_file()
    return f"it has no {HF_CONFIG}" + (" (its safetensors weights need one beside them)" if weights else "")


def _absent_shards(root: Path) -> str | None:
    """Which weight files the ``model.safetensors.index.json`` of the HF directory ``root`` names
    but ``root`` lacks, in words; None when all are there (an unreadable index is the loader's to
    report). The plan checks it; a node reading the directory names the one shard it misses."""
    try:
        weight_map = json.loads((root / SAFE_INDEX).read_text()).get("weight_map") or {}
        files = sorted(set(map(str, weight_map.values())))
    except (OSError, ValueError, AttributeError):
        return None
    absent = [name for name in files if not (root / name).is_file()]
    if not absent:
        return None
    return (f"checkpoint {root}: {SAFE_INDEX} names {len(absent)} weight file(s) that are not there: "
            f"{', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''} (a download or copy that did not finish?)")


def detect_format(path: str | Path) -> CheckpointFormat | None:
    """The format of a local checkpoint directory, or None if podium cannot load it."""
    try:
        return find_checkpoint(path).kind
    except CheckpointError:
        return None


def checkpoint_problem(path: str | Path, layout: ParallelLayout | None = None,
                       revision: str | None = None) -> str | None:
    """Why podium cannot load the checkpoint ``path`` (a local directory, or a hub id at
    ``revision``: :func:`checkpoint_dir`): where it is, its format, its architecture, or a
    ``layout`` that cannot split it (:func:`podium.config.architecture.layout_problems`); None
    when it can."""
    try:
        found = find_checkpoint(checkpoint_dir(str(path), revision))
    except CheckpointError as exc:
        return str(exc)
    if found.kind != "hf":
        return None
    if (absent := _absent_shards(found.path)) is not None:
        return absent
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


def checkpoint_needs(path: str | Path, layout: ParallelLayout, revision: str | None = None) -> list[str]:
    """What the HF checkpoint ``path`` (a hub id: its snapshot at ``revision``) needs at ``layout``
    (:func:`podium.config.architecture.architecture_needs`); nothing where its config is not
    readable here (a checkpoint only the compute nodes see, a torch_dist directory)."""
    try:
        config = json.loads((find_checkpoint(checkpoint_dir(str(path), revision)).path / HF_CONFIG).read_text())
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
