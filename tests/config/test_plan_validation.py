"""Every recipe error `podium plan` must refuse: exit code 2, the key path (or file) named, nothing
written. Runs the real CLI through typer's runner on small recipe files."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from podium.cli import app

OPD = "on_policy_distillation"
NCT = f"{OPD}.non_colocated_teachers"

BASE = """\
on_policy_distillation:
  teacher_model_by_agent_name:
    math: /ckpt/math
    code: /ckpt/math
    chat: /ckpt/chat
  default_teacher_alias: chat
  non_colocated_teachers:
    default_teacher_cfg:
      tensor_model_parallel_size: 2
      pipeline_model_parallel_size: 1
      context_parallel_size: 1
      num_nodes: 1
      gpus_per_node: 8
      precision: bf16
      micro_batch_size: 1
"""


def run_plan(tmp_path: Path, text: str, *args: str):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(text))
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(app, ["plan", str(recipe), *args])
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "plan must write nothing"
    return result


def with_extra(extra: str) -> str:
    return BASE + textwrap.dedent(extra)


CASES = {
    "empty mapping": (
        BASE.replace("    math: /ckpt/math\n    code: /ckpt/math\n    chat: /ckpt/chat\n", "    {}\n")
        .replace("  default_teacher_alias: chat\n", ""),
        [],
        f"{OPD}.teacher_model_by_agent_name: must be a non-empty mapping",
    ),
    "default alias not a key": (BASE, [f"{OPD}.default_teacher_alias=chta"],
                                f"{OPD}.default_teacher_alias: 'chta' is not an alias"),
    "zero nodes": (BASE, [f"{NCT}.default_teacher_cfg.num_nodes=0"],
                   f"{NCT}.default_teacher_cfg.num_nodes: must be a positive integer, got 0"),
    "fractional size in an override": (
        BASE.replace("      micro_batch_size: 1\n",
                     "      micro_batch_size: 1\n    teacher_overrides:\n      chat:\n        num_nodes: 1.5\n"),
        [],
        f"{NCT}.teacher_overrides.chat.num_nodes: must be a positive integer, got 1.5",
    ),
    "string size": (BASE, [f"{NCT}.default_teacher_cfg.tensor_model_parallel_size=two"],
                    f"{NCT}.default_teacher_cfg.tensor_model_parallel_size: must be a positive integer"),
    "layout does not divide": (
        BASE, [f"{NCT}.default_teacher_cfg.pipeline_model_parallel_size=3"],
        "1 nodes × 8 GPUs = 8 GPUs is not divisible by TP2 × PP3 × CP1 = 6",
    ),
    "expert parallel does not fit": (
        BASE, [f"+{NCT}.default_teacher_cfg.expert_model_parallel_size=16"],
        "per stage is not divisible by EP16 × ETP1 = 16",
    ),
    "bad precision": (BASE, [f"{NCT}.default_teacher_cfg.precision=fp8"],
                      f"{NCT}.default_teacher_cfg.precision: must be one of bf16, fp16, fp32, got 'fp8'"),
    "unknown podium key": (with_extra("""\
        podium:
          slurm:
            partiton: batch
        """), [], "podium.slurm.partiton: unknown key (did you mean 'partition'?)"),
    "unknown per-teacher podium key": (with_extra("""\
        podium:
          teachers:
            chat:
              server: {port_rnage: [1, 2]}
        """), [], "podium.teachers.chat.server.port_rnage: unknown key"),
    "bad slurm time": (with_extra("""\
        podium:
          slurm: {time: 4h}
        """), [], "podium.slurm.time: Value error, expected a Slurm time"),
    "podium teacher alias unknown": (with_extra("""\
        podium:
          teachers:
            chta: {}
        """), [], "podium.teachers.chta: not an alias"),
    "teacher_overrides alias unknown": (
        BASE.replace("      micro_batch_size: 1\n",
                     "      micro_batch_size: 1\n    teacher_overrides:\n      maths: {num_nodes: 2}\n"),
        [], f"{NCT}.teacher_overrides.maths: not an alias",
    ),
    "yaml syntax error": (BASE + "podium: [unclosed\n", [], "recipe.yaml, line "),
    "unresolvable interpolation": (
        BASE.replace("math: /ckpt/math", "math: ${_teachers.nope}"), [],
        f"{OPD}.teacher_model_by_agent_name.math: cannot resolve '${{_teachers.nope}}'",
    ),
    "shared checkpoint, different settings": (
        BASE.replace("      micro_batch_size: 1\n",
                     "      micro_batch_size: 1\n    teacher_overrides:\n      code: {precision: fp32}\n"),
        [], "aliases 'math' and 'code' share checkpoint /ckpt/math but ask for different settings: "
            "precision ('bf16' vs 'fp32')",
    ),
    "shared checkpoint, different fp32_lm_head": (
        BASE.replace("      micro_batch_size: 1\n",
                     "      micro_batch_size: 1\n    teacher_overrides:\n      code: {fp32_lm_head: tf32}\n"),
        [], "aliases 'math' and 'code' share checkpoint /ckpt/math but ask for different settings: "
            "fp32_lm_head (False vs 'tf32')",
    ),
    "fp32_lm_head not a setting": (BASE, [f"+{NCT}.default_teacher_cfg.fp32_lm_head=fp16"],
                                   f"{NCT}.default_teacher_cfg.fp32_lm_head: must be false, true or \"tf32\", "
                                   "got 'fp16'"),
    "override of a missing key": (BASE, [f"{OPD}.no_such_key=1"],
                                  f"key '{OPD}.no_such_key' is not in the recipe; use +"),
    "add of an existing key": (BASE, [f"+{OPD}.default_teacher_alias=math"], "already exists"),
    "delete of a missing key": (BASE, [f"~{OPD}.nope"], f"key '{OPD}.nope' does not exist"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_recipe_exits_2_naming_the_key(tmp_path: Path, case: str) -> None:
    text, overrides, expected = CASES[case]
    result = run_plan(tmp_path, text, *overrides)
    assert result.exit_code == 2, result.output
    assert expected in result.output, result.output


def test_missing_defaults_file_is_named(tmp_path: Path) -> None:
    result = run_plan(tmp_path, "defaults: base/parent.yaml\n" + BASE)
    assert result.exit_code == 2
    assert "'defaults' names 'base/parent.yaml'" in result.output
    assert str(tmp_path / "base/parent.yaml") in result.output


def test_missing_recipe_file_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert f"{tmp_path / 'nope.yaml'}: recipe file not found" in result.output


def test_missing_checkpoint_is_refused_by_plan_as_by_up(tmp_path: Path) -> None:
    """A missing checkpoint was a warning with exit 0 in `plan` while `up` refused it: now both refuse,
    with the same words, every missing checkpoint at once, each by the recipe key naming it."""
    result = run_plan(tmp_path, BASE)
    assert result.exit_code == 2, result.output
    error = (f"podium: error: 2 problems:\n  {OPD}.teacher_model_by_agent_name.math: checkpoint /ckpt/math does not "
             f"exist\n  {OPD}.teacher_model_by_agent_name.chat: checkpoint /ckpt/chat does not exist\n")
    assert result.output.endswith(error), result.output
    # the plan is shown all the same (checkpoints not staged yet): every teacher, its layout, no warning twice
    plan = result.output.removesuffix(error)
    assert "unique teacher(s)" in plan and "/ckpt/chat" in plan and "(missing)" in plan and "warning:" not in plan, plan
    recipe = tmp_path / "recipe.yaml"
    up = CliRunner().invoke(app, ["up", str(recipe), "--dry-run", "--run-dir", str(tmp_path / "run")])
    assert up.exit_code == 2 and up.output == error, up.output


def test_missing_or_unrecognised_checkpoint_is_an_error_before_submit(tmp_path: Path) -> None:
    from podium.config.errors import ConfigError
    from podium.config.plan import load_plan, require_checkpoints

    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "weights.bin").write_bytes(b"x")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(BASE.replace("/ckpt/chat", "./junk"))
    plan = load_plan(recipe)
    with pytest.raises(ConfigError) as err:
        require_checkpoints(plan)
    assert "checkpoint /ckpt/math does not exist" in str(err.value)
    assert f"checkpoint {tmp_path / 'junk'} is neither an HF directory" in str(err.value)


def _hf_dir(root: Path, name: str, config: dict) -> Path:
    import json

    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.mark.parametrize(("config", "ep", "message"), [
    ({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}, 1,
     "architecture 'Qwen3NextForCausalLM' is not supported (podium loads LlamaForCausalLM, MistralForCausalLM, "
     "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, MixtralForCausalLM, "
     "Glm4MoeForCausalLM, DeepseekV3ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, "
     "GptOssForCausalLM, "
     "GPT2LMHeadModel, NemotronHForCausalLM)"),
    ({"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 6}, 4,
     "6 experts cannot be split over EP4 (6 / 4 is not a whole number per rank); choose an EP that divides 6"),
    ({"architectures": ["LlamaForCausalLM"]}, 2,
     "expert_model_parallel_size=2 but LlamaForCausalLM has no routed experts"),
])
def test_a_checkpoint_podium_cannot_serve_is_refused_before_submit(tmp_path: Path, config: dict, ep: int,
                                                                   message: str) -> None:
    """Where the checkpoint's config is visible, its architecture and experts are checked at plan
    time: never a crash on the allocation."""
    from podium.config.errors import ConfigError
    from podium.config.plan import load_plan, require_checkpoints

    ckpt = _hf_dir(tmp_path, "ckpt", config)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(BASE.replace("/ckpt/math", str(ckpt)).replace("/ckpt/chat", str(ckpt))
                      .replace("tensor_model_parallel_size: 2",
                               f"tensor_model_parallel_size: 2\n      expert_model_parallel_size: {ep}"))
    with pytest.raises(ConfigError, match=re.escape(message)):
        require_checkpoints(load_plan(recipe))



def test_plan_and_up_warn_when_an_aliass_megatron_map_drops_default_keys(tmp_path: Path) -> None:
    """NeMo RL main merges a teacher block one level deep: ``code``'s map replaces the default's, so
    ``attention_dropout`` is gone for it. Not an error (it is what NeMo RL runs), but `plan` and
    `up` say so, naming the alias, both maps, the keys and how to keep them."""
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}
    (tmp_path / "ckpts").mkdir()
    math, code = (_hf_dir(tmp_path / "ckpts", name, config) for name in ("math", "code"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        on_policy_distillation:
          teacher_model_by_agent_name: {{math: {math}, code: {code}}}
          non_colocated_teachers:
            default_teacher_cfg:
              num_nodes: 1
              gpus_per_node: 2
              megatron_cfg_overrides: {{init_method_std: 0.02, attention_dropout: 0.0}}
            teacher_overrides:
              code: {{megatron_cfg_overrides: {{init_method_std: 0.01}}}}
        """))
    dflt = f"{NCT}.default_teacher_cfg.megatron_cfg_overrides"
    mine = f"{NCT}.teacher_overrides.code.megatron_cfg_overrides"
    words = (f"{mine} replaces {dflt} whole, as NeMo RL merges a teacher's settings ({{**default_teacher_cfg, "
             "**teacher_overrides.<alias>}, one level deep): teacher 'code' runs without the default's "
             f"attention_dropout; to keep them, repeat them in {mine}")
    plan = CliRunner().invoke(app, ["plan", str(recipe)], env={"COLUMNS": "1000"})
    assert plan.exit_code == 0, plan.output
    assert f"\nwarning: {words}\n" in plan.output, plan.output
    up = CliRunner().invoke(app, ["up", str(recipe), "--dry-run", "--run-dir", str(tmp_path / "run")])
    assert up.exit_code == 0, up.output
    assert f"podium: warning: {words}\n" in up.output, up.output
