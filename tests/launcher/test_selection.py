"""``podium.launcher.login.selection``: the words that name a run's teachers, the same for every command."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.cli import podium

from podium.config.plan import load_plan
from podium.config.spec import display_name
from podium.launcher.login.logs import log_paths
from podium.launcher.login.run_dir import prepare_run_dir
from podium.launcher.login.selection import UnknownTeacherError, resolve
from podium.launcher.login.stop import down

RECIPE = """\
on_policy_distillation:
  teacher_model_by_agent_name: {math: /ckpt/math, code: /ckpt/math, chat: /ckpt/chat}
  default_teacher_alias: math
  non_colocated_teachers:
    default_teacher_cfg: {tensor_model_parallel_size: 1, num_nodes: 1, gpus_per_node: 1}
podium:
  cluster: local
  teachers: {chat: {replicas: 2}}
"""


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    return prepare_run_dir(load_plan(recipe), tmp_path / "run").run_dir


def displays(found) -> list[str]:
    return [spec.display for spec, _ in found]


def test_display_names() -> None:
    assert display_name("math") == display_name("math", 0) == "math"
    assert display_name("math", 2) == "math#2"


def test_every_form_of_a_name_selects_the_same_replicas(run_dir: Path) -> None:
    assert displays(resolve(run_dir, [])) == ["chat", "chat#1", "math"]
    chat = resolve(run_dir, ["chat"])
    assert displays(chat) == ["chat", "chat#1"]  # the name or key: every replica
    assert displays(resolve(run_dir, [chat[0][0].key])) == ["chat", "chat#1"]
    assert displays(resolve(run_dir, ["chat#1"])) == ["chat#1"]
    assert displays(resolve(run_dir, [chat[1][1].folder.name])) == ["chat#1"]  # the folder name
    assert displays(resolve(run_dir, ["math", "chat#1"])) == ["chat#1", "math"]  # in the run dir's order


def test_a_word_that_names_nothing_is_an_error_listing_the_teachers(run_dir: Path) -> None:
    with pytest.raises(UnknownTeacherError, match=r"no teacher 'maths' in .*run \(teachers: chat, math\)"):
        resolve(run_dir, ["math", "maths"])
    with pytest.raises(UnknownTeacherError, match="no teacher 'chat#2'"):
        down(run_dir, ["chat#2"])  # nothing is stopped for a typo
    with pytest.raises(UnknownTeacherError, match="no teacher 'nope'"):
        log_paths(run_dir, "nope")
    with pytest.raises(FileNotFoundError, match="no job submitted yet"):
        log_paths(run_dir, "chat#1")


def test_every_alias_names_its_teacher(run_dir: Path, tmp_path: Path) -> None:
    """A teacher is named after its first alias; its other aliases name it too, in every command
    that takes a teacher (``down``, ``logs``, ``scale``, ``render --teacher``)."""
    assert displays(resolve(run_dir, ["code"])) == ["math"]  # `code` shares math's checkpoint
    assert displays(resolve(run_dir, ["code", "chat#1"])) == ["chat#1", "math"]
    with pytest.raises(FileNotFoundError, match=r"teacher 'code': no job submitted yet \(.*/teachers/math-\w+/"):
        log_paths(run_dir, "code")  # math's logs (none yet: never submitted here)
    plan = load_plan(tmp_path / "recipe.yaml")
    assert plan.teacher("code") == plan.teacher("math")
    render = podium("render", str(tmp_path / "recipe.yaml"), "--teacher", "code", "--run-dir", str(run_dir))
    assert "# podium teacher math (" in render.stdout and "serving: math, code" in render.stdout, render.stdout
