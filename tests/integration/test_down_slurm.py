"""``podium down RECIPE`` on the real Slurm test cluster: the recipe stands for the run dir ``up``
gave it, and its teacher's job is cancelled (before, ``down recipe.yaml`` said "stopped: nothing"
and the job held its node until its time limit). The job is held (``sbatch --hold``): it never
runs, so the test costs no node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness.cli import podium
from harness.recipes import write_recipe

from podium.launcher.login.run_dir import RUNS_DIR_ENV

pytestmark = pytest.mark.slurm


def test_down_of_the_recipe_cancels_its_teacher(slurm_cluster, slurm_jobs, tiny_llama_checkpoint,
                                               tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", {"math": (tiny_llama_checkpoint, 1)},
                          slurm={"extra_sbatch": {"hold": True}})
    env = {RUNS_DIR_ENV: str(tmp_path / "runs")}
    up = podium("up", str(recipe), env=env)
    (job_id,) = re.findall(r"^math: submitted job (\d+)$", up.stdout, re.M)
    slurm_jobs.append(job_id)
    assert slurm_cluster.scontrol_job(job_id)["JobState"] == "PENDING"

    down = podium("down", str(recipe), env=env)
    assert down.stdout == "stopped: math\n" and "is a recipe: its run dir is" in down.stderr, down.stderr
    assert slurm_cluster.wait_for_state(job_id, "CANCELLED", timeout_s=60)["State"].startswith("CANCELLED")
