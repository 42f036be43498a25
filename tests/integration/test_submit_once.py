"""A teacher is submitted once, whatever happens to ``podium up``: on the real Slurm test cluster.

The teachers are held in the queue (``extra_sbatch: {hold: true}``), so no model loads: what is
tested is what Slurm holds. Every job of a teacher carries its identity as ``--comment``
(``job_comment``); the queue is read here with plain ``squeue``, not with podium's parser. A job of
another user that carries a teacher's name and comment is not the teacher's: ``up`` does not adopt
it, ``down`` does not cancel it, ``status`` does not read it (the user is a local account the test
creates; root submits the job as that user, ``sbatch --uid``).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest
from harness.cli import podium
from harness.recipes import write_recipe
from harness.slurm_run import identity, queued_with

from podium.config.spec import TeacherSpec
from podium.launcher.backends.slurm.scheduler import SlurmScheduler, job_comment, job_name
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.slurm_state import query_states

pytestmark = pytest.mark.slurm

OTHER_USER = "podium-other"
SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                   num_nodes=1, gpus_per_node=1)


def recorded_job(run_dir: Path) -> str:
    (job_file,) = run_dir.glob("teachers/*/job.json")
    return json.loads(job_file.read_text())["job_id"]


def held_recipe(path: Path, checkpoint: Path) -> Path:
    return write_recipe(path, {"math": (checkpoint, 1)}, slurm={"extra_sbatch": {"hold": True}})


def test_up_killed_between_sbatch_and_job_json_is_adopted_not_resubmitted(
        slurm_cluster, slurm_jobs, tiny_llama_checkpoint, tmp_path: Path) -> None:
    recipe = held_recipe(tmp_path / "recipe.yaml", tiny_llama_checkpoint)
    run_dir = tmp_path / "run"
    comment = identity(recipe, run_dir)
    try:
        crashed = podium("up", str(recipe), "--run-dir", str(run_dir), env={"PODIUM_FAULTS": "exit_after_submit"},
                         check=False)
        assert crashed.returncode == 17, crashed.stderr[-2000:]
        assert "fault injected by PODIUM_FAULTS exit_after_submit" in crashed.stderr
        assert not list(run_dir.glob("teachers/*/job.json"))  # the job was never recorded
        (job_id,) = queued_with(comment)
        slurm_jobs.append(job_id)

        again = podium("up", str(recipe), "--run-dir", str(run_dir))
        assert f"math: reattached job {job_id}" in again.stdout, again.stdout + again.stderr
        assert recorded_job(run_dir) == job_id
        assert queued_with(comment) == [job_id]  # nothing was submitted a second time
        assert slurm_cluster.scontrol_job(job_id)["JobState"] == "PENDING"

        podium("down", str(run_dir))
        slurm_cluster.wait_for_state(job_id, "CANCELLED")
        assert queued_with(comment) == []
    finally:
        podium("down", str(run_dir), check=False)


def test_down_cancels_a_job_that_job_json_does_not_name(slurm_cluster, slurm_jobs, tiny_llama_checkpoint,
                                                        tmp_path: Path) -> None:
    recipe = held_recipe(tmp_path / "recipe.yaml", tiny_llama_checkpoint)
    run_dir = tmp_path / "run"
    comment = identity(recipe, run_dir)
    try:
        crashed = podium("up", str(recipe), "--run-dir", str(run_dir), env={"PODIUM_FAULTS": "exit_after_submit"},
                         check=False)
        assert crashed.returncode == 17, crashed.stderr[-2000:]
        (job_id,) = queued_with(comment)
        slurm_jobs.append(job_id)
        podium("down", str(run_dir))
        slurm_cluster.wait_for_state(job_id, "CANCELLED")
    finally:
        podium("down", str(run_dir), check=False)


def test_changed_global_setting_is_reported_then_applied_with_replace(slurm_cluster, slurm_jobs, tiny_llama_checkpoint,
                                                                      tmp_path: Path) -> None:
    recipe = held_recipe(tmp_path / "recipe.yaml", tiny_llama_checkpoint)  # slurm.time 00:30:00
    run_dir = tmp_path / "run"
    longer = "podium.slurm.time=00:45:00"
    comment = identity(recipe, run_dir)
    assert identity(recipe, run_dir, longer) == comment  # a global setting is not the teacher's identity
    try:
        podium("up", str(recipe), "--run-dir", str(run_dir))
        old = recorded_job(run_dir)
        slurm_jobs.append(old)
        assert slurm_cluster.scontrol_job(old)["TimeLimit"] == "00:30:00"

        kept = podium("up", str(recipe), longer, "--run-dir", str(run_dir))
        assert f"math: reattached job {old}" in kept.stdout
        assert (f"teacher 'math': job {old} runs with slurm.time=00:30:00, the recipe now says 00:45:00: "
                f"left running; `podium up --replace` resubmits it") in kept.stdout
        assert queued_with(comment) == [old] and recorded_job(run_dir) == old

        replaced = podium("up", str(recipe), longer, "--run-dir", str(run_dir), "--replace")
        new = recorded_job(run_dir)
        slurm_jobs.append(new)
        assert new != old and f"math: replaced job {old} with job {new}" in replaced.stdout, replaced.stdout
        slurm_cluster.wait_for_state(old, "CANCELLED")
        assert queued_with(comment) == [new]
        job = slurm_cluster.scontrol_job(new)
        assert (job["TimeLimit"], job["JobState"]) == ("00:45:00", "PENDING")

        again = podium("up", str(recipe), longer, "--run-dir", str(run_dir), "--replace")
        assert f"math: reattached job {new}" in again.stdout and "runs with" not in again.stdout
    finally:
        podium("down", str(run_dir), check=False)


def other_user() -> str:
    """A local account that is not this one (created once; the cluster's nodes share this machine's
    accounts)."""
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                       check=True, capture_output=True, timeout=30)
    return OTHER_USER


def test_another_users_job_with_the_teachers_name_and_comment_is_not_ours(slurm_cluster, slurm_jobs: list,
                                                                          tmp_path: Path) -> None:
    assert os.geteuid() == 0, "submitting as another user (sbatch --uid) needs root, as the test cluster runs"
    files = TeacherFiles.of_spec(tmp_path / "run", SPEC)
    files.folder.mkdir(parents=True)
    # What another user reads off a world-readable spec.json and run dir path: the job's name and comment.
    proc = subprocess.run(["sbatch", "--parsable", "--hold", f"--uid={other_user()}", "-p", "low",
                           f"--job-name={job_name(SPEC)}", f"--comment={job_comment(SPEC, files)}",
                           "--output=/dev/null", "--wrap", "sleep 60"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    theirs = proc.stdout.strip().split(";")[0]
    slurm_jobs.append(theirs)
    scheduler = SlurmScheduler()
    assert scheduler.find_live(SPEC, files) == []  # not adopted by `up`, not cancelled by `down`
    record = JobRecord(teacher_key=SPEC.key, teacher_name=SPEC.name, job_id=theirs, cluster="slurm",
                       submitted_at=0.0, folder=str(files.submitit))
    assert theirs not in query_states([theirs])  # a job.json naming it does not make it ours
    scheduler.cancel([record])
    time.sleep(1)
    assert slurm_cluster.scontrol_job(theirs)["JobState"] == "PENDING"
