"""Recipes for test runs: :func:`write_recipe` writes a small MOPD recipe (NeMo RL's distillation
block plus ``podium:``) from keyword overrides, so a test states only what it is about;
:func:`write_teachers_file` the same teachers and settings as a teachers file (podium's short form).

Also the settings test runs share: :data:`RAY_PORTS` (Ray's port block) and :data:`TOL` (the largest
|logprob - HF oracle| a served teacher may show in fp32).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

# Below the kernel's ephemeral range (32768-60999 here): an outgoing connection never takes a port
# of a node's block between podium's check and Ray's bind. Not 20000-23999 (other test fixtures).
RAY_PORT_RANGE = (24000, 32767)
RAY_PORTS = f"[{RAY_PORT_RANGE[0]}, {RAY_PORT_RANGE[1]}]"  # as a recipe writes it inline
TOL = 2e-3


def write_recipe(path: Path, aliases: Mapping[str, tuple[Path | str, int]], *, cluster: str = "slurm",
                 slurm: Mapping[str, Any] | None = None,
                 server: Mapping[str, Any] | None = None,
                 restart: Mapping[str, Any] | None = None,
                 teachers: Mapping[str, Mapping[str, Any]] | None = None,
                 teacher_cfg: Mapping[str, Any] | None = None,
                 ray: Mapping[str, Any] | None = None,
                 extra: Mapping[str, Any] | None = None) -> Path:
    """aliases: name -> (checkpoint, num_nodes); the first is the default alias. ``slurm``/``server``/
    ``restart``/``ray`` entries override the defaults; ``teachers``: per-alias launcher overrides
    (``{"a": {"slurm": {"signal": "TERM"}}}``); ``teacher_cfg``: entries over the default teacher
    config (``{"expert_model_parallel_size": 2}``); ``extra``: more top-level blocks (``policy``)."""
    recipe: dict[str, Any] = {
        **(extra or {}),
        "on_policy_distillation": {
            "teacher_model_by_agent_name": {alias: str(ckpt) for alias, (ckpt, _) in aliases.items()},
            "default_teacher_alias": next(iter(aliases)),
            "non_colocated_teachers": {
                "default_teacher_cfg": {**TEACHER_CFG, **(teacher_cfg or {})},
                "teacher_overrides": {alias: {"num_nodes": n} for alias, (_, n) in aliases.items()},
            },
        },
        "podium": _podium(cluster, slurm, server, restart, teachers, ray),
    }
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


TEACHER_CFG = {"tensor_model_parallel_size": 1, "num_nodes": 1, "gpus_per_node": 1, "precision": "fp32"}


def write_teachers_file(path: Path, aliases: Mapping[str, tuple[Path | str, int]], *, cluster: str = "slurm",
                        slurm: Mapping[str, Any] | None = None,
                        server: Mapping[str, Any] | None = None,
                        restart: Mapping[str, Any] | None = None,
                        teachers: Mapping[str, Mapping[str, Any]] | None = None,
                        teacher_cfg: Mapping[str, Any] | None = None,
                        ray: Mapping[str, Any] | None = None) -> Path:
    """What :func:`write_recipe` writes, as a teachers file: each alias a block of the same settings
    (``teacher_cfg`` over :data:`TEACHER_CFG`, its own ``num_nodes``), the same ``podium:`` section;
    the same aliases on one checkpoint share one teacher."""
    blocks = {alias: {"checkpoint": str(ckpt), **TEACHER_CFG, **(teacher_cfg or {}), "num_nodes": n}
              for alias, (ckpt, n) in aliases.items()}
    text = {"teachers": blocks, "podium": _podium(cluster, slurm, server, restart, teachers, ray)}
    path.write_text(yaml.safe_dump(text, sort_keys=False))
    return path


def _podium(cluster: str, slurm: Mapping[str, Any] | None, server: Mapping[str, Any] | None,
            restart: Mapping[str, Any] | None, teachers: Mapping[str, Mapping[str, Any]] | None,
            ray: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``podium:`` section of a test run: the test cluster's settings under the given entries."""
    return {
        "cluster": cluster,
        "slurm": {"gpus": False, "exclusive": False, "time": "00:30:00", "partition": "low", **(slurm or {})},
        "ray": {"port_range": list(RAY_PORT_RANGE), "object_store_memory_mb": 100, **(ray or {})},
        "server": {"heartbeat_s": 2, "stale_after_s": 10, **(server or {})},
        "restart": dict(restart or {}),
        "teachers": {alias: dict(value) for alias, value in (teachers or {}).items()},
    }


# Two teachers on Slurm, named by Hub ids (nothing is loaded): what the launcher's logic tests run
# against a fake Slurm (:mod:`harness.fake_backend`).
TWO_TEACHERS_ON_SLURM = """\
on_policy_distillation:
  teacher_model_by_agent_name: {math: Qwen/Qwen2-0.5B, code: Qwen/Qwen2.5-0.5B}
  non_colocated_teachers:
    default_teacher_cfg: {num_nodes: 1, gpus_per_node: 1}
podium:
  cluster: slurm
  slurm: {gpus: false, time: "04:00:00", partition: low}
"""


def two_teachers_on_slurm(tmp_path: Path) -> Path:
    """:data:`TWO_TEACHERS_ON_SLURM` in ``tmp_path/recipe.yaml``."""
    path = tmp_path / "recipe.yaml"
    path.write_text(TWO_TEACHERS_ON_SLURM)
    return path
