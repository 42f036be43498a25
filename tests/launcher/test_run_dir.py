"""The default run dir is named by the recipe file, not by the directory ``up`` runs in."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from podium.config.plan import load_plan
from podium.launcher.login.run_dir import RUNS_DIR_ENV, default_run_dir

RECIPE = """\
on_policy_distillation:
  teacher_model_by_agent_name: {math: Qwen/Qwen2-0.5B}
  non_colocated_teachers:
    default_teacher_cfg: {num_nodes: 1, gpus_per_node: 1}
"""


def write(path: Path, extra: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RECIPE + extra)
    return path


def test_same_recipe_from_two_directories_gives_the_same_run_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    recipe = write(tmp_path / "recipes" / "mopd.yaml")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "recipes")
    here = default_run_dir(load_plan("mopd.yaml"))
    monkeypatch.chdir(tmp_path / "elsewhere")
    there = default_run_dir(load_plan(Path("..") / "recipes" / "mopd.yaml"))
    digest = hashlib.sha256(str(recipe.resolve()).encode()).hexdigest()[:8]
    assert here == there == tmp_path / "runs" / f"mopd-{digest}"


def test_two_recipes_with_one_name_get_different_run_dirs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    a = default_run_dir(load_plan(write(tmp_path / "a" / "mopd.yaml")))
    b = default_run_dir(load_plan(write(tmp_path / "b" / "mopd.yaml")))
    assert a != b and a.parent == b.parent == tmp_path / "runs"
    assert a.name.startswith("mopd-") and b.name.startswith("mopd-")


def test_root_defaults_to_home_and_podium_run_dir_wins(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(RUNS_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    recipe = write(tmp_path / "r" / "mopd.yaml")
    assert default_run_dir(load_plan(recipe)).parent == tmp_path / "home" / "podium-runs"
    explicit = write(tmp_path / "r" / "explicit.yaml", "podium: {run_dir: ~/runs/stage1}\n")
    assert default_run_dir(load_plan(explicit)) == tmp_path / "home" / "runs" / "stage1"


@pytest.mark.parametrize("command", ["render", "up --dry-run"])
def test_cli_uses_the_default(tmp_path: Path, monkeypatch, command: str) -> None:
    from typer.testing import CliRunner

    from podium.cli import app

    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path / "runs"))
    recipe = write(tmp_path / "r" / "mopd.yaml", "podium: {cluster: slurm, slurm: {gpus: false}}\n")
    expected = default_run_dir(load_plan(recipe))
    monkeypatch.chdir(tmp_path)
    args = command.split() + [str(recipe)] + (["--teacher", "math"] if command == "render" else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"{expected}/teachers/math-" in result.stdout
    assert not (tmp_path / "runs").exists()  # neither writes the run dir
