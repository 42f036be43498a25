"""Every key of a NeMo RL teacher block is judged on the login node, as a user meets it: the CLI
as a subprocess with megatron-core and torch unimportable (a login node's ``pip install podium``),
on NeMo RL's own recipes (shared/nemo-rl-configs) plus the mistake.

- a typo in a teacher block, a Megatron key typo in the block, in ``megatron_cfg_overrides`` and as
  a ``++``/``key=value`` override: ``plan`` and ``up --dry-run`` refuse it (exit 2, the same
  words), naming the key as the user wrote it (its full key path) and the closest valid key;
- today's NeMo RL teacher keys: ``fp32_lm_head`` (false | true | "tf32", and the spellings NeMo RL's
  pydantic field reads) accepted, carried in the spec and honoured (no "not honoured" note; a note
  where it changes nothing: an fp32 teacher), the training-only keys (``use_fused_linear_logprobs``,
  ``segment_size``, ``mtp_*``) accepted with a note saying why they are skipped, a cross-tokenizer
  teacher refused with a reason;
- what ``up`` refuses, ``plan`` refuses, every problem at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

OPD = "on_policy_distillation"
BLOCK = f"{OPD}.non_colocated_teachers.default_teacher_cfg"
ALIAS_BLOCK = f"{OPD}.non_colocated_teachers.teacher_overrides.default_teacher"
# gpus_per_node: 8, bf16, TP2; its teacher is a hub id (Qwen/Qwen3-1.7B), which plan looks up in the
# local HF cache: the fixture hub_cache holds it, for every test here
QWEN3 = Path("examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml")
DISTILLATION = Path("examples/configs/distillation_math.yaml")
WITHOUT = ("torch", "megatron", "megatron.core", "transformers", "ray")
UNKNOWN = ("unknown key: not a TransformerConfig field of megatron-core 0.16/0.19, nor a NeMo RL megatron_cfg key "
           "podium knows")
UNKNOWN_IN_BLOCK = UNKNOWN.replace("unknown key: not ", "unknown key: not a teacher setting, nor ")
pytestmark = pytest.mark.usefixtures("hub_cache")


def podium(*args: str | Path) -> subprocess.CompletedProcess:
    """``podium *args`` in a Python that cannot import megatron-core, torch, transformers or Ray."""
    code = (f"import sys; sys.modules.update(dict.fromkeys({WITHOUT!r})); "
            "from podium.cli import main; sys.argv[0] = 'podium'; main()")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "COLUMNS": "200"})


def refused_alike(tmp_path: Path, recipe: Path, *overrides: str) -> str:
    """``plan`` and ``up --dry-run`` of ``recipe``: both exit 2 with the same error; it is returned.
    ``plan`` still shows the plan where one could be made (problems of the checkpoints, not the recipe)."""
    plan = podium("plan", recipe, *overrides)
    up = podium("up", recipe, *overrides, "--dry-run", "--run-dir", tmp_path / "run")
    assert plan.returncode == up.returncode == 2, (plan.stderr, up.stderr)
    assert up.stdout == "" and plan.stderr == up.stderr, (plan.stderr, up.stderr)
    assert plan.stdout == "" or "unique teacher(s)" in plan.stdout, plan.stdout
    assert plan.stderr.startswith("podium: error: ") and "Traceback" not in plan.stderr, plan.stderr
    assert not (tmp_path / "run").exists()
    return plan.stderr


def user_recipe(tmp_path: Path, parent: Path, text: str) -> Path:
    """The user's recipe: NeMo RL's ``parent`` (its ``defaults:``) and ``text`` over it."""
    path = tmp_path / "recipe.yaml"
    path.write_text(f"defaults: {parent}\n" + textwrap.dedent(text))
    return path


def teacher_cfg(lines: str, alias: str | None = None) -> str:
    block = f"teacher_overrides:\n      {alias}:" if alias else "default_teacher_cfg:"
    body = textwrap.indent(textwrap.dedent(lines), "        " if alias else "      ")
    return f"{OPD}:\n  non_colocated_teachers:\n    {block}\n{body}"


@pytest.mark.parametrize(("block", "alias", "expected"), [
    ("precison: fp32\n", None, f"{BLOCK}.precison: {UNKNOWN_IN_BLOCK} (did you mean 'precision'?)"),
    ("tensor_model_paralel_size: 4\n", None,
     f"{BLOCK}.tensor_model_paralel_size: {UNKNOWN_IN_BLOCK} (did you mean 'tensor_model_parallel_size'?)"),
    ("micro_batch_sizes: 2\n", "default_teacher",
     f"{ALIAS_BLOCK}.micro_batch_sizes: {UNKNOWN_IN_BLOCK} (did you mean 'micro_batch_size'?)"),
    ("megatron_cfg_overrides: {moe_token_dispatcher_typ: alltoall}\n", None,
     f"{BLOCK}.megatron_cfg_overrides.moe_token_dispatcher_typ: {UNKNOWN} (did you mean 'moe_token_dispatcher_type'?)"),
])
def test_a_typo_in_a_teacher_block_is_refused_naming_its_key_and_the_closest(
        nemo_rl_configs: Path, tmp_path: Path, block: str, alias: str | None, expected: str) -> None:
    recipe = user_recipe(tmp_path, nemo_rl_configs / QWEN3, teacher_cfg(block, alias))
    assert refused_alike(tmp_path, recipe) == f"podium: error: {expected}\n"
    if alias is None and block.startswith("precison"):  # doctor plans the recipe first, as up does
        doctor = podium("doctor", recipe, "--run-dir", tmp_path / "run")
        assert doctor.returncode == 2 and doctor.stderr == f"podium: error: {expected}\n", doctor.stderr


@pytest.mark.parametrize(("override", "expected"), [
    (f"++{BLOCK}.tensor_model_paralel_size=4",
     f"{BLOCK}.tensor_model_paralel_size: {UNKNOWN_IN_BLOCK} (did you mean 'tensor_model_parallel_size'?)"),
    (f"+{BLOCK}.megatron_cfg_overrides.tensor_model_paralel_size=4",
     f"{BLOCK}.megatron_cfg_overrides.tensor_model_paralel_size: {UNKNOWN} "
     "(did you mean 'tensor_model_parallel_size'?)"),
    (f"{BLOCK}.tensor_model_paralel_size=4",
     f"override '{BLOCK}.tensor_model_paralel_size=4': key '{BLOCK}.tensor_model_paralel_size' is not in the "
     f"recipe (did you mean '{BLOCK}.tensor_model_parallel_size'?); use +{BLOCK}.tensor_model_paralel_size=… to "
     "add it"),
    # the block's own name misspelt: every teacher would silently keep the defaults
    (f"++{OPD}.non_colocated_teachers.default_teacher_cgf.precision=fp32",
     f"{OPD}.non_colocated_teachers.default_teacher_cgf: unknown key (did you mean 'default_teacher_cfg'?)"),
    # a key the recipe lacks but the block may hold: the suggestion comes from the rule, not the recipe
    (f"{BLOCK}.expert_model_paralel_size=4",
     f"override '{BLOCK}.expert_model_paralel_size=4': key '{BLOCK}.expert_model_paralel_size' is not in the "
     f"recipe (did you mean '{BLOCK}.expert_model_parallel_size'?); use +{BLOCK}.expert_model_paralel_size=… to "
     "add it"),
])
def test_a_typo_in_an_override_is_refused_naming_its_key_and_the_closest(
        nemo_rl_configs: Path, tmp_path: Path, override: str, expected: str) -> None:
    """``++`` (set whatever exists) once put the typo into megatron_cfg_overrides unseen."""
    assert refused_alike(tmp_path, nemo_rl_configs / QWEN3, override) == f"podium: error: {expected}\n"


def test_todays_nemo_rl_teacher_keys_are_accepted_carried_or_skipped_with_a_reason(
        nemo_rl_configs: Path, tmp_path: Path) -> None:
    recipe = user_recipe(tmp_path, nemo_rl_configs / QWEN3, teacher_cfg("""\
        fp32_lm_head: tf32
        use_fused_linear_logprobs: false
        segment_size: 2
        mtp_num_layers: 5
        mtp_detach_heads: true
        megatron_cfg_overrides: {fused_linear_logprobs_chunk_size: 256, mtp_use_repeated_layer: true}
        """))
    planned = podium("plan", recipe, "--json")
    assert planned.returncode == 0, planned.stderr
    data = json.loads(planned.stdout)
    (teacher,) = data["teachers"]
    assert teacher["fp32_lm_head"] == "tf32"  # carried in the spec
    plain = json.loads(podium("plan", nemo_rl_configs / QWEN3, "--json").stdout)["teachers"][0]
    assert plain["fp32_lm_head"] is False and plain["key"] != teacher["key"]  # part of what the teacher is
    notes = "\n".join(data["notes"])
    assert f"{BLOCK}.fp32_lm_head" not in notes  # honoured (podium.teacher.model.output_gemm): nothing to say
    for key in ("use_fused_linear_logprobs", "segment_size", "mtp_num_layers", "mtp_detach_heads",
                "megatron_cfg_overrides.fused_linear_logprobs_chunk_size",
                "megatron_cfg_overrides.mtp_use_repeated_layer"):
        assert f"{BLOCK}.{key}: skipped: " in notes, (key, notes)
    assert "podium.slurm.extra_sbatch: {segment: <num_nodes>}" in notes and "loads no mtp.* weights" in notes
    up = podium("up", recipe, "--dry-run", "--run-dir", tmp_path / "run")
    assert up.returncode == 0, up.stderr
    assert f"podium: note: {BLOCK}.segment_size: skipped: " in up.stderr
    for value in ("true", "false"):
        assert podium("plan", recipe, f"{BLOCK}.fp32_lm_head={value}").returncode == 0
    fp32 = podium("plan", recipe, "--json", f"++{BLOCK}.precision=fp32")
    assert fp32.returncode == 0, fp32.stderr
    assert (f"{BLOCK}.fp32_lm_head: 'tf32' changes nothing for this teacher: its precision is fp32, so its logits "
            "are fp32 already") in json.loads(fp32.stdout)["notes"]


@pytest.mark.parametrize(("value", "setting"), [
    (None, False), (False, False), (True, True), ("tf32", "tf32"),
    # NeMo RL's TeacherResourceConfig is pydantic: its bool field reads these spellings too
    ("true", True), ("False", False), ("yes", True), ("off", False), ("1", True), (0, False), (1, True),
])
def test_fp32_lm_head_is_read_as_nemo_rl_reads_it(value, setting) -> None:
    from podium.config.teacher_keys import fp32_lm_head_setting

    assert fp32_lm_head_setting(value) == setting and type(fp32_lm_head_setting(value)) is type(setting)


@pytest.mark.parametrize("value", ["fp16", "TF32", "", 2, 0.5, [True]])
def test_fp32_lm_head_refuses_what_nemo_rl_refuses(value) -> None:
    from podium.config.teacher_keys import fp32_lm_head_setting

    with pytest.raises(ValueError, match=r'^must be false, true or "tf32", got '):
        fp32_lm_head_setting(value)


def test_a_cross_tokenizer_teacher_is_refused_at_plan_saying_it_is_not_served_yet(
        nemo_rl_configs: Path, tmp_path: Path) -> None:
    recipe = user_recipe(tmp_path, nemo_rl_configs / QWEN3, teacher_cfg("cross_tokenizer: true\n"))
    assert refused_alike(tmp_path, recipe) == (
        f"podium: error: {BLOCK}.cross_tokenizer: a cross-tokenizer teacher is not served yet: podium serves "
        "teachers that share the student's tokenizer (it answers for the student's token ids); serve this teacher "
        "with NeMo RL's own cross-tokenizer distillation, or remove cross_tokenizer\n")
    assert podium("plan", recipe, f"{BLOCK}.cross_tokenizer=false").returncode == 0
    # NeMo RL's X-Token recipes list their teachers (distillation_math.yaml with `teacher: null`)
    (tmp_path / "xtoken").mkdir()
    xtoken = user_recipe(tmp_path / "xtoken", nemo_rl_configs / DISTILLATION, """\
        teacher: null
        teachers:
          - {model_name: Qwen/Qwen3-4B, projection_matrix_path: /data/projection.pt}
        """)
    assert refused_alike(tmp_path / "xtoken", xtoken).startswith(
        "podium: error: teachers: a cross-tokenizer (X-Token) distillation recipe: a cross-tokenizer teacher is "
        "not served yet")


def test_plan_refuses_what_up_refuses_every_problem_at_once(nemo_rl_configs: Path, tmp_path: Path) -> None:
    """Key typos, a bad value, a key in the wrong place and a missing checkpoint: one error, one line
    each, its key path first; `plan` and `up --dry-run` alike."""
    recipe = user_recipe(tmp_path, nemo_rl_configs / QWEN3, f"""\
        {OPD}:
          teacher_model_by_agent_name: {{default_teacher: Qwen/Qwen3-1.7B, math: {tmp_path}/no/such/ckpt}}
          non_colocated_teachers:
            default_teacher_cfg:
              precison: fp32
              fp32_lm_head: fp16
              megatron_cfg_overrides: {{fp32_lm_head: tf32}}
            teacher_overrides:
              math: {{pipeline_model_parallel_size: 3}}
        """)
    assert refused_alike(tmp_path, recipe) == "podium: error: 5 problems:\n" + "".join(f"  {line}\n" for line in (
        f"{BLOCK}.fp32_lm_head: must be false, true or \"tf32\", got 'fp16'",
        f"{BLOCK}.precison: {UNKNOWN_IN_BLOCK} (did you mean 'precision'?)",
        f"{BLOCK}.megatron_cfg_overrides.fp32_lm_head: a teacher setting: set it in the teacher block "
        "(default_teacher_cfg.fp32_lm_head or teacher_overrides.<alias>.fp32_lm_head), not inside "
        "megatron_cfg_overrides, as NeMo RL requires",
        f"{BLOCK}.num_nodes, {BLOCK}.gpus_per_node, {BLOCK}.tensor_model_parallel_size, "
        f"{OPD}.non_colocated_teachers.teacher_overrides.math.pipeline_model_parallel_size, "
        f"{BLOCK}.context_parallel_size: teacher 'math': 1 nodes × 8 GPUs = 8 GPUs is not divisible by "
        "TP2 × PP3 × CP1 = 6",
        f"{OPD}.teacher_model_by_agent_name.math: checkpoint {tmp_path}/no/such/ckpt does not exist",
    ))


def test_layouts_a_checkpoint_cannot_take_are_refused_by_plan_all_at_once(
        nemo_rl_configs: Path, tmp_path: Path, tiny_llama_checkpoint: Path, tiny_gpt2_checkpoint: Path) -> None:
    """A TP that cannot split the heads, an EP on a dense model: `plan` warned and exited 0, `up`
    refused; now both refuse, both problems in one error."""
    recipe = user_recipe(tmp_path, nemo_rl_configs / QWEN3, f"""\
        {OPD}:
          teacher_model_by_agent_name: {{default_teacher: {tiny_llama_checkpoint}, gpt2: {tiny_gpt2_checkpoint}}}
          non_colocated_teachers:
            default_teacher_cfg: {{tensor_model_parallel_size: 8}}
            teacher_overrides:
              gpt2: {{tensor_model_parallel_size: 1, expert_model_parallel_size: 2}}
        """)
    error = refused_alike(tmp_path, recipe)
    assert error.startswith("podium: error: 2 problems:\n"), error
    assert (f"  {OPD}.teacher_model_by_agent_name.default_teacher: checkpoint {tiny_llama_checkpoint}: "
            "num_attention_heads=4, num_key_value_heads=2: TP8 must divide the attention heads") in error
    assert (f"  {OPD}.teacher_model_by_agent_name.gpt2: checkpoint {tiny_gpt2_checkpoint}: "
            "expert_model_parallel_size=2 but GPT2LMHeadModel has no routed experts; set it to 1") in error


def test_the_shipped_ultra_recipe_is_planned_before_its_checkpoints_are_staged(nemo_rl_configs: Path,
                                                                               tmp_path: Path) -> None:
    """NeMo RL's Ultra recipe as shipped (its teachers' paths are placeholders): `plan` shows the
    whole plan (one teacher for the 26 aliases that share the placeholder) and still refuses, exit 2,
    with `up`'s words, every problem listed."""
    recipe = nemo_rl_configs / "examples/nemo_gym/nemotron-3-ultra/mopd.yaml"
    plan = podium("plan", recipe)
    error = refused_alike(tmp_path, recipe)
    assert error == (f"podium: error: {OPD}.teacher_model_by_agent_name.math_with_judge_simple_agent: checkpoint "
                     "/path/to/general_teacher does not exist\n")
    assert "1 unique teacher(s) for 26 alias(es)" in " ".join(plan.stdout.split()), plan.stdout
    as_json = podium("plan", recipe, "--json")
    assert as_json.returncode == 2 and len(json.loads(as_json.stdout)["teachers"]) == 1
