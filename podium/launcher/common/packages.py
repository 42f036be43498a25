"""The packages each side of a teacher imports, and how a Python that lacks some is told.

A trainer's light install (``pip install podium``) has none of them; the teacher's side comes with
the ``teacher`` extra, what ``podium up`` submits with (submitit) with the ``launcher`` extra. Asked
in three places with the same words: the node task before it starts anything
(:meth:`podium.launcher.job.node_run.NodeRun.prepare`: a missing package fails the teacher for good,
with the cause in its record, so ``podium status`` and ``wait`` show it), ``podium doctor``'s probe
on a node, and ``podium up`` on the login node. Asked by :func:`importlib.util.find_spec` (nothing
heavy is imported to answer).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Mapping

# What a teacher's node task imports (module -> the distribution pip installs), from the `teacher`
# extra in pyproject.toml (tests/client/test_light_install.py holds them to it); einops is needed by
# Mamba (Nemotron-H) teachers only, and says so when missing.
TEACHER_PACKAGES: Mapping[str, str] = {
    "torch": "torch",
    "megatron.core": "megatron-core",
    "ray": "ray",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "aiohttp": "aiohttp",
    "prometheus_client": "prometheus_client",
    "psutil": "psutil",
}
# What `podium up` and `scale` submit with, on the login node (and, for cluster: local, what runs the job).
LAUNCHER_PACKAGES: Mapping[str, str] = {"submitit": "submitit"}
TEACHER_INSTALL = "pip install 'podium[teacher]'"
LAUNCHER_INSTALL = "pip install 'podium[launcher]'"
NODE_PYTHON_ADVICE = "or set podium.slurm.python (or podium.slurm.setup) to a Python that has them"


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The modules of ``modules`` this Python cannot find (a broken parent package counts as missing)."""
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # the parent package is missing or broken
            found = False
        if not found:
            missing.append(module)
    return missing


def missing_message(missing: Iterable[str], packages: Mapping[str, str], install: str, *,
                    python: str | None = None, advice: str = NODE_PYTHON_ADVICE) -> str:
    """One line: which Python cannot import what, and the command that installs it there."""
    missing = list(missing)
    dists = " ".join(dict.fromkeys(packages.get(m, m) for m in missing))
    return (f"{python or sys.executable} cannot import {', '.join(missing)}: install them into that Python "
            f"(`{install}`, or `pip install {dists}`)" + (f", {advice}" if advice else ""))
