"""A change of ``podium.*`` settings under a live job: reported and left running; applied with
``--replace`` (cancel, submit again). Logic with a fake Slurm; the real cluster:
``tests/integration/test_submit_once.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.fake_backend import fake_slurm as fake_slurm_backend
from typer.testing import CliRunner

from podium.config.launcher import SettingChange, TeacherLauncherSettings, launcher_changes
from podium.config.plan import load_plan
from podium.config.spec import TeacherSpec
from podium.launcher.backends import kind_for
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.login import submission
from podium.launcher.login.up import recorded_changes, up

# its recipes name hub ids (Qwen/...): `plan` and `up` find them in the HF cache this fixture makes
pytestmark = pytest.mark.usefixtures("hub_cache")

RECIPE = """\
on_policy_distillation:
  teacher_model_by_agent_name: {math: Qwen/Qwen2-0.5B}
  non_colocated_teachers:
    default_teacher_cfg: {num_nodes: 1, gpus_per_node: 1}
podium:
  cluster: slurm
  slurm: {gpus: false, time: "04:00:00", partition: low}
"""


@pytest.fixture
def fake_slurm(monkeypatch):
    with fake_slurm_backend(monkeypatch, state="PENDING") as fake:
        yield fake.jobs, fake.cancelled


def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    return path


def test_changed_settings_are_reported_and_left_running(tmp_path: Path, fake_slurm) -> None:
    jobs, cancelled = fake_slurm
    run_dir = tmp_path / "run"
    first = up(load_plan(recipe(tmp_path)), run_dir)
    assert first.actions == {"math": "submitted"} and first.notes == []
    job_id = first.job_ids["math"]
    (spec,) = load_plan(recipe(tmp_path)).teachers
    files = TeacherFiles.of(run_dir.absolute(), spec.name, spec.key)
    assert JobRecord.read(files).launcher_settings() == spec.launcher  # recorded at submission

    same = up(load_plan(recipe(tmp_path)), run_dir)
    assert same.actions == {"math": "reattached"} and same.notes == []

    changed = up(load_plan(recipe(tmp_path), ["podium.slurm.time=08:00:00"]), run_dir)
    assert changed.actions == {"math": "reattached"} and changed.job_ids == {"math": job_id}
    assert changed.notes == [f"teacher 'math': job {job_id} runs with slurm.time=04:00:00, the recipe now says "
                             f"08:00:00: left running; `podium up --replace` resubmits it"]
    assert cancelled == [] and jobs[job_id] == "PENDING"
    # the job left running keeps reading the settings it was submitted with
    assert TeacherSpec.read(files.spec).launcher.slurm.time == "04:00:00"


def test_replace_cancels_and_resubmits_with_the_new_settings(tmp_path: Path, fake_slurm) -> None:
    jobs, cancelled = fake_slurm
    run_dir = tmp_path / "run"
    old = up(load_plan(recipe(tmp_path)), run_dir).job_ids["math"]
    plan = load_plan(recipe(tmp_path), ["podium.slurm.time=08:00:00", "podium.slurm.partition=high"])
    result = up(plan, run_dir, replace=True)
    new = result.job_ids["math"]
    assert result.actions == {"math": "replaced"} and result.replaced == {"math": old} and new != old
    assert cancelled == [old] and jobs[new] == "PENDING"
    assert result.notes == [f"teacher 'math': job {old} ran with slurm.partition=low, the recipe now says high; "
                            f"slurm.time=04:00:00, the recipe now says 08:00:00: cancelled, replaced by job {new}"]
    (spec,) = plan.teachers
    record = JobRecord.read(TeacherFiles.of(run_dir.absolute(), spec.name, spec.key))
    assert record.previous_job_ids == [old] and record.launcher_settings().slurm.time == "08:00:00"
    again = up(plan, run_dir, replace=True)  # nothing differs any more: nothing is cancelled
    assert again.actions == {"math": "reattached"} and cancelled == [old]


def test_unrecorded_settings_are_said_and_not_replaced(tmp_path: Path, fake_slurm) -> None:
    _jobs, cancelled = fake_slurm
    run_dir = tmp_path / "run"
    plan = load_plan(recipe(tmp_path))
    up(plan, run_dir)
    (spec,) = plan.teachers
    files = TeacherFiles.of(run_dir.absolute(), spec.name, spec.key)
    record = JobRecord.read(files)
    record.launcher = None  # a job.json of an older podium
    record.write(files)
    result = up(plan, run_dir, replace=True)
    assert result.actions == {"math": "reattached"} and cancelled == []
    assert "has no recorded launcher settings" in result.notes[0]


def test_up_prints_the_note(tmp_path: Path, fake_slurm) -> None:
    from podium.cli import app

    run_dir = tmp_path / "run"
    runner = CliRunner()
    assert runner.invoke(app, ["up", str(recipe(tmp_path)), "--run-dir", str(run_dir)]).exit_code == 0
    out = runner.invoke(app, ["up", str(recipe(tmp_path)), "podium.slurm.time=08:00:00", "--run-dir", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert "math: reattached job 100\n" in out.stdout
    assert "job 100 runs with slurm.time=04:00:00, the recipe now says 08:00:00: left running" in out.stdout
    out = runner.invoke(app, ["up", str(recipe(tmp_path)), "podium.slurm.time=08:00:00", "--run-dir", str(run_dir),
                              "--replace"])
    assert "math: replaced job 100 with job 101\n" in out.stdout, out.output


def test_an_adopted_job_keeps_the_settings_it_was_submitted_with(tmp_path: Path, fake_slurm, monkeypatch) -> None:
    """`up` died between sbatch and job.json: the adopter reads the settings from submitting.json."""
    jobs, _ = fake_slurm
    plan = load_plan(recipe(tmp_path))
    (spec,) = plan.teachers
    files = TeacherFiles.of(tmp_path / "run", spec.name, spec.key)
    files.folder.mkdir(parents=True)

    def die_after_submit(spec, files):
        jobs["77"] = "RUNNING"
        raise KeyboardInterrupt  # the process ends here; job.json is not written

    monkeypatch.setattr(submission, "submit", die_after_submit)
    with pytest.raises(KeyboardInterrupt):
        submission.ensure_submitted(spec, files)
    monkeypatch.setattr(kind_for("slurm").scheduler, "find_live", lambda self, spec, files: ["77"])  # the fake
    newer = load_plan(recipe(tmp_path), ["podium.slurm.time=08:00:00"]).teachers[0]
    record, action = submission.ensure_submitted(newer, files)
    assert (record.job_id, action) == ("77", "reattached")
    assert record.launcher_settings() == spec.launcher
    assert [c.key for c in recorded_changes(newer, record)] == ["slurm.time"]


def test_launcher_changes() -> None:
    old = TeacherLauncherSettings.model_validate({"run_dir": "/a", "slurm": {"extra_sbatch": {"hold": True}}})
    new = TeacherLauncherSettings.model_validate({"run_dir": "/b", "slurm": {"extra_sbatch": {"hold": False},
                                                                          "account": "x"},
                                                  "ray": {"port_range": [21000, 22000]}})
    assert launcher_changes(old, new) == [
        SettingChange("ray.port_range", [20000, 32767], [21000, 22000]),
        SettingChange("slurm.account", None, "x"),
        SettingChange("slurm.extra_sbatch.hold", True, False),
    ]
    assert str(SettingChange("slurm.account", None, "x")) == "slurm.account=(unset), the recipe now says x"
    assert launcher_changes(old, old) == []
    empty = TeacherLauncherSettings()
    assert launcher_changes(empty, old) == [  # run_dir is not compared; extra_sbatch: {} adds no key
        SettingChange("slurm.extra_sbatch.hold", None, True)]
