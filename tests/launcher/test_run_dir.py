"""The default run dir is named by the recipe file, not by the directory ``up`` runs in; a run dir
and the files the launcher writes in it are the user's own."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from harness.cli import podium
from harness.recipes import two_teachers_on_slurm

from podium.config.plan import load_plan
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.stop_request import request_stop
from podium.launcher.login.run_dir import RUNS_DIR_ENV, default_run_dir, prepare_run_dir

# its recipes name hub ids (Qwen/...): `plan` and `up` find them in the HF cache this fixture makes
pytestmark = pytest.mark.usefixtures("hub_cache")

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


def test_the_run_dir_is_private(tmp_path: Path) -> None:
    """The run dir is 0700, the files the launcher writes in it 0600."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)  # an older podium's run dir: made private when written again
    plan = load_plan(two_teachers_on_slurm(tmp_path))
    layout = prepare_run_dir(plan, run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    files = TeacherFiles.of_spec(run_dir, plan.teachers[0])
    for path in (layout.auth_token_path, run_dir / "plan.json", run_dir / "recipe.yaml", files.spec):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    request_stop(files, "7")
    assert stat.S_IMODE(files.stop_request.stat().st_mode) == 0o600


def test_run_dir_commands_refuse_a_path_that_holds_no_run(tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    """``down``, ``status``, ``wait``, ``logs`` and ``scale`` as a user types them (subprocesses): a
    path that holds no run is an error naming it (exit 2), never "stopped: nothing" with exit 0; a
    recipe names the run dir ``up`` gives it, and is refused, naming that run dir and why, while no
    run is there; once one is, ``down RECIPE`` stops it."""
    env = {RUNS_DIR_ENV: str(tmp_path / "runs")}
    missing = tmp_path / "no" / "such" / "dir"
    for args in (["down"], ["status"], ["wait", "--timeout", "1"], ["logs", "math"], ["scale", "math", "2"]):
        proc = podium(args[0], str(missing), *args[1:], env=env, check=False)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert f"podium: error: {missing} is not a podium run dir: {missing}/rendezvous.json: missing" in proc.stderr
        assert "Traceback" not in proc.stderr and "stopped" not in proc.stdout
    text = podium("down", "/etc/hostname", check=False)
    assert text.returncode == 2 and "/etc/hostname is a file, neither a run dir's rendezvous.json nor a recipe" \
        in text.stderr, text.stderr

    recipe = tmp_path / "r" / "mopd.yaml"
    recipe.parent.mkdir()
    recipe.write_text(RECIPE.replace("Qwen/Qwen2-0.5B", str(tiny_llama_checkpoint)) + "podium: {cluster: local}\n")
    with pytest.MonkeyPatch.context() as env_now:
        env_now.setenv(RUNS_DIR_ENV, env[RUNS_DIR_ENV])
        plan = load_plan(recipe)
        expected = default_run_dir(plan)
    nothing = podium("down", str(recipe), env=env, check=False)
    assert nothing.returncode == 2, nothing.stdout + nothing.stderr
    assert (f"{recipe} is a recipe; the run dir it names, {expected} (no podium.run_dir: the default, "
            "<$PODIUM_RUNS_DIR or ~/podium-runs>/<recipe stem>-<8 hex of its path>), holds no run") in nothing.stderr
    explicit = tmp_path / "r" / "explicit.yaml"
    explicit.write_text(recipe.read_text().replace("{cluster: local}", f"{{cluster: local, run_dir: {tmp_path}/x}}"))
    assert f"the run dir it names, {tmp_path}/x (its podium.run_dir)" in podium("status", str(explicit),
                                                                                 check=False).stderr

    prepare_run_dir(plan, expected)  # what `up` writes before it submits
    down = podium("down", str(recipe), env=env)
    assert down.stdout == "stopped: math\n"
    assert f"podium: note: {recipe} is a recipe: its run dir is {expected} (no podium.run_dir" in down.stderr
    status = podium("status", str(recipe), "--json", env=env, check=False)
    assert status.returncode == 1 and json.loads(status.stdout)[0]["name"] == "math", status.stdout  # never submitted
