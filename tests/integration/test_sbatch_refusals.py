"""``sbatch`` refusing a teacher's job, on the real Slurm test cluster (it has no GPU gres): the
error ``up`` prints is one line that names the recipe setting and the fix and keeps sbatch's words;
nothing is left submitted or half-written, so the fixed recipe's ``up`` submits. The teachers are
held in the queue (``extra_sbatch: {hold: true}``): no model loads.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harness.cli import podium
from harness.recipes import write_recipe
from harness.slurm_run import identity, job_ids, queued_with

from podium.launcher.login.sbatch_errors import one_line

pytestmark = pytest.mark.slurm

# what the table's unit tests (tests/launcher/test_sbatch_errors.py) are checked on
CAPTURED_FILE = Path(__file__).parents[1] / "launcher" / "data" / "sbatch_refusals.json"


def test_the_captured_refusals_are_what_this_cluster_answers(slurm_cluster, slurm_jobs) -> None:
    """The unit tests' sbatch messages are still what sbatch prints here."""
    captured = {k: v for k, v in json.loads(CAPTURED_FILE.read_text()).items() if not k.startswith("_")}
    for option, message in captured.items():
        proc = subprocess.run(["sbatch", option, "--wrap", "true"], capture_output=True, text=True, timeout=60)
        if proc.returncode == 0:  # accepted after all: cancel it, then fail
            slurm_jobs.append(proc.stdout.split()[-1])
        assert proc.returncode != 0 and one_line(proc.stderr) == one_line(message), (option, proc.stderr)


def _refused(recipe: Path, run_dir: Path) -> str:
    """``up`` of a recipe sbatch refuses: exit 2, and its one error line (sbatch's own lines are not
    printed apart from it)."""
    up = podium("up", str(recipe), "--run-dir", str(run_dir), check=False)
    assert up.returncode == 2, up.stdout + up.stderr[-3000:]
    (error,) = [line for line in up.stderr.splitlines() if line.startswith("podium: error:")]
    assert not [line for line in up.stderr.splitlines() if line.startswith("sbatch:")], up.stderr
    print(error)  # what a user reads (shown with -rP)
    return error


def _nothing_submitted(run_dir: Path, comment: str) -> None:
    assert queued_with(comment) == []
    (folder,) = run_dir.glob("teachers/*")
    assert not (folder / "job.json").exists() and not (folder / "submitting.json").exists()
    assert not list(folder.glob("submitit/.submission_file_*"))  # submitit's temporary script, removed


def test_refusals_name_the_setting_and_a_fixed_retry_submits(slurm_cluster, slurm_jobs, tiny_llama_checkpoint,
                                                             tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    aliases = {"math": (tiny_llama_checkpoint, 1)}

    # A NeMo RL recipe as shipped: GPUs asked for, on a cluster without GPU gres
    write_recipe(recipe, aliases, slurm={"gpus": True, "extra_sbatch": {"hold": True}},
                 teacher_cfg={"gpus_per_node": 2})
    comment = identity(recipe, run_dir)
    error = _refused(recipe, run_dir)
    assert "podium.slurm.gpus=true with gpus_per_node=2 (--gpus-per-node=2)" in error
    assert "set podium.slurm.gpus: false" in error
    assert "(sbatch said: sbatch: error: Invalid generic resource (gres) specification)" in error
    _nothing_submitted(run_dir, comment)

    # the fix the line gives (podium.slurm.gpus: false, write_recipe's default), and a partition
    # this cluster does not have
    write_recipe(recipe, aliases, slurm={"partition": "nope", "extra_sbatch": {"hold": True}},
                 teacher_cfg={"gpus_per_node": 2})
    error = _refused(recipe, run_dir)
    assert "podium.slurm.partition='nope'" in error and "`sinfo -s`" in error
    assert "Batch job submission failed: Invalid partition name specified" in error
    _nothing_submitted(run_dir, comment)

    write_recipe(recipe, aliases, slurm={"partition": "low", "extra_sbatch": {"hold": True}},
                 teacher_cfg={"gpus_per_node": 2})  # fixed: the same teacher (key), submitted
    try:
        up = podium("up", str(recipe), "--run-dir", str(run_dir))
        assert identity(recipe, run_dir) == comment
        (job_id,) = queued_with(comment)
        slurm_jobs.append(job_id)
        assert f"math: submitted job {job_id}" in up.stdout
    finally:
        podium("down", str(run_dir), check=False)
    assert queued_with(comment) == []


def test_a_refused_second_teacher_leaves_the_first_running_and_says_so(
        slurm_cluster, slurm_jobs, tiny_llama_checkpoint, tiny_qwen2_checkpoint, tmp_path: Path) -> None:
    """Teachers are submitted one by one: the one refused (its own partition override) stops ``up``;
    the one before keeps its job, the error says which, and the fixed recipe's ``up`` reattaches it."""
    run_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    aliases = {"math": (tiny_llama_checkpoint, 1), "chat": (tiny_qwen2_checkpoint, 1)}
    write_recipe(recipe, aliases, slurm={"extra_sbatch": {"hold": True}},
                 teachers={"chat": {"slurm": {"partition": "nope"}}})
    try:
        error = _refused(recipe, run_dir)
        ids = job_ids(run_dir)
        assert list(ids) == ["math"] and slurm_jobs.append(ids["math"]) is None
        assert error.startswith("podium: error: teacher chat-") and "podium.slurm.partition='nope'" in error
        assert f"[left running: math job {ids['math']};" in error

        write_recipe(recipe, aliases, slurm={"extra_sbatch": {"hold": True}})
        up = podium("up", str(recipe), "--run-dir", str(run_dir))
        slurm_jobs.extend(job_ids(run_dir).values())
        assert f"math: reattached job {ids['math']}" in up.stdout and "chat: submitted job" in up.stdout
    finally:
        podium("down", str(run_dir), check=False)
