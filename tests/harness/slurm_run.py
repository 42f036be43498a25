"""What the launcher's tests on the real Slurm test cluster share (recipes: :mod:`harness.recipes`;
the CLI: :mod:`harness.cli`).

- :func:`job_ids`, :func:`check_logprobs`, :func:`ray_processes_of`;
- :func:`identity` (a teacher's job ``--comment``), :func:`queued_with` (the queued jobs carrying it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
from fixtures.checkpoints import hf_oracle_logprobs, random_batch

from harness.recipes import TOL


def job_ids(run_dir: Path) -> dict[str, str]:
    """Job id by teacher name (``name#i`` for its replica i >= 1)."""
    from podium.config.spec import TeacherSpec

    out = {}
    for path in run_dir.glob("teachers/*/job.json"):
        display = TeacherSpec.read(path.parent / "spec.json").display
        out[display] = json.loads(path.read_text())["job_id"]
    return out


def check_logprobs(run_dir: Path, expected: dict[str, Path]) -> None:
    import podium.client as pc

    data = random_batch(256, [6, 11, 3], seed=7)
    with pc.connect(run_dir / "rendezvous.json") as client:
        for alias, checkpoint in expected.items():
            got = client.get_logprobs(alias, data)
            value = np.asarray(got["logprobs"] if isinstance(got, dict) else got)
            ref = hf_oracle_logprobs(checkpoint, data["input_ids"], data["input_lengths"]).numpy()
            err = float(np.abs(value - ref).max())
            assert err < TOL, f"alias {alias}: max |error| {err} vs the HF oracle"


def ray_processes_of(jobs: list[str]) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    marks = [f"podium-{j}-" for j in jobs]
    return [line for line in out.splitlines() if any(m in line for m in marks)]


def queued_with(comment: str) -> list[str]:
    """Ids of the jobs in the queue (any state squeue shows) whose comment is ``comment``."""
    out = subprocess.run(["squeue", "-h", "-O", "JobID:|,Comment:|"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    return [line.split("|")[0] for line in out.splitlines() if line.split("|")[1:2] == [comment]]


def identity(recipe: Path, run_dir: Path, *overrides: str) -> str:
    """The ``--comment`` the recipe's one teacher's jobs carry in ``run_dir``."""
    from podium.config.plan import load_plan
    from podium.launcher.backends.slurm.scheduler import job_comment
    from podium.launcher.common.files import TeacherFiles

    (spec,) = load_plan(recipe, list(overrides)).teachers
    return job_comment(spec, TeacherFiles.of(run_dir.absolute(), spec.name, spec.key))
