"""The one materialisation of a teacher's job: golden scripts, quoting, dry run = render = submitted.

Golden files change only on request: ``PODIUM_UPDATE_GOLDEN=1 python -m pytest tests/launcher/test_render.py``
rewrites them (never under ``CI=true``: there a golden that differs is a failure, whatever is set);
a missing golden is a failure, not written on the fly. That the submitted script is the rendered one
is proved on the real Slurm cluster in ``tests/integration/test_materialisation.py``.
"""

from __future__ import annotations

import difflib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from podium.config.launcher import TeacherLauncherSettings
from podium.config.spec import TeacherSpec
from podium.launcher.backends import scheduler_for
from podium.launcher.backends.slurm.scheduler import SlurmScheduler, sbatch_request
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.slurm_state import time_to_minutes
from podium.launcher.login.submission import clean_submit_env

GOLDEN = Path(__file__).parent / "golden"
RUN_DIR = Path("/shared/runs/demo")
UPDATE = os.environ.get("PODIUM_UPDATE_GOLDEN") == "1"
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def spec(**slurm: object) -> TeacherSpec:
    settings = {"partition": "batch", "account": "proj", "time": "08:00:00", "python": "/usr/bin/python3", **slurm}
    return TeacherSpec(key="0123456789ab", name="math", aliases=("math", "code"),
                       model_name="/ckpt/math", num_nodes=2, gpus_per_node=8, tensor_model_parallel_size=8,
                       launcher=TeacherLauncherSettings.model_validate({"cluster": "slurm", "slurm": settings}))


CASES = {
    "gpu_two_nodes": spec(),
    "cpu_container_extra": spec(gpus=False, exclusive=False, partition="low", account=None,
                                qos="high prio", constraint="a100&ib", time="1-00:00:00",
                                setup=["module load cuda/12.4", "source /opt/env.sh"],
                                container_image="nvcr.io#nvidia/nemo:24.07",
                                container_mounts=["/data:/data", "/ckpt:/ckpt"],
                                extra_sbatch={"reservation": "my res; rm -rf /", "mail-type": "END"},
                                gpu_request="gres", python="/opt/venv/bin/python"),
    # a teacher's replica 2 (podium.replicas): its own folder, job name and identity, nothing else differs
    "gpu_two_nodes_replica2": spec().replica_spec(2),
}


def render(case: TeacherSpec, run_dir: Path = RUN_DIR) -> str:
    return SlurmScheduler().materialise(case, TeacherFiles.of_spec(run_dir, case)).render()


def compare_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.sbatch"
    if UPDATE and not IN_CI:
        path.write_text(text)
    assert path.exists(), f"missing golden {path}: run with PODIUM_UPDATE_GOLDEN=1 (not under CI) and review it"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"rendered script differs from {path}:\n{diff}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    compare_golden(name, render(CASES[name]))


def test_values_with_spaces_and_shell_are_quoted(tmp_path: Path) -> None:
    case = CASES["cpu_container_extra"]
    run_dir = tmp_path / "run dir with space"
    text = render(case, run_dir)
    assert "--qos='high prio'" in text
    assert "--reservation='my res; rm -rf /'" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    srun = text[text.index("\nsrun ") + 1:text.index(" &\n")].replace("\\\n", " ")
    words = shlex.split(srun)
    folder = str(TeacherFiles.of(run_dir, case.name, case.key).folder)
    assert words[-1] == folder  # the teacher's folder, with its space, is one argument
    assert f"--output={folder}/submitit/%j_%t_log.out" in words
    assert words[words.index("-m") + 1] == "podium.launcher.job.node_entry"


def test_request() -> None:
    files = TeacherFiles.of(RUN_DIR, "math", "0123456789ab")
    gpu = sbatch_request(CASES["gpu_two_nodes"], files)
    assert (gpu.option("nodes"), gpu.option("ntasks-per-node"), gpu.option("gpus-per-node")) == (2, 1, 8)
    assert (gpu.option("cpus-per-task"), gpu.option("time"), gpu.option("exclusive")) == (9, 480, True)
    assert (gpu.option("requeue"), gpu.option("signal")) == (True, "USR2@120")
    assert gpu.option("job-name") == "podium-math-01234567"
    cpu = sbatch_request(CASES["cpu_container_extra"], files)
    assert cpu.option("gpus-per-node") is None and cpu.option("gres") is None and cpu.option("exclusive") is None
    assert "--container-image=nvcr.io#nvidia/nemo:24.07" in cpu.srun_args
    assert "--container-mounts=/data:/data,/ckpt:/ckpt" in cpu.srun_args
    assert cpu.command[0] == "/opt/venv/bin/python"
    assert time_to_minutes("1-00:00:00") == 1440 and time_to_minutes("00:30:01") == 31
    # Slurm's other forms: M, M:S, D-H, D-H:M.
    assert time_to_minutes("90") == 90 and time_to_minutes("30:30") == 31
    assert time_to_minutes("1-12") == 2160 and time_to_minutes("1-12:30") == 2190


def test_local_materialisation_is_the_node_entry_command(tmp_path: Path) -> None:
    case = spec().model_copy(update={"num_nodes": 1, "launcher": TeacherLauncherSettings(cluster="local")})
    files = TeacherFiles.of(tmp_path, case.name, case.key)
    submission = scheduler_for("local").materialise(case, files)
    command_line = submission.render().splitlines()[-1]
    assert shlex.split(command_line) == list(submission.command)
    assert submission.command[-1] == str(files.folder) and "podium.launcher.job.node_entry" in submission.command


def test_golden_rule_refuses_to_write_under_ci(tmp_path: Path) -> None:
    """``PODIUM_UPDATE_GOLDEN=1`` under ``CI=true`` rewrites nothing: the differing golden fails."""
    env = {**os.environ, "CI": "true", "PODIUM_UPDATE_GOLDEN": "1"}
    golden = GOLDEN / "gpu_two_nodes.sbatch"
    before = golden.read_text()
    paths = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
    script = (
        f"import sys; sys.path[:0] = {paths!r}\n"
        "import pytest, test_render as t\n"
        "try:\n    t.compare_golden('gpu_two_nodes', 'not the golden\\n')\n"
        "except pytest.fail.Exception as exc:\n    print('FAILED', str(exc)[:60])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "FAILED rendered script differs" in out.stdout, out.stdout + out.stderr
    assert golden.read_text() == before


def test_clean_submit_env() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_PARTITION": "x",
           "SLURM_NNODES": "2", "SUBMITIT_EXECUTOR": "slurm", "PATH": "/bin", "HOME": "/root"}
    assert clean_submit_env(env) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin", "HOME": "/root"}


def test_every_job_carries_the_teachers_identity(tmp_path: Path) -> None:
    from podium.launcher.backends.slurm.scheduler import job_comment

    case = CASES["gpu_two_nodes"]
    files = TeacherFiles.of(tmp_path / "run", case.name, case.key)
    comment = sbatch_request(case, files).option("comment")
    assert comment == job_comment(case, files) and comment.startswith(f"podium:{case.key}:")
    # Another run dir of the same teacher is another identity; the same one reached by a symlink is not.
    other = TeacherFiles.of(tmp_path / "other", case.name, case.key)
    (tmp_path / "run").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "run")
    linked = TeacherFiles.of(tmp_path / "link", case.name, case.key)
    assert job_comment(case, other) != comment and job_comment(case, linked) == comment


def test_each_replica_is_a_job_of_its_own() -> None:
    """Replica 0 is the teacher's job as without replicas; replica i >= 1 has its own folder, name and
    identity (so `up` finds and reattaches each), and nothing else of its request differs."""
    from podium.launcher.backends.slurm.scheduler import job_comment

    first, third = CASES["gpu_two_nodes"], CASES["gpu_two_nodes_replica2"]
    files = [TeacherFiles.of_spec(RUN_DIR, case) for case in (first, third)]
    assert [f.folder.name for f in files] == ["math-01234567", "math-01234567-r2"]
    requests = [sbatch_request(case, f) for case, f in zip((first, third), files, strict=True)]
    assert [r.option("job-name") for r in requests] == ["podium-math-01234567", "podium-math-01234567-r2"]
    assert [job_comment(case, f).split(":")[1] for case, f in zip((first, third), files, strict=True)] == \
        ["0123456789ab", "0123456789ab-r2"]
    differ = {name for name, value in requests[0].options if requests[1].option(name) != value}
    assert differ == {"job-name", "comment", "output"}, differ


@pytest.mark.parametrize("key", ["comment", "job-name"])
def test_extra_sbatch_cannot_replace_the_identity(key: str) -> None:
    from podium.config.errors import ConfigError
    from podium.config.launcher import parse_launcher

    with pytest.raises(ConfigError, match=f"podium.slurm.extra_sbatch: .*{key}: set by podium"):
        parse_launcher({"slurm": {"extra_sbatch": {key: "x"}}})


def test_local_find_live_scans_proc_for_the_teachers_controller(tmp_path: Path) -> None:
    """A process whose argv names the controller module and this teacher's submitit folder is found;
    one of another folder is not (a stand-in process: the real controller starts a teacher)."""
    from podium.launcher.backends.local.scheduler import CONTROLLER_MODULE, LocalScheduler

    case = spec().model_copy(update={"num_nodes": 1, "launcher": TeacherLauncherSettings(cluster="local")})
    files = TeacherFiles.of(tmp_path, case.name, case.key)
    other = TeacherFiles.of(tmp_path / "other", case.name, case.key)
    code = "import sys; sys.stdin.read()"
    procs = [subprocess.Popen([sys.executable, "-c", code, "-m", CONTROLLER_MODULE, str(f.submitit)],
                              stdin=subprocess.PIPE) for f in (files, other)]
    try:
        assert LocalScheduler().find_live(case, files) == [str(procs[0].pid)]
    finally:
        for p in procs:
            p.communicate(b"")
    assert LocalScheduler().find_live(case, files) == []
