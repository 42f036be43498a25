"""Loading real NeMo RL recipes unchanged, and the plan's dedup, routing and keys."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.recipes import ENV_VAR, find_nemo_rl_configs, write_ultra_checkpoint
from typer.testing import CliRunner

from podium.cli import app
from podium.config.errors import ConfigError
from podium.config.needs import teacher_needs
from podium.config.plan import load_plan
from podium.config.recipe import load_recipe, resolve_section

# In shared/nemo-rl-configs (the session fixture ``nemo_rl_configs`` finds it, or fails).
ULTRA_RECIPE = Path("examples/nemo_gym/nemotron-3-ultra/mopd.yaml")
QWEN3_RECIPE = Path("examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml")


@pytest.fixture(scope="module")
def ultra(nemo_rl_configs: Path) -> Path:
    return nemo_rl_configs / ULTRA_RECIPE


@pytest.fixture(scope="module")
def qwen3(nemo_rl_configs: Path) -> Path:
    return nemo_rl_configs / QWEN3_RECIPE


@pytest.fixture(autouse=True)
def _no_hf_home(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a login node: the Qwen3 recipe's data paths use ${oc.env:HF_HOME}.
    monkeypatch.delenv("HF_HOME", raising=False)


def test_shared_recipes_exist(nemo_rl_configs: Path, ultra: Path, qwen3: Path) -> None:
    assert ultra.is_file() and qwen3.is_file(), f"expected NeMo RL recipes under {nemo_rl_configs}"


def test_recipes_are_found_through_the_variable_or_fail_naming_what_was_tried(
        nemo_rl_configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(nemo_rl_configs))
    assert find_nemo_rl_configs(tmp_path / "repo") == nemo_rl_configs
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    missing = rf"(?s)Tried \${ENV_VAR}:.*{re.escape(str(tmp_path))}/nowhere \(does not exist\)"
    with pytest.raises(pytest.fail.Exception, match=missing):
        find_nemo_rl_configs(tmp_path / "repo")
    monkeypatch.delenv(ENV_VAR)
    (tmp_path / "repo").mkdir()
    with pytest.raises(pytest.fail.Exception) as info:
        find_nemo_rl_configs(tmp_path / "repo")  # not a git checkout, no shared/ beside it
    text = str(info.value)
    assert f"{tmp_path}/shared/nemo-rl-configs (does not exist)" in text and f"Set {ENV_VAR}=" in text, text


def test_qwen3_recipe_inherits_through_defaults(qwen3: Path) -> None:
    cfg = load_recipe(qwen3)
    # From grpo_math_1B.yaml (the parent), merged under the child's own values.
    assert cfg.policy.megatron_cfg.tensor_model_parallel_size == 2  # child wins
    assert "grpo" in cfg and cfg.grpo.num_prompts_per_step == 8
    assert cfg.policy.max_grad_norm == 1.0  # only in the parent
    plan = load_plan(qwen3)
    (teacher,) = plan.teachers
    assert teacher.model_name == "Qwen/Qwen3-1.7B"  # a hub id stays as written
    assert (teacher.num_nodes, teacher.gpus_per_node, teacher.tensor_model_parallel_size) == (1, 8, 2)
    assert teacher.data_parallel_size == 4


def test_unread_unresolvable_parts_do_not_matter_but_read_ones_are_named(qwen3: Path) -> None:
    cfg = load_recipe(qwen3)
    with pytest.raises(ConfigError, match=r"data\.train\.data_path: cannot resolve .*HF_HOME"):
        resolve_section(cfg, "data")


def test_ultra_recipe_dedups_26_aliases_to_one_teacher(ultra: Path) -> None:
    plan = load_plan(ultra)
    assert plan.totals == {"teachers": 1, "aliases": 26, "replicas": 1, "nodes": 4, "nodes_without_dedup": 104}
    (teacher,) = plan.teachers
    assert teacher.expert_model_parallel_size == 16 and teacher.context_parallel_size == 2
    assert teacher.megatron_cfg_overrides == {
        "moe_token_dispatcher_type": "alltoall",
        "moe_flex_dispatcher_backend": "deepep",
    }


def test_the_plan_states_what_the_ultra_teacher_needs(ultra: Path, qwen3: Path, ultra_checkpoint: Path) -> None:
    """`podium plan` says in words what TP8·CP2·EP16 on 4×4 GPUs takes; a plain teacher needs only GPUs.
    (The recipe's own checkpoint is a placeholder `plan` refuses, as `up` does: a stand-in replaces it.)"""
    result = CliRunner().invoke(app, ["plan", str(ultra), f"_teachers.general={ultra_checkpoint}"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    needs = [line.strip() for line in result.output.splitlines() if line.strip().startswith("needs:")]
    text = "\n".join(needs)
    assert "4 node(s) × 4 = 16 GPUs in one allocation, bf16" in needs[0], text
    assert "TP8 is wider than a node (4 per node)" in text
    assert "EP16·ETP1: each expert group spans 16 of the 16 ranks" in text and "multiple of 16" in text
    assert "CP2: context parallelism needs TransformerEngine's attention on CUDA" in text
    for teacher in load_plan(qwen3).teachers:
        needs = teacher_needs(teacher)
        assert len(needs) == 1 and f"{teacher.gpus_per_node} = " in needs[0], needs


def test_ultra_recipe_with_two_teacher_overrides_plans_three_teachers(ultra: Path) -> None:
    plan = load_plan(ultra, ["_teachers.reasoning=/ckpt/r", "_teachers.swe=/ckpt/s"])
    assert plan.totals["teachers"] == 3 and plan.totals["nodes"] == 12
    by_ckpt = {t.model_name: t for t in plan.teachers}
    assert set(by_ckpt) == {"/ckpt/r", "/ckpt/s", "/path/to/general_teacher"}
    assert len(by_ckpt["/ckpt/r"].aliases) == 5 and len(by_ckpt["/ckpt/s"].aliases) == 9
    assert plan.route("mcqa_simple_agent").model_name == "/ckpt/r"
    # Unmapped agents go to the default alias (lc_judge_simple_agent -> general).
    assert plan.route("some_new_agent").model_name == "/path/to/general_teacher"


def test_cli_plan_json_matches_contract(ultra: Path, ultra_checkpoint: Path, tmp_path: Path) -> None:
    swe = write_ultra_checkpoint(tmp_path / "swe")
    result = CliRunner().invoke(app, ["plan", str(ultra), f"_teachers.general={ultra_checkpoint}",
                                      f"_teachers.swe={swe}", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["totals"] == {"teachers": 2, "aliases": 26, "replicas": 2, "nodes": 8, "nodes_without_dedup": 104}
    row = data["teachers"][0]
    for key in ("key", "name", "aliases", "model_name", "num_nodes", "gpus_per_node",
                "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                "expert_model_parallel_size", "precision", "micro_batch_size", "megatron_cfg_overrides"):
        assert key in row
    assert set(data["routes"].values()) == {t["key"] for t in data["teachers"]}
    assert data["default_alias"] == "lc_judge_simple_agent"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


MINI = """\
on_policy_distillation:
  teacher_model_by_agent_name: {a: ./ckpt/one, b: ./ckpt/one/, c: ./other}
  default_teacher_alias: a
  non_colocated_teachers:
    default_teacher_cfg: {num_nodes: 1, gpus_per_node: 4, tensor_model_parallel_size: 2}
"""


def test_defaults_list_recursion_and_override_marker(tmp_path: Path) -> None:
    write(tmp_path, "base/grand.yaml", "x: {a: 1, b: 2}\ny: {keep: 1, drop: 2}\nn: 1\n")
    write(tmp_path, "base/parent.yaml", "defaults: grand.yaml\nx: {b: 3}\nn: 2\n")
    write(tmp_path, "other.yaml", "z: ${mul:${n}, 3}\n")
    child = write(tmp_path, "child.yaml", """\
        defaults: [base/parent.yaml, other.yaml]
        y: {_override_: true, only: 9}
        w: ${add:1,2,3}
        d: ${div:7,2}
        m: ${max:4,9}
        """)
    cfg = load_recipe(child)
    assert resolve_section(cfg, "x") == {"a": 1, "b": 3}  # merged through two levels
    assert resolve_section(cfg, "y") == {"only": 9}  # replaced, not merged
    assert resolve_section(cfg, "z") == 6 and resolve_section(cfg, "w") == 6
    assert resolve_section(cfg, "d") == 3.5 and resolve_section(cfg, "m") == 9


def test_overrides_set_add_delete(tmp_path: Path) -> None:
    path = write(tmp_path, "r.yaml", "a: {b: 1, c: [1, 2]}\n")
    cfg = load_recipe(path, ["a.b=7", "+a.new=[3, 4]", "~a.c", "++a.forced=null", "a.b=${a.new}"])
    assert resolve_section(cfg, "a") == {"b": [3, 4], "new": [3, 4], "forced": None}


def test_dedup_normalises_paths_and_symlinks(tmp_path: Path) -> None:
    (tmp_path / "ckpt" / "one").mkdir(parents=True)
    (tmp_path / "other").symlink_to(tmp_path / "ckpt" / "one")
    plan = load_plan(write(tmp_path, "r.yaml", MINI))
    (teacher,) = plan.teachers  # ./ckpt/one, ./ckpt/one/ and a symlink to it are one checkpoint
    assert teacher.aliases == ("a", "b", "c") and teacher.name == "a"
    assert teacher.model_name == str((tmp_path / "ckpt" / "one").resolve())
    assert plan.totals["nodes_without_dedup"] == 3


def test_home_relative_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    plan = load_plan(write(tmp_path, "sub/r.yaml", MINI.replace("./ckpt/one/", "~/ckpt")))
    assert plan.teacher("b").model_name == str(tmp_path / "ckpt")


def test_without_dedup_each_alias_gets_and_is_routed_to_its_own_teacher(tmp_path: Path) -> None:
    text = MINI.replace("default_teacher_alias: a",
                        "default_teacher_alias: a\n  deduplicate_shared_teacher_checkpoints: false")
    plan = load_plan(write(tmp_path, "r.yaml", text))
    assert [t.aliases for t in plan.teachers] == [("a",), ("b",), ("c",)]
    assert len({t.key for t in plan.teachers}) == 3
    assert plan.route("b").aliases == ("b",) and plan.route("a").aliases == ("a",)


def test_routing_default_and_strict(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, "r.yaml", MINI))
    assert plan.route("unknown").name == "a"
    strict = load_plan(write(tmp_path, "s.yaml", MINI.replace(
        "default_teacher_alias: a", "default_teacher_alias: a\n  strict_agent_name_match: true")))
    with pytest.raises(LookupError, match="'unknown' has no teacher and strict agent-name matching is on"):
        strict.route("unknown")
    no_default = load_plan(write(tmp_path, "n.yaml", MINI.replace("  default_teacher_alias: a\n", "")))
    with pytest.raises(LookupError, match="no default alias is set"):
        no_default.route("unknown")


def test_megatron_keys_fold_into_megatron_overrides_and_parallel_sizes_apply(tmp_path: Path) -> None:
    """A block key that is no teacher setting folds into megatron_cfg_overrides, as in NeMo RL (a key
    that is no Megatron key either is refused: test_teacher_keys.py)."""
    text = MINI.replace(
        "tensor_model_parallel_size: 2}",
        "tensor_model_parallel_size: 2, sequence_parallel: true, init_method_std: 1,"
        " megatron_cfg_overrides: {init_method_std: 2, pipeline_model_parallel_size: 2}}",
    )
    spec = load_plan(write(tmp_path, "r.yaml", text)).teachers[0]
    assert spec.megatron_cfg_overrides == {"sequence_parallel": True, "init_method_std": 2}  # explicit wins
    assert spec.pipeline_model_parallel_size == 2 and spec.data_parallel_size == 1


def test_key_is_stable_and_changes_with_what_makes_a_teacher(tmp_path: Path) -> None:
    path = write(tmp_path, "r.yaml", MINI)
    key = load_plan(path).teachers[0].key
    assert key == load_plan(path).teachers[0].key
    changed = {
        load_plan(path, [o]).teacher("a").key
        for o in (
            "on_policy_distillation.non_colocated_teachers.default_teacher_cfg.tensor_model_parallel_size=4",
            "+on_policy_distillation.non_colocated_teachers.default_teacher_cfg.precision=fp32",
            "+on_policy_distillation.non_colocated_teachers.default_teacher_cfg.init_method_std=0.01",
            "+podium.teachers.a.slurm.partition=big",
        )
    }
    assert key not in changed and len(changed) == 4


def test_launcher_file_merges_over_recipe_section(tmp_path: Path) -> None:
    recipe = write(tmp_path, "r.yaml", MINI + "podium: {slurm: {partition: a, qos: q}}\n")
    launcher = write(tmp_path, "l.yaml",
                     "podium:\n  slurm: {partition: b}\n  teachers: {c: {slurm: {time: '1:00:00'}}}\n")
    plan = load_plan(recipe, [], launcher)
    slurm = plan.teacher("a").launcher.slurm
    assert (slurm.partition, slurm.qos, slurm.time) == ("b", "q", "04:00:00")
    assert plan.teacher("c").launcher.slurm.time == "1:00:00"  # only teacher c's
    bare = write(tmp_path, "bare.yaml", "cluster: local\n")
    assert load_plan(recipe, [], bare).launcher.cluster == "local"


def test_launcher_overrides_of_any_alias_apply_to_its_teacher(tmp_path: Path) -> None:
    text = MINI + "podium: {teachers: {b: {slurm: {partition: x}}, a: {ray: {interface: ib0}}}}\n"
    spec = load_plan(write(tmp_path, "r.yaml", text)).teacher("a")
    assert spec.aliases == ("a", "b")
    assert spec.launcher.slurm.partition == "x" and spec.launcher.ray.interface == "ib0"


def test_launcher_overrides_that_differ_within_a_teacher_are_an_error(tmp_path: Path) -> None:
    text = MINI + "podium: {teachers: {a: {slurm: {partition: x}}, b: {slurm: {partition: y}}}}\n"
    with pytest.raises(ConfigError, match=r"podium.teachers.a.slurm.partition \('x'\) and "
                       r"podium.teachers.b.slurm.partition \('y'\) disagree"):
        load_plan(write(tmp_path, "r.yaml", text))


def test_login_node_commands_import_nothing_heavy(ultra: Path) -> None:
    code = (
        f"import sys, runpy; sys.argv = ['podium', 'plan', {str(ultra)!r}, '--json'];"
        "from podium.cli import app\n"
        "try: app()\n"
        "except SystemExit: pass\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', 'megatron', 'transformers')]\n"
        "sys.stderr.write('HEAVY=' + ','.join(heavy))"
    )
    for argv_code in (code, code.replace(f"'plan', {str(ultra)!r}, '--json'", "'--help'")):
        out = subprocess.run([sys.executable, "-c", argv_code], capture_output=True, text=True,
                             env={**os.environ, "COLUMNS": "120"})
        assert "HEAVY=" in out.stderr, out.stderr
        assert out.stderr.rsplit("HEAVY=", 1)[1].strip() == ""


def test_embedded_example_plans_without_a_recipe_argument(hub_cache: Path) -> None:
    """(Its teachers are hub ids: the cache holds them, as a site's would.)"""
    result = CliRunner().invoke(app, ["plan", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert data["totals"] == {"teachers": 3, "aliases": 6, "replicas": 3, "nodes": 4, "nodes_without_dedup": 9}


def test_the_example_shows_its_layout_where_its_hub_ids_are_not_cached(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A first `podium plan` on a fresh machine (an empty HF cache): the example's layout, exit 0,
    one line saying its checkpoints were not looked for; the same file as a recipe is refused."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    result = CliRunner().invoke(app, ["plan"])
    assert result.exit_code == 0, result.output
    assert "3 unique teacher(s) for 6 alias(es)" in result.output
    assert "the example's checkpoints were not checked (3 not found here" in result.output
    assert "hf download" not in result.output  # no refusal text for a file the user did not write
    from podium.cli import EXAMPLE_RECIPE

    as_recipe = CliRunner().invoke(app, ["plan", str(EXAMPLE_RECIPE)])
    assert as_recipe.exit_code == 2 and "hf download Qwen/Qwen3-8B" in as_recipe.output
