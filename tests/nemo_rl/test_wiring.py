"""podium.nemo_rl logic that needs no teacher: the batch keys a NeMo RL batch carries, the
sharding NeMo RL reads, what a pickled facade carries, the wiring's errors, and the classic
distillation recipe planned as NeMo RL ships it. The same facades against a real teacher:
``tests/nemo_rl/test_dropin.py``."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from podium.config.plan import load_plan
from podium.nemo_rl import NemoRLWiringError, RemoteTeacherWorkerGroup, Sharding, teacher_worker_groups
from podium.nemo_rl.distillation import RemoteDistillationTeacher
from podium.protocol.batch import IGNORED_KEYS, BatchError, batch_inputs
from podium.rendezvous import RunLayout, build_rendezvous, create_token, write_rendezvous
from podium.rendezvous.records import ModelInfo

DISTILLATION_RECIPE = Path("examples/configs/distillation_math.yaml")
IDS = torch.tensor([[3, 4, 5], [6, 7, 0]])
LENGTHS = torch.tensor([3, 2], dtype=torch.int32)


def test_a_nemo_rl_training_batch_is_read_and_its_other_keys_ignored() -> None:
    # what distillation.py's train_data and the MOPD collector's rows carry besides the inputs
    data = {"input_ids": IDS, "input_lengths": LENGTHS, "token_mask": torch.ones(2, 3), "sample_mask": torch.ones(2),
            "loss_multiplier": torch.ones(2), "stop_strings": [None, None], "teacher_topk_logits": torch.zeros(1)}
    assert set(data) - {"input_ids", "input_lengths"} <= IGNORED_KEYS
    ids, lengths = batch_inputs(data)
    assert ids.tolist() == IDS.tolist() and lengths.tolist() == [3, 2]


@pytest.mark.parametrize(("key", "reason"), [
    ("pixel_values", "multimodal inputs are not supported"),
    ("image_grid_thw", "multimodal inputs are not supported"),
    ("routed_experts", "router replay"),
    ("attention_bias", "not an input of podium's"),
])
def test_a_key_that_would_change_a_logit_is_refused_by_name(key: str, reason: str) -> None:
    with pytest.raises(BatchError, match=rf"batch key '{key}' refused: .*{reason}"):
        batch_inputs({"input_ids": IDS, "input_lengths": LENGTHS, key: torch.zeros(2)})


def test_sharding_answers_nemo_rl_axis_names_from_the_record() -> None:
    model = ModelInfo(served_name="t", vocab_size=10, data_parallel_size=2,
                      parallel_sizes={"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2,
                                      "context_parallel_size": 1})
    sharding = Sharding(model)
    assert sharding.get_axis_size("data_parallel") == 2  # what the MOPD collector pads rows to
    assert sharding.shape == {"pipeline_parallel": 2, "data_parallel": 2, "context_parallel": 1, "tensor_parallel": 4}
    assert (sharding.names, sharding.ndim, sharding.size) == (list(sharding.shape), 4, 16)
    with pytest.raises(KeyError, match="no axis 'expert'"):
        sharding.get_axis_size("expert")


def test_a_pickled_facade_carries_names_not_connections(tmp_path: Path) -> None:
    model = ModelInfo(served_name="t", vocab_size=10)
    group = RemoteTeacherWorkerGroup(tmp_path / "rendezvous.json", "math", model=model)
    group._client = object()  # a connection in this process (unpicklable on purpose)
    copy = pickle.loads(pickle.dumps(group))
    assert copy._client is None and copy.alias == "math" and copy.model == model
    assert copy.sharding_annotations.get_axis_size("data_parallel") == 1
    assert (copy.use_sequence_packing, copy.sequence_length_pad_multiple, copy.worker_group.workers) == (False, 1, [])
    teacher = pickle.loads(pickle.dumps(RemoteDistillationTeacher(tmp_path / "r.json", "t", model=model,
                                                                  values_datatype="BF16")))
    assert teacher.values_datatype == "BF16"
    teacher.prepare_for_lp_inference()  # the loop's memory moves are no-ops
    teacher.offload_after_refit()


@pytest.fixture
def two_teacher_run(tmp_path: Path) -> Path:
    layout = RunLayout(tmp_path / "run")
    rdv = build_rendezvous("r", [{"key": "aaaa1111", "name": "llama", "aliases": ("math", "code"),
                                  "model_name": "/ckpt/llama-8b"},
                                 {"key": "bbbb2222", "name": "qwen", "aliases": ("chat",), "model_name": "/ckpt/qwen"}],
                           layout=layout)
    path = write_rendezvous(layout, rdv)
    create_token(layout.auth_token_path)
    return path


@pytest.mark.parametrize(("section", "message"), [
    ({}, r"on_policy_distillation.teacher_model_by_agent_name: missing or empty; pass the recipe's"),
    ({"teacher_model_by_agent_name": {"math": "/ckpt/llama-8b", "swe": "/ckpt/swe"}},
     r"teacher_model_by_agent_name.swe: run 'r' .* serves no alias 'swe' \(it serves chat, code, math\); "
     r"start the teachers from this recipe"),
    ({"teacher_model_by_agent_name": {"math": "/ckpt/llama-70b"}},
     r"teacher_model_by_agent_name.math: the recipe names '/ckpt/llama-70b' but run 'r' .* serves '/ckpt/llama-8b'"),
])
def test_wiring_a_recipe_the_run_does_not_serve_names_the_key(two_teacher_run: Path, section: dict,
                                                              message: str) -> None:
    with pytest.raises(NemoRLWiringError, match=message):
        teacher_worker_groups(two_teacher_run, section, ready_timeout_s=0.1)


def test_the_section_may_come_as_nemo_rl_holds_it(two_teacher_run: Path) -> None:
    """A dict, an OmegaConf node, or a pydantic model (NeMo RL's MasterConfig holds an
    OnPolicyDistillationConfig): each is read the same way."""
    from omegaconf import OmegaConf
    from pydantic import BaseModel

    class OnPolicyDistillationConfig(BaseModel):
        enabled: bool = True
        teacher_model_by_agent_name: dict[str, str] = {}
        default_teacher_alias: str | None = None

    section = {"teacher_model_by_agent_name": {"swe": "/ckpt/swe"}}
    for form in (section, OmegaConf.create(section), OnPolicyDistillationConfig(**section)):
        with pytest.raises(NemoRLWiringError, match=r"teacher_model_by_agent_name.swe: run 'r'"):
            teacher_worker_groups(two_teacher_run, form, ready_timeout_s=0.1)


def test_the_shipped_distillation_recipe_plans_its_teacher(nemo_rl_configs: Path) -> None:
    recipe = nemo_rl_configs / DISTILLATION_RECIPE
    plan = load_plan(recipe)
    (spec,) = plan.teachers
    assert spec.aliases == ("teacher",) and plan.routes == {"teacher": spec.key}
    assert spec.model_name == "Qwen/Qwen3-4B"  # teacher.model_name, not the student's
    # teacher.dtensor_cfg (megatron_cfg is off in the shipped recipe): TP4 · CP2 on one 8-GPU node
    assert (spec.tensor_model_parallel_size, spec.context_parallel_size, spec.num_nodes) == (4, 2, 1)
    assert spec.temperature == 1.0 and spec.micro_batch_size == 1  # teacher.generation / logprob_batch_size
    hotter = load_plan(recipe, ["teacher.generation.temperature=0.7"]).teachers[0]
    # the temperature changes every logit the teacher serves: another teacher
    assert hotter.temperature == 0.7 and hotter.key != spec.key
    with pytest.raises(Exception, match=r"teacher.generation.temperature: must be a number > 0, got 0"):
        load_plan(recipe, ["teacher.generation.temperature=0"])


def test_mopd_teachers_take_the_policy_temperature(nemo_rl_configs: Path) -> None:
    recipe = nemo_rl_configs / "examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml"
    base = load_plan(recipe)
    hot = load_plan(recipe, ["policy.generation.temperature=0.6"])
    assert {s.temperature for s in base.teachers} == {1.0} and {s.temperature for s in hot.teachers} == {0.6}
    assert not {s.key for s in base.teachers} & {s.key for s in hot.teachers}


def test_numpy_results_reach_nemo_rl_as_torch() -> None:
    from podium.nemo_rl.remote import as_batched_data_dict

    out = as_batched_data_dict({"reference_logprobs": np.zeros((2, 3), dtype=np.float32)})
    assert isinstance(out["reference_logprobs"], torch.Tensor) and out["reference_logprobs"].dtype == torch.float32
