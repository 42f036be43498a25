"""The launcher on a shared Slurm cluster (issue 20), on the real Slurm test cluster:

- a job of another user that carries a teacher's name and comment is not podium's: ``up`` does not
  adopt it, ``down`` does not cancel it, ``status`` does not read it (the user is a local account
  the test creates; root submits the job as that user, ``sbatch --uid``);
- a time limit ends a teacher (``restart.at_time_limit: stop``, the default): no requeue;
- ``sbatch/trainer.sbatch`` at its time limit takes its teacher down (its EXIT trap).

Each runs about a minute or less: a 1-minute time limit, warned 40 s (teacher) / 30 s (trainer)
ahead; neither teacher needs to be ready for what is checked.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.cli import podium
from harness.recipes import write_recipe
from harness.slurm_run import job_ids

from podium.config.spec import TeacherSpec
from podium.launcher.backends.slurm.scheduler import SlurmScheduler, job_comment, job_name
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.restarts import RestartLedger
from podium.launcher.common.slurm_state import query_states
from podium.launcher.login.run_dir import known_teachers
from podium.poll import poll_until
from podium.rendezvous.records import Status, read_record

pytestmark = pytest.mark.slurm

OTHER_USER = "podium-other"
SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                   num_nodes=1, gpus_per_node=1)


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


def test_a_time_limit_ends_the_teacher(slurm_cluster, tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", {"solo": (tiny_llama_checkpoint, 1)},
                          slurm={"time": "00:01:00", "signal_lead_s": 40})
    run_dir = tmp_path / "run"
    try:
        podium("up", str(recipe), "--run-dir", str(run_dir))
        job = job_ids(run_dir)["solo"]
        [(_, files)] = known_teachers(run_dir)

        def ended() -> RestartLedger | None:
            states = query_states([job])
            ledger = RestartLedger.read(files)
            return ledger if job in states and not states[job].alive and ledger.outcomes else None

        ledger = poll_until(ended, timeout_s=150, interval_s=1, what=f"job {job} to end at its time limit")
        assert [o.outcome for o in ledger.outcomes] == ["time_limit"]
        assert "near its time limit" in ledger.outcomes[0].reason
        record = read_record(files.endpoint)
        assert record.status is Status.STOPPED and record.will_retry is False and record.final is False
        assert record.restart is not None and "at_time_limit=stop" in record.restart.why
        assert slurm_cluster.sacct(job)[0]["State"] in ("COMPLETED", "TIMEOUT")  # not requeued
        assert int(slurm_cluster.scontrol_job(job).get("Restarts", "0")) == 0
    finally:
        podium("down", str(run_dir), check=False)


def test_trainer_sbatch_at_its_time_limit_leaves_no_teacher(slurm_cluster, slurm_jobs: list,
                                                            tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    recipe = write_recipe(tmp_path / "recipe.yaml", {"inner": (tiny_llama_checkpoint, 1)})
    run_dir = tmp_path / "run"
    out = tmp_path / "trainer.out"
    env = {**os.environ, "PODIUM": f"{sys.executable} -m podium.cli", "TRAINER": "sleep 600"}
    # A 1-minute limit, its warning 30 s ahead: the trainer is still waiting for its teacher or
    # "training" (sleep) when it comes.
    sub = subprocess.run(["sbatch", "--parsable", "--time=1", "--signal=B:USR1@30", f"--output={out}",
                          f"--export=ALL,RECIPE={recipe},RUN_DIR={run_dir}", str(repo / "sbatch" / "trainer.sbatch")],
                         capture_output=True, text=True, env=env, timeout=30)
    assert sub.returncode == 0, sub.stderr
    trainer = sub.stdout.strip().split(";")[0]
    slurm_jobs.append(trainer)
    try:
        teacher = poll_until(lambda: job_ids(run_dir).get("inner"), timeout_s=60, interval_s=1,
                             what="the trainer's teacher job")
        slurm_jobs.append(teacher)
        poll_until(lambda: trainer in query_states([trainer]) and not query_states([trainer])[trainer].alive,
                   timeout_s=150, interval_s=1, what=f"trainer job {trainer} to end")
        states = query_states([teacher])
        assert teacher in states and not states[teacher].alive, (states, out.read_text()[-3000:])
    finally:
        podium("down", str(run_dir), check=False)
