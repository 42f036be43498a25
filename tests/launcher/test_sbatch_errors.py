"""The table of sbatch refusals (:mod:`podium.launcher.login.sbatch_errors`) on sbatch's own answers.

``CAPTURED`` (``data/sbatch_refusals.json``): what ``sbatch`` printed on the Slurm 22.05 test cluster
(``sbatch OPTION --wrap true``), kept in sync with the cluster by ``tests/integration/test_sbatch_refusals.py``.
``SLURM_TABLE``: refusals that cluster cannot produce (no accounting enforcement, no time limits), in sbatch's form
``sbatch: error: Batch job submission failed: <text>``, the text as Slurm 22.05's error table has
it (``strings libslurmfull.so``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.config.plan import load_plan
from podium.launcher.login.sbatch_errors import REFUSALS, explain, find_refusal, one_line

CAPTURED_FILE = Path(__file__).parent / "data" / "sbatch_refusals.json"
CAPTURED = {k: v for k, v in json.loads(CAPTURED_FILE.read_text()).items() if not k.startswith("_")}
CAPTURED_KIND = {"--gpus-per-node=2": "gres", "--gres=gpu:2": "gres", "--partition=nope": "partition",
                 "--constraint=nope": "constraint", "--mem=999999G": "node_config"}
FAILED = "sbatch: error: Batch job submission failed: "
SLURM_TABLE = {
    "account": "Invalid account or account/partition combination specified",
    "qos": "Invalid qos specification",
    "time": "Requested time limit is invalid (missing or exceeds some limit)",
    "policy": "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
    "partition_down": "Required partition not available (inactive or drain)",
    "node_count": "Node count specification invalid",
    "access": "Access/permission denied",
}
# what each refusal must name (with the value the job asked for) and the fix it must give
NAMES = {
    "gres": ("podium.slurm.gpus=true with gpus_per_node=2 (--gpus-per-node=2)", "podium.slurm.gpus: false"),
    "partition": ("podium.slurm.partition='nope'", "`sinfo -s`"),
    "partition_down": ("podium.slurm.partition='nope'", "choose another"),
    "account": ("podium.slurm.account='acct'", "sacctmgr show assoc"),
    "qos": ("podium.slurm.qos='prio'", "sacctmgr show assoc"),
    "time": ("podium.slurm.time='04:00:00'", "lower it"),
    "policy": ("podium.slurm.qos='prio'", "num_nodes / gpus_per_node"),
    "constraint": ("podium.slurm.constraint='h100'", "sinfo -o '%N %f'"),
    "node_config": ("podium.slurm.mem='999999G'", "podium.slurm.cpus_per_task"),
    "node_count": ("num_nodes=1", "lower num_nodes"),
    "access": ("podium.slurm.partition='nope', podium.slurm.account='acct'", "sacctmgr"),
}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("recipe")
    recipe = tmp / "recipe.yaml"
    recipe.write_text("""\
on_policy_distillation:
  teacher_model_by_agent_name: {math: /ckpt/math}
  non_colocated_teachers:
    default_teacher_cfg: {num_nodes: 1, gpus_per_node: 2}
podium:
  slurm: {partition: nope, account: acct, qos: prio, constraint: h100, mem: 999999G}
""")
    (teacher,) = load_plan(Path(recipe), []).teachers
    return teacher


def _messages() -> list[tuple[str, str]]:
    return ([(CAPTURED_KIND[o], m) for o, m in CAPTURED.items()]
            + [(k, FAILED + t + "\n") for k, t in SLURM_TABLE.items()])


@pytest.mark.parametrize(("kind", "message"), _messages())
def test_each_refusal_names_its_setting_and_fix_and_keeps_sbatch_words(spec, kind: str, message: str) -> None:
    assert find_refusal(message).kind == kind
    line = explain(message, spec)
    setting, fix = NAMES[kind]
    assert "\n" not in line and line.startswith(f"teacher {spec.label}: sbatch refused ")
    assert setting in line and fix in line
    assert f"(sbatch said: {one_line(message)})" in line


def test_every_row_is_tested_and_an_unknown_refusal_is_not_guessed(spec) -> None:
    assert {row.kind for row in REFUSALS} == set(NAMES) == set(CAPTURED_KIND.values()) | set(SLURM_TABLE)
    line = explain("sbatch: error: Batch job submission failed: Something new\n", spec)
    assert "no podium setting is known" in line and "Something new" in line


def test_settings_set_through_extra_sbatch_are_named_there(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("""\
on_policy_distillation:
  teacher_model_by_agent_name: {math: /ckpt/math}
  non_colocated_teachers:
    default_teacher_cfg: {num_nodes: 1, gpus_per_node: 1}
podium:
  slurm: {gpus: false, extra_sbatch: {partition: gpu-big}}
""")
    (teacher,) = load_plan(recipe, []).teachers
    line = explain(CAPTURED["--partition=nope"], teacher)
    assert "podium.slurm.extra_sbatch.partition='gpu-big'" in line
