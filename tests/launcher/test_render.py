"""Rendered sbatch scripts against golden files (``PODIUM_UPDATE_GOLDEN=1`` regenerates them)."""

from __future__ import annotations

import difflib
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from podium.config.spec import TeacherSpec
from podium.launcher.render import render_teacher_script
from podium.launcher.submission import clean_submit_env, slurm_parameters, time_to_minutes

GOLDEN = Path(__file__).parent / "golden"
RUN_DIR = Path("/shared/runs/demo")


def spec(**slurm: object) -> TeacherSpec:
    base = {"partition": "batch", "account": "proj", "time": "08:00:00", "exclusive": True,
            "gpus": True, "gpu_request": "gpus_per_node", "requeue": True, "signal": "USR2",
            "signal_lead_s": 120, "setup": [], "extra_sbatch": {}, "container_mounts": []}
    base.update(slurm)
    return TeacherSpec(key="0123456789ab", name="math", aliases=("math", "code"),
                       model_name="/ckpt/math", num_nodes=2, gpus_per_node=8,
                       tensor_model_parallel_size=8,
                       launcher={"cluster": "slurm", "slurm": base, "ray": {}, "server": {}})


CASES = {
    "gpu_two_nodes": spec(),
    "cpu_container_extra": spec(gpus=False, exclusive=False, partition="low", account=None,
                                qos="high prio", constraint="a100&ib", time="1-00:00:00",
                                setup=["module load cuda/12.4", "source /opt/env.sh"],
                                container_image="nvcr.io#nvidia/nemo:24.07",
                                container_mounts=["/data:/data", "/ckpt:/ckpt"],
                                extra_sbatch={"reservation": "my res; rm -rf /", "mail-type": "END"},
                                gpu_request="gres", python="/opt/venv/bin/python"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    text = render_teacher_script(CASES[name], RUN_DIR, python="/usr/bin/python3")
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("PODIUM_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden {path}: run with PODIUM_UPDATE_GOLDEN=1 and review it"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(path), "rendered"))
        pytest.fail(f"rendered script differs from {path}:\n{diff}")


def test_values_with_spaces_and_shell_are_quoted(tmp_path: Path) -> None:
    text = render_teacher_script(CASES["cpu_container_extra"], tmp_path / "run dir with space")
    assert "--qos='high prio'" in text
    assert "--reservation='my res; rm -rf /'" in text
    line = next(l for l in text.splitlines() if l.startswith("export PODIUM_TEACHER_DIR="))
    assert shlex.split(line.split("=", 1)[1]) == [str(tmp_path / "run dir with space/teachers/math-01234567")]
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_parameters() -> None:
    gpu = slurm_parameters(CASES["gpu_two_nodes"])
    assert gpu["nodes"] == 2 and gpu["ntasks_per_node"] == 1 and gpu["gpus_per_node"] == 8
    assert gpu["cpus_per_task"] == 9 and gpu["time"] == 480 and gpu["exclusive"] is True
    assert gpu["additional_parameters"] == {"requeue": True, "signal": "USR2@120"}
    assert gpu["job_name"] == "podium-math-01234567"
    cpu = slurm_parameters(CASES["cpu_container_extra"])
    assert "gpus_per_node" not in cpu and "gres" not in cpu and "exclusive" not in cpu
    assert cpu["srun_args"] == ["--container-image=nvcr.io#nvidia/nemo:24.07",
                                "--container-mounts=/data:/data,/ckpt:/ckpt"]
    assert time_to_minutes("1-00:00:00") == 1440 and time_to_minutes("00:30:01") == 31
    # Slurm's other forms: M, M:S, D-H, D-H:M.
    assert time_to_minutes("90") == 90 and time_to_minutes("30:30") == 31
    assert time_to_minutes("1-12") == 2160 and time_to_minutes("1-12:30") == 2190


def test_clean_submit_env() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_PARTITION": "x",
           "SLURM_NNODES": "2", "SUBMITIT_EXECUTOR": "slurm", "PATH": "/bin", "HOME": "/root"}
    assert clean_submit_env(env) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin", "HOME": "/root"}
