"""Aliases that reach a shell line or a file name: control characters are refused at plan time.

Before this rule a newline in an alias went through ``plan`` (exit 0) and ``render`` printed the
rest of the alias as a script line of its own (the comment lines with the aliases are not quoted,
and ``shlex.quote`` keeps the newline inside ``--job-name``).
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from podium.cli import app
from podium.config.names import name_problem
from podium.config.spec import TeacherSpec

MAPPING = "on_policy_distillation.teacher_model_by_agent_name"


def recipe(tmp_path: Path, mapping: str, extra: str = "") -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent("""\
        on_policy_distillation:
          teacher_model_by_agent_name:
        {mapping}
          non_colocated_teachers:
            default_teacher_cfg: {{num_nodes: 1, gpus_per_node: 1}}
        podium:
          cluster: slurm
          slurm: {{gpus: false}}
        {extra}""").format(mapping=mapping, extra=extra))
    return path


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", ["plan", "up", "render"])
def test_newline_alias_exits_2_naming_the_key_and_writes_nothing(tmp_path: Path, command: str) -> None:
    path = recipe(tmp_path, '    "math\\ntouch /tmp/pwned #": Qwen/Qwen2-0.5B')
    run_dir = tmp_path / "run"
    args = {"plan": ["plan", str(path)],
            "up": ["up", str(path), "--run-dir", str(run_dir)],
            "render": ["render", str(path), "--teacher", "math\ntouch /tmp/pwned #", "--run-dir", str(run_dir),
                       "--write"]}[command]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert f"{MAPPING}['math\\ntouch /tmp/pwned #']: alias contains control characters (U+000A)" in result.output
    assert "touch /tmp/pwned" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing may be written"


def test_tab_in_a_podium_teachers_key_is_named(tmp_path: Path) -> None:
    path = recipe(tmp_path, "    math: Qwen/Qwen2-0.5B", extra='  teachers: {"ma\\tth": {slurm: {time: "01:00:00"}}}\n')
    result = invoke("plan", str(path))
    assert result.exit_code == 2, result.output
    assert "podium.teachers['ma\\tth']: alias contains control characters (U+0009)" in result.output


def test_render_with_a_normal_alias_still_works(tmp_path: Path) -> None:
    path = recipe(tmp_path, "    math-agent_1: Qwen/Qwen2-0.5B")
    result = invoke("render", str(path), "--teacher", "math-agent_1", "--run-dir", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1].startswith("# podium teacher math-agent_1 (")
    assert subprocess.run(["bash", "-n"], input=result.stdout, text=True).returncode == 0


@pytest.mark.parametrize("bad", ["a\nb", "a\tb", "a\rb", "a\x00b", "a\x7fb", "a\u200bb", "a\x85b"])
def test_name_problem_and_the_spec_validator_refuse_control_characters(bad: str) -> None:
    assert name_problem(bad) is not None
    with pytest.raises(ValidationError, match="control characters"):
        TeacherSpec(key="abcdef123456", name=bad, aliases=(bad,), model_name="/ckpt", num_nodes=1, gpus_per_node=1)
    with pytest.raises(ValidationError, match="control characters"):
        TeacherSpec(key="abcdef123456", name="ok", aliases=("ok", bad), model_name="/ckpt", num_nodes=1,
                    gpus_per_node=1)


@pytest.mark.parametrize("good", ["math", "math agent", "régime", "数学", "a.b-c_d", "$(x)"])
def test_printable_names_pass(good: str) -> None:
    assert name_problem(good) is None
