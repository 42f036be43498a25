"""``podium plan`` of NeMo RL's Nemotron 3 Ultra MOPD recipe against an Ultra-sized ``config.json``.

The checkpoint directory (fixture ``ultra_checkpoint``, tests/fixtures/recipes.py) holds the config
(Nemotron 3 Ultra's published shape) and an empty weight index: planning reads the config, never the
weights. The recipe's TP8·CP2·EP16 on 4 × 4 GPUs plans one teacher and states what it needs; a TP
that does not divide the Mamba groups is refused naming the key and the arithmetic, before anything
is submitted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from podium.cli import app
from podium.config.errors import ConfigError
from podium.config.plan import load_plan, require_checkpoints

ULTRA_RECIPE = Path("examples/nemo_gym/nemotron-3-ultra/mopd.yaml")
TEACHER_CFG = "on_policy_distillation.non_colocated_teachers.default_teacher_cfg"


@pytest.fixture
def ultra(nemo_rl_configs: Path) -> Path:
    return nemo_rl_configs / ULTRA_RECIPE


def test_ultra_recipe_plans_one_nemotron_teacher_on_4_nodes_and_states_its_needs(ultra: Path,
                                                                                ultra_checkpoint: Path) -> None:
    plan = load_plan(ultra, [f"_teachers.general={ultra_checkpoint}"])
    require_checkpoints(plan)  # nothing refused
    assert plan.warnings == ()
    (teacher,) = plan.teachers
    assert teacher.model_name == str(ultra_checkpoint) and len(teacher.aliases) == 26
    assert (teacher.num_nodes, teacher.gpus_per_node, teacher.tensor_model_parallel_size,
            teacher.context_parallel_size, teacher.expert_model_parallel_size) == (4, 4, 8, 2, 16)

    result = CliRunner().invoke(app, ["plan", str(ultra), f"_teachers.general={ultra_checkpoint}"],
                                env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    needs = " ".join(line.strip() for line in result.output.splitlines())  # rich wraps long lines
    for said in (
        "Nemotron-H (108 layers: 48 Mamba-2, 12 attention, 48 MoE)",
        "must import the Mamba kernels (mamba-ssm and causal-conv1d",
        "pip install --no-build-isolation mamba-ssm causal-conv1d",
        "Mamba: TP8 splits mamba_num_heads=256 into 32 per rank and n_groups=8 into 1",
        "CP2 swaps the sequence split for a head split inside each Mamba layer (16 heads per rank, each group's "
        "state on 2 CP ranks)",
        "attention: 2 KV group(s) (num_key_value_heads) for TP8: supported",
        "all-gathers the fused output in every attention layer (12 attention layers) and keeps group rank // 4 "
        "with 8 of its query heads",
        "experts: 512 over EP16 = 32 per rank, top-22, latent MoE (moe_latent_size=2048); EP16·ETP1 spans 4 nodes "
        "(4 GPUs each): the token all-to-all of each of the 48 MoE layers crosses the network",
        "CP2 without sequence packing: NeMo RL's own Megatron teacher refuses CP > 1 unless "
        "policy.sequence_packing.enabled",
        "right-pads each micro-batch to a multiple of 2·CP = 4",
        "CP2: context parallelism needs TransformerEngine's attention on CUDA",
    ):
        assert said in needs, f"{said!r} not in:\n{result.output}"
    assert "warning" not in result.output
    as_json = CliRunner().invoke(app, ["plan", str(ultra), f"_teachers.general={ultra_checkpoint}", "--json"])
    assert any("mamba-ssm" in line for line in json.loads(as_json.output)["teachers"][0]["needs"])


@pytest.mark.parametrize(("overrides", "message"), [
    # TP16 on 16 GPUs (CP1): heads and KV groups fine, the 8 Mamba groups are not
    ([f"{TEACHER_CFG}.tensor_model_parallel_size=16", f"{TEACHER_CFG}.context_parallel_size=1"],
     "n_groups=8: TP16 must divide the Mamba groups (8 / 16 is not whole)"),
    # an EP that does not divide the 512 experts (n_routed_experts), on 4 × 3 GPUs at TP4 so the layout fits
    ([f"{TEACHER_CFG}.expert_model_parallel_size=3", f"{TEACHER_CFG}.gpus_per_node=3",
      f"{TEACHER_CFG}.tensor_model_parallel_size=4", f"{TEACHER_CFG}.context_parallel_size=1"],
     "512 experts cannot be split over EP3 (512 / 3 is not a whole number per rank)"),
    # PP5 on 4 × 5 GPUs (TP1·CP1, EP4 so expert parallelism fits a stage): 108 layers do not split in 5 stages
    ([f"{TEACHER_CFG}.pipeline_model_parallel_size=5", f"{TEACHER_CFG}.gpus_per_node=5",
      f"{TEACHER_CFG}.tensor_model_parallel_size=1", f"{TEACHER_CFG}.context_parallel_size=1",
      f"{TEACHER_CFG}.expert_model_parallel_size=4"],
     "hybrid_override_pattern has 108 layers: PP5 must divide them (108 / 5 is not whole; megatron-core's hybrid "
     "model gives every pipeline stage the same number of consecutive layers)"),
])
def test_a_layout_the_nemotron_teacher_cannot_take_is_refused_naming_the_key(
        ultra: Path, ultra_checkpoint: Path, overrides: list[str], message: str) -> None:
    plan = load_plan(ultra, [f"_teachers.general={ultra_checkpoint}", *overrides])
    assert any(message in w for w in plan.warnings), plan.warnings
    with pytest.raises(ConfigError, match=re.escape(f"checkpoint {ultra_checkpoint}: ") + ".*" + re.escape(message)):
        require_checkpoints(plan)


def test_kv_groups_that_tp_cannot_split_are_refused_for_any_family_naming_the_keys() -> None:
    """Plan time, every attention family: fewer KV groups than TP is fine when TP is a multiple of them."""
    from podium.config.architecture import layout_problems
    from podium.config.layout import ParallelLayout

    llama = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 24, "num_key_value_heads": 3,
             "hidden_size": 192}
    assert layout_problems(llama, ParallelLayout(gpus_per_node=8, tensor_model_parallel_size=8)) == [
        "num_attention_heads=24, num_key_value_heads=3: with fewer KV groups (3) than TP8, TP must be a multiple "
        "of them (8 / 3 is not whole)"]
    assert layout_problems(llama, ParallelLayout(gpus_per_node=6, tensor_model_parallel_size=6)) == []


def test_ultra_at_pp2_plans_and_says_which_layers_each_stage_holds(ultra: Path, ultra_checkpoint: Path) -> None:
    """TP4·CP2·PP2·EP8 on the recipe's 4 × 4 GPUs: 108 layers, 54 per stage."""
    overrides = [f"{TEACHER_CFG}.tensor_model_parallel_size=4", f"{TEACHER_CFG}.pipeline_model_parallel_size=2",
                 f"{TEACHER_CFG}.expert_model_parallel_size=8"]
    plan = load_plan(ultra, [f"_teachers.general={ultra_checkpoint}", *overrides])
    require_checkpoints(plan)  # nothing refused
    (teacher,) = plan.teachers
    assert (teacher.tensor_model_parallel_size, teacher.pipeline_model_parallel_size,
            teacher.context_parallel_size, teacher.expert_model_parallel_size) == (4, 2, 2, 8)
    result = CliRunner().invoke(app, ["plan", str(ultra), f"_teachers.general={ultra_checkpoint}", *overrides,
                                      "--json"])
    assert result.exit_code == 0, result.output
    needs = json.loads(result.output)["teachers"][0]["needs"]
    assert ("PP2: 54 consecutive layers per pipeline stage (stage 0: 24 Mamba-2, 6 attention, 24 MoE; "
            "stage 1: 24 Mamba-2, 6 attention, 24 MoE)") in needs, needs


def test_expert_tp_and_the_shared_expert_split_are_checked_at_plan_time() -> None:
    """ETP divides each routed expert's MLP; the shared expert is split over the attention TP; the
    layers each pipeline stage holds are said (a tiny ``MEM*-E`` Nemotron-H, latent MoE)."""
    from podium.config.architecture import architecture_needs, layout_problems
    from podium.config.layout import ParallelLayout

    tiny = {"model_type": "nemotron_h", "hybrid_override_pattern": "MEM*-E", "num_attention_heads": 4,
            "num_key_value_heads": 2, "hidden_size": 64, "head_dim": 16, "mamba_num_heads": 8, "n_groups": 2,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 48, "moe_latent_size": 32}
    assert layout_problems(tiny, ParallelLayout(gpus_per_node=3, expert_tensor_parallel_size=3)) == [
        "moe_intermediate_size=32: ETP3 must divide each routed expert's MLP (32 / 3 is not whole)"]
    assert layout_problems({**tiny, "moe_shared_expert_intermediate_size": 45},
                           ParallelLayout(gpus_per_node=4, tensor_model_parallel_size=2)) == [
        "moe_shared_expert_intermediate_size=45: TP2 must divide the shared expert's MLP, which is split over the "
        "attention TP (45 / 2 is not whole)"]
    layout = ParallelLayout(num_nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
                            pipeline_model_parallel_size=2, expert_tensor_parallel_size=2)
    assert layout_problems(tiny, layout) == []
    needs = architecture_needs(tiny, layout)
    assert ("experts: 4 over EP1 = 4 per rank, top-2, latent MoE (moe_latent_size=32); ETP2 splits each expert's "
            "MLP (moe_intermediate_size=32) into 16 per rank; the latent projections are whole on every rank") in needs
    assert ("PP2: 3 consecutive layers per pipeline stage (stage 0: 2 Mamba-2, 1 MoE; stage 1: 1 attention, 1 MoE, "
            "1 MLP)") in needs


@pytest.mark.parametrize("width", [100, 120])
def test_the_plan_keeps_the_teacher_name_and_every_alias_whole_at_100_and_120_columns(
        ultra: Path, ultra_checkpoint: Path, width: int) -> None:
    """Ultra's general teacher is named after its first alias, ``math_with_judge_simple_agent``: at a
    terminal's usual width the table shows it on one line, and each of its 26 aliases is whole."""
    result = CliRunner().invoke(app, ["plan", str(ultra), f"_teachers.general={ultra_checkpoint}"],
                                env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line.rstrip()) <= width for line in lines)
    (row,) = [line for line in lines if line.startswith("math_with_judge_simple_agent ") and "serves" not in line]
    assert re.search(r" [0-9a-f]{12} ", row), row  # its key on the same line
    (teacher,) = load_plan(ultra, [f"_teachers.general={ultra_checkpoint}"]).teachers
    for alias in teacher.aliases:
        assert any(re.search(rf"(^|[ ,]){alias}(,|$)", line.rstrip()) for line in lines), alias
