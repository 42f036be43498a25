"""The teachers file, podium's short form for users without a NeMo RL recipe: planned, deduplicated,
checked and keyed exactly as a recipe's teachers (:mod:`podium.config.sources`), its errors named
by its own key paths. No cluster: ``plan`` through typer's runner, ``load_plan`` in-process, hub
ids from the test's HF cache (``fixtures.hub_cache``)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from podium.cli import app
from podium.config.errors import ConfigError
from podium.config.plan import load_plan


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def plan_cli(path: Path, *args: str):
    before = sorted(p.name for p in path.parent.iterdir())
    result = CliRunner().invoke(app, ["plan", str(path), *args])
    assert sorted(p.name for p in path.parent.iterdir()) == before, "plan must write nothing"
    return result


def test_the_short_form_plans_the_teachers_an_equivalent_recipe_plans(tmp_path: Path, hub_cache: Path) -> None:
    """Same specs (keys included: the same teacher, whichever file names it), same routes, same
    totals: a block is one alias's teacher_overrides over an empty default_teacher_cfg."""
    teachers = write(tmp_path / "teachers.yaml", """\
        teachers:
          math: Qwen/Qwen3-8B
          mcqa: {checkpoint: Qwen/Qwen3-8B}
          code: {checkpoint: Qwen/Qwen3-4B, tensor_model_parallel_size: 2, num_nodes: 1, gpus_per_node: 8}
          chat: {model_name: Qwen/Qwen3-1.7B, precision: fp32, megatron_cfg_overrides: {attention_dropout: 0.0}}
        podium: {cluster: slurm, run_dir: /shared/runs/x, slurm: {partition: batch}}
        """)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "on_policy_distillation": {
            "teacher_model_by_agent_name": {"math": "Qwen/Qwen3-8B", "mcqa": "Qwen/Qwen3-8B",
                                            "code": "Qwen/Qwen3-4B", "chat": "Qwen/Qwen3-1.7B"},
            "non_colocated_teachers": {"teacher_overrides": {
                "code": {"tensor_model_parallel_size": 2, "num_nodes": 1, "gpus_per_node": 8},
                "chat": {"precision": "fp32", "megatron_cfg_overrides": {"attention_dropout": 0.0}}}}},
        "podium": {"cluster": "slurm", "run_dir": "/shared/runs/x", "slurm": {"partition": "batch"}},
    }, sort_keys=False))
    short, full = load_plan(teachers), load_plan(recipe)
    assert short.teachers == full.teachers
    assert dict(short.routes) == dict(full.routes)
    assert short.totals == full.totals == {"teachers": 3, "aliases": 4, "replicas": 3, "nodes": 3,
                                           "nodes_without_dedup": 4}
    assert short.teacher("math").aliases == ("math", "mcqa")  # a path and a block without settings: one teacher
    assert short.teacher("math").revision is not None  # the hub id's snapshot pinned, as for a recipe
    assert short.launcher.run_dir == "/shared/runs/x" and short.launcher.slurm.partition == "batch"
    assert (short.default_alias, short.strict) == (None, False)


def test_aliases_on_one_checkpoint_with_other_settings_are_a_conflict_named_as_for_recipes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    path = write(tmp_path / "teachers.yaml", f"""\
        teachers:
          math: {ckpt}
          code: {{checkpoint: {ckpt}, tensor_model_parallel_size: 2}}
        """)
    with pytest.raises(ConfigError) as err:
        load_plan(path)
    # with the checkpoint's own problem (it does not exist here): every problem at once
    assert (f"  aliases 'math' and 'code' share checkpoint {ckpt} but ask for different settings: "
            "tensor_model_parallel_size (1 vs 2) (give them the same settings, or different checkpoints)\n"
            in str(err.value)), str(err.value)


def _error(output: str) -> str:
    """What ``podium plan`` says after the plan it shows: its error."""
    return output[output.index("podium: error: "):]


def test_a_relative_checkpoint_is_relative_to_the_file_and_missing_ones_are_named_by_their_keys(
        tmp_path: Path) -> None:
    path = write(tmp_path / "teachers.yaml", """\
        teachers:
          math: ./ckpts/math
          code: {checkpoint: ../teachers-file-ckpts/code}
        """)
    result = plan_cli(path)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("podium plan:")  # the plan first: a run is sized before it is staged
    assert _error(result.output) == ("podium: error: 2 problems:\n"
                             f"  teachers.math: checkpoint {tmp_path}/ckpts/math does not exist\n"
                             f"  teachers.code.checkpoint: checkpoint {tmp_path.parent}/teachers-file-ckpts/code "
                             "does not exist\n")


def test_a_hub_id_not_in_the_cache_is_refused_with_the_command_that_fetches_it(
        tmp_path: Path, hub_cache: Path) -> None:
    path = write(tmp_path / "teachers.yaml", """\
        teachers:
          math: {checkpoint: Qwen/Qwen3-8B, tensor_model_parallel_size: 2}
          code: {model_name: nobody/no-such-model}
        """)
    result = plan_cli(path)
    assert result.exit_code == 2, result.output
    assert _error(result.output).startswith("podium: error: teachers.code.model_name: checkpoint "
                                            "nobody/no-such-model: a hub id not in the local HF cache"), result.output
    assert "hf download nobody/no-such-model" in result.output


def test_every_problem_of_a_teachers_file_at_once_each_by_its_key_path(tmp_path: Path) -> None:
    """Typos get "did you mean" (a top-level key, a teacher key, a teacher key given on the command
    line), a launcher setting in a teacher's block says where it goes, a checkpoint given twice or
    not at all is named."""
    ckpt = tmp_path / "ckpt"
    path = write(tmp_path / "teachers.yaml", f"""\
        teachers:
          math: {{checkpoint: {ckpt}, model_name: {ckpt}}}
          code: {{chekpoint: {ckpt}}}
          chat: {{checkpoint: {ckpt}, tensor_modl_parallel_size: 2, replicas: 2, slurm: {{time: "01:00:00"}}}}
          judge: 7
        podum: {{cluster: slurm}}
        _paths: {{root: /ckpt}}
        """)
    result = plan_cli(path)
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert lines[0] == "podium: error: 9 problems:", result.output
    assert set(lines[1:]) == {
        "  podum: not a key of a teachers file, which holds teachers and podium (did you mean 'podium'?)",
        "  teachers.math: names its checkpoint twice (checkpoint and model_name): keep one",
        "  teachers.chat.replicas: a launcher setting, not a teacher's: give it as podium.teachers.chat.replicas",
        "  teachers.chat.slurm: a launcher setting, not a teacher's: give it as podium.teachers.chat.slurm",
        "  teachers.code.checkpoint: expected a checkpoint path or hub id, got None",
        "  teachers.code.chekpoint: unknown key (did you mean 'checkpoint'?)",
        "  teachers.judge: expected a checkpoint path or hub id, got 7",
        "  teachers.chat.tensor_modl_parallel_size: unknown key: not a teacher setting, nor a TransformerConfig "
        "field of megatron-core 0.16/0.19, nor a NeMo RL megatron_cfg key podium knows (did you mean "
        "'tensor_model_parallel_size'?)",
        f"  teachers.math.checkpoint: checkpoint {ckpt} does not exist",
    }, result.output
    fixed = write(tmp_path / "fixed.yaml", f"teachers: {{chat: {{checkpoint: {ckpt}}}}}\n")
    typo = plan_cli(fixed, "+teachers.chat.tensor_modl_parallel_size=2")
    assert "did you mean 'tensor_model_parallel_size'?" in typo.output, typo.output
    typo = plan_cli(fixed, "teachers.chat.chekpoint=/x")
    assert "key 'teachers.chat.chekpoint' is not in the recipe (did you mean 'teachers.chat.checkpoint'?)" \
        in typo.output, typo.output


@pytest.mark.parametrize(("text", "expected"), [
    ("teacher:\n  math: /ckpt/math\n", "; 'teacher': did you mean 'teachers'?"),
    ("teachres:\n  math: /ckpt/math\n", "; 'teachres': did you mean 'teachers'?"),
    ("on_policy_distilation: {}\n", "; 'on_policy_distilation': did you mean 'on_policy_distillation'?"),
    ("policy: {model_name: x}\n", ""),
])
def test_a_file_that_is_neither_a_recipe_nor_a_teachers_file_says_what_podium_expected(
        tmp_path: Path, text: str, expected: str) -> None:
    result = plan_cli(write(tmp_path / "x.yaml", text))
    assert result.exit_code == 2, result.output
    assert result.output == (
        "podium: error: neither a NeMo RL recipe nor a teachers file: podium plans the teachers of a MOPD recipe "
        "('on_policy_distillation.teacher_model_by_agent_name'), of a distillation recipe ('teacher.model_name') "
        f"or of a teachers file ('teachers:' mapping each alias to a checkpoint){expected}\n")


def test_a_layout_that_does_not_divide_names_the_teachers_own_keys(tmp_path: Path) -> None:
    """Without a size in its block a teacher has NeMo RL's defaults (one node of 8 GPUs); the error
    names the block's keys, never a recipe's cluster.gpus_per_node."""
    path = write(tmp_path / "teachers.yaml",
                 f"teachers: {{code: {{checkpoint: {tmp_path}, tensor_model_parallel_size: 3}}}}\n")
    result = plan_cli(path)
    assert result.exit_code == 2
    assert result.output.startswith(  # then the folder's own problem: it is no checkpoint
        "podium: error: 2 problems:\n  teachers.code.gpus_per_node, teachers.code.tensor_model_parallel_size: "
        "teacher 'code': 1 nodes × 8 GPUs = 8 GPUs is not divisible by TP3 × PP1 × CP1 = 3"), result.output
