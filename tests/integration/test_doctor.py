"""``podium doctor`` on the real Slurm test cluster (one short test job per run) and on the local
cluster: a good recipe passes every row; a recipe whose partition does not exist fails that row
with the fix, and still runs the other checks; a local recipe on a machine without CUDA passes
(the teacher runs on CPU, and the row says so), one the local backend refuses fails with its words.
The test job's program, run where podium does not import, still reports its interpreter and file,
and, where the teacher's packages are missing, which ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness.cli import podium
from harness.recipes import write_recipe

from podium.launcher.common.packages import TEACHER_PACKAGES
from podium.launcher.login.doctor import probe
from podium.launcher.login.doctor.probe_job import PODIUM_FIX, _judge_probe
from podium.launcher.login.sbatch_errors import REFUSALS

SLURM_ROWS = ["slurm", "sacct", "partition low", "checkpoints", "test job", "run dir", "python", "podium",
              "packages", "ports", "address"]


def _checks(proc) -> dict[str, dict[str, str]]:
    report = json.loads(proc.stdout)
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.slurm
def test_doctor_passes_a_good_recipe_and_names_the_fix_for_a_missing_partition(
        slurm_cluster, tiny_llama_checkpoint, slurm_scratch: Path) -> None:
    recipe = write_recipe(slurm_scratch / "recipe.yaml", {"math": (tiny_llama_checkpoint, 1)})
    run_dir = slurm_scratch / "run"

    good = podium("doctor", str(recipe), "--run-dir", str(run_dir), "--json", check=False)
    assert good.returncode == 0, good.stdout + good.stderr
    checks = _checks(good)
    assert list(checks) == SLURM_ROWS
    assert all(c["state"] == "pass" for c in checks.values()), checks
    assert checks["run dir"]["detail"].endswith("this machine read it back")
    assert not run_dir.exists()  # the doctor removes what it made

    # The table a person reads: the partition row fails, names the setting and the fix.
    bad = podium("doctor", str(recipe), "--run-dir", str(run_dir), "podium.slurm.partition=gpu-nowhere",
                 env={"COLUMNS": "400"}, check=False)
    print(bad.stdout)  # what a user reads (shown with -rP)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    row = next(line for line in bad.stdout.splitlines() if "partition gpu-nowhere" in line)
    assert "✘" in row and "podium.slurm.partition='gpu-nowhere': no such partition" in row, bad.stdout
    partition_fix = next(r.fix for r in REFUSALS if r.kind == "partition")
    assert f"fix: {partition_fix}" in bad.stdout
    # the other checks still ran (the test job in the default partition) and passed
    assert bad.stdout.count("✔") == len(SLURM_ROWS) - 1, bad.stdout
    assert "1 check(s) failed" in bad.stdout


def test_doctor_local_without_cuda_runs_on_cpu_and_refuses_two_nodes(tiny_llama_checkpoint, tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", {"math": (tiny_llama_checkpoint, 1)},
                          slurm={"gpus": True}, teacher_cfg={"gpus_per_node": 2})
    text = recipe.read_text().replace("cluster: slurm", "cluster: local")
    recipe.write_text(text)
    cpu = {"CUDA_VISIBLE_DEVICES": ""}  # as on a machine without GPUs

    ok = podium("doctor", str(recipe), "--run-dir", str(tmp_path / "run"), "--json", env=cpu, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    checks = _checks(ok)
    assert list(checks) == ["teacher math", "checkpoints", "run dir", "packages", "ports", "address"]
    assert "runs on CPU" in checks["teacher math"]["detail"]

    two = podium("doctor", str(recipe), "--run-dir", str(tmp_path / "run"), "--json",
                 "on_policy_distillation.non_colocated_teachers.teacher_overrides.math.num_nodes=2",
                 env=cpu, check=False)
    assert two.returncode == 1, two.stdout + two.stderr
    row = _checks(two)["teacher math"]
    assert row["state"] == "fail" and "cluster 'local' runs one node" in row["detail"]


def test_doctor_without_slurm_commands_says_where_to_run(tiny_llama_checkpoint, tmp_path: Path) -> None:
    """A machine without Slurm's client commands (PATH holds only the interpreter): the first row
    fails with the fix, the rows that need Slurm are not checked, nothing hangs."""
    recipe = write_recipe(tmp_path / "recipe.yaml", {"math": (tiny_llama_checkpoint, 1)})
    proc = podium("doctor", str(recipe), "--run-dir", str(tmp_path / "run"), "--json",
                  env={"PATH": str(Path(sys.executable).parent)}, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = _checks(proc)
    assert checks["slurm"]["state"] == "fail" and "sinfo: command not found" in checks["slurm"]["detail"]
    assert "podium.cluster: local" in checks["slurm"]["fix"]
    assert [c["state"] for n, c in checks.items() if n in ("sacct", "partition", "test job")] == ["skip"] * 3


def test_probe_reports_python_and_run_dir_where_podium_does_not_import(tmp_path: Path) -> None:
    """The probe's text, as the test job sends it, in an interpreter that cannot see podium
    (-I -S: no PYTHONPATH, no site-packages): it still writes its file and reports its Python."""
    out = tmp_path / ".doctor" / "3f2a9c1b7d4e.json"
    out.parent.mkdir()
    args = {"token": "3f2a9c1b7d4e", "out": str(out), "settings": {}}
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", Path(probe.__file__).read_text(), json.dumps(args)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r.name: r for r in _judge_probe(proc.returncode, proc.stdout, proc.stderr, out, "here",
                                            ("run dir", "python", "podium", "ports", "address"))}
    assert [rows[n].state for n in ("test job", "run dir", "python", "podium", "ports", "address")] == [
        "pass", "pass", "pass", "fail", "skip", "skip"], rows
    assert "No module named 'podium'" in rows["podium"].detail and rows["podium"].fix == PODIUM_FIX


def test_probe_on_a_node_without_the_teachers_packages_fails_the_packages_row(tmp_path: Path) -> None:
    """A node Python without torch, megatron-core or Ray (here: no site-packages) fails the doctor's
    packages row, naming each missing module and the command that installs them, though podium's own
    rows say nothing of it."""
    out = tmp_path / ".doctor" / "5b7e2c9d1a3f.json"
    out.parent.mkdir()
    args = {"token": "5b7e2c9d1a3f", "out": str(out), "settings": {}, "packages": dict(TEACHER_PACKAGES)}
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", Path(probe.__file__).read_text(), json.dumps(args)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r.name: r for r in _judge_probe(proc.returncode, proc.stdout, proc.stderr, out, "here",
                                            ("run dir", "python", "podium", "packages", "ports", "address"))}
    row = rows["packages"]
    assert row.state == "fail", row
    assert (f"node {rows['test job'].detail.rsplit(' ', 1)[-1]}: {sys.executable} cannot import torch, megatron.core, "
            "ray, transformers") in row.detail, row.detail
    assert "`pip install 'podium[teacher]'`" in row.detail and "podium.slurm.python" in row.fix, row
