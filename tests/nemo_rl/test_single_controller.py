"""podium's teachers under NeMo RL's SingleController MOPD: its setup's teacher calls and its
TransferQueue coordinator (``nemo_rl_sc_callers``, each citing the upstream lines) on
``podium.nemo_rl``'s facades, over the real ``transferqueue`` on the session's Ray cluster, on real
teachers (the shared Megatron groups, CPU/gloo), checked against HF transformers in fp32.

- the setup, unchanged, under ``single_controller_teachers``: no node subtracted, nothing
  reserved, podium's facades with NeMo RL's aliases, indices and checkpoints;
- the facades pickled into a Ray actor (as into the SingleController actor) answer every row of
  each prompt group there, the coordinator's DP pad rows included, into TransferQueue;
- a teacher that ``podium down`` stopped fails the call at once, naming it;
- with ``on_policy_distillation.full.enabled``, the hidden states (or logits) and the teacher index
  beside the logprobs, against transformers.
"""

from __future__ import annotations

import asyncio
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness.nemo_rl_sc_callers as sc
import numpy as np
import pytest
import ray
import torch
from fixtures.checkpoints import hf_oracle_logprobs, random_batch
from fixtures.groups import LLAMA_DP2_TEMPERATURE
from harness.lifecycle import Teacher
from harness.payloads import assert_payload_matches, hf_full_logits, hf_hidden_states, lm_head_logprobs
from harness.run import LLAMA, QWEN, TeacherDef, make_run

import podium.nemo_rl as pnr
from podium.client import TeacherStoppedError
from podium.client.options import ClientOptions
from podium.rendezvous import Generation
from podium.rendezvous.records import RecordWriter, Status, read_record

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

ATOL = 1e-4
OPTIONS = ClientOptions(ready_timeout_s=120.0, poll_interval_s=0.05, max_poll_interval_s=0.2)
PARTITION = "rollout_data"


@pytest.fixture(scope="module")
def sc_run(tmp_path_factory: pytest.TempPathFactory, llama_dp2_group: Any, qwen_group: Any,
           tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path) -> Iterator[Path]:
    """math and code on the tiny Llama served data-parallel 2 (so NeMo RL pads odd prompt groups),
    chat on the Qwen (DP 1)."""
    llama = TeacherDef(LLAMA.key, "llama", ("math", "code"), str(tiny_llama_checkpoint))
    qwen = TeacherDef(QWEN.key, "qwen", ("chat",), str(tiny_qwen2_checkpoint))
    layout, token = make_run(tmp_path_factory.mktemp("sc"), [llama, qwen], default_alias="math")
    teachers = [Teacher(llama_dp2_group, layout, llama, token).start(),
                Teacher(qwen_group, layout, qwen, token, generation=Generation(3000, 0)).start()]
    yield layout.rendezvous_path
    for teacher in teachers:
        teacher.stop()


@pytest.fixture(scope="module")
def master_config(tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path) -> dict[str, Any]:
    """The parts of a SingleController MOPD master config its teacher setup reads (tokenizer: None)."""
    return {
        "cluster": {"num_nodes": 2, "gpus_per_node": 8},
        "policy": {"model_name": "student", "make_sequence_length_divisible_by": 8,
                   "sequence_packing": {"enabled": False}, "dynamic_batching": {"enabled": False}},
        "on_policy_distillation": {
            "enabled": True,
            "teacher_model_by_agent_name": {"math": str(tiny_llama_checkpoint), "code": str(tiny_llama_checkpoint),
                                            "chat": str(tiny_qwen2_checkpoint)},
            "default_teacher_alias": "math",
            "non_colocated_teachers": {"enabled": True, "default_teacher_cfg": {"num_nodes": 1}},
        },
    }


@pytest.fixture(scope="module")
def data_plane(ray_cluster: Any) -> sc.TQDataPlaneClient:
    """The driver's data plane: TransferQueue bootstrapped on the session's Ray, its partition registered."""
    ray.cloudpickle.register_pickle_by_value(sc)  # the harness travels into Ray actors by value
    client = sc.build_data_plane_client(sc.DP_CFG, bootstrap=True)
    client.register_partition(PARTITION, list(sc.SC_ROLLOUT_SCHEMA_FIELDS))
    return client


def stand_in_nemo_rl(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, types.ModuleType]:
    """``nemo_rl.algorithms.opd`` and ``...single_controller_utils.setup`` with NeMo RL's own
    teacher functions, as far as the setup's calls need them: these would reserve GPUs."""
    opd = types.ModuleType(pnr.single_controller.OPD_MODULE)
    setup = types.ModuleType(pnr.single_controller.SETUP_MODULE)

    def is_non_colocated_teachers_enabled(master_config: Any) -> bool:  # opd.py:114-120
        section = master_config["on_policy_distillation"]
        return bool(section["enabled"] and section["non_colocated_teachers"]["enabled"])

    def would_reserve(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("NeMo RL's own teacher reservation ran")

    opd.is_non_colocated_teachers_enabled = is_non_colocated_teachers_enabled
    opd.reserve_teacher_clusters = opd.create_teacher_worker_groups = would_reserve
    setup._non_colocated_teacher_node_count = lambda master_config: 2  # one node per deduplicated teacher
    for name in ("nemo_rl", "nemo_rl.algorithms", "nemo_rl.algorithms.single_controller_utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, opd.__name__, opd)
    monkeypatch.setitem(sys.modules, setup.__name__, setup)
    return opd, setup


def sc_setup(rendezvous: Path, master_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
             ) -> tuple[int, dict[str, Any], dict[str, str]]:
    opd, setup = stand_in_nemo_rl(monkeypatch)
    originals = (opd.reserve_teacher_clusters, opd.create_teacher_worker_groups,
                 setup._non_colocated_teacher_node_count)
    with pnr.single_controller_teachers(rendezvous, options=OPTIONS, data_plane_client=sc.teacher_side_client):
        out = sc.setup_teachers(opd, setup, master_config, None, sc.DP_CFG)
    assert (opd.reserve_teacher_clusters, opd.create_teacher_worker_groups,
            setup._non_colocated_teacher_node_count) == originals  # restored after the block
    return out


def test_setup_reserves_nothing_and_gets_podiums_groups(sc_run: Path, master_config: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch, tiny_llama_checkpoint: Path,
                                                       tiny_qwen2_checkpoint: Path) -> None:
    policy_nodes, groups, alias_to_group_alias = sc_setup(sc_run, master_config, monkeypatch)
    assert policy_nodes == 2  # no node subtracted for the teachers
    assert list(groups) == ["math", "chat"] and all(isinstance(g, pnr.RemoteTQTeacherGroup) for g in groups.values())
    assert alias_to_group_alias == {"math": "math", "code": "math", "chat": "chat"}
    math, chat = groups["math"], groups["chat"]
    assert (math.model_name, chat.model_name) == (str(tiny_llama_checkpoint), str(tiny_qwen2_checkpoint))
    assert math.cfg["model_name"] == str(tiny_llama_checkpoint) and master_config["policy"]["model_name"] == "student"
    # NeMo RL's teacher_index: rank of (checkpoint, alias) among the deduplicated teachers
    ranked = sorted([(str(tiny_llama_checkpoint), "math"), (str(tiny_qwen2_checkpoint), "chat")])
    assert [math.teacher_index, chat.teacher_index] == [ranked.index((math.model_name, "math")),
                                                       ranked.index((chat.model_name, "chat"))]
    assert math.sharding_annotations.get_axis_size("data_parallel") == 2
    assert chat.sharding_annotations.get_axis_size("data_parallel") == 1
    assert math.use_sequence_packing is False and math.sequence_length_pad_multiple == 1


def test_groups_in_the_single_controller_actor_answer_every_row_into_transfer_queue(
        sc_run: Path, master_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        data_plane: sc.TQDataPlaneClient, tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path) -> None:
    _, groups, alias_to_group_alias = sc_setup(sc_run, master_config, monkeypatch)
    # three prompt groups written by the rollout: math 3 rows (DP 2: one pad row), code 4, chat 3
    prompt_groups = [("math", [7, 12, 4]), ("code", [9, 3, 16, 11]), ("chat", [5, 14, 8])]
    metas, batches = [], []
    for n, (_, lengths) in enumerate(prompt_groups):
        batch = random_batch(256, lengths, seq_len=16, seed=50 + n)
        batch = {"input_ids": batch["input_ids"], "input_lengths": batch["input_lengths"],
                 "sample_mask": torch.ones(len(lengths))}
        metas.append(sc.kv_first_write(batch, sample_ids=[f"p{n}_g{i}" for i in range(len(lengths))],
                                       client=data_plane, partition_id=PARTITION))
        batches.append(batch)
    actor = ray.remote(num_cpus=0)(sc.SingleControllerActor).remote(
        groups, alias_to_group_alias, master_config["on_policy_distillation"], sc.DP_CFG)
    calls = ray.get(actor.enrich.remote([(meta, agent) for meta, (agent, _) in zip(metas, prompt_groups, strict=True)]),
                    timeout=300)
    # one call per prompt group (math and code both on the Llama's group, one at a time)
    assert sorted((group, len(ids)) for group, ids in calls) == [("chat", 3), ("math", 4), ("math", 4)]
    (pad,) = [s for _, ids in calls for s in ids if "__teacher_pad_" in s]
    assert pad.startswith("p0_g2__teacher_pad_")  # a copy of math's last row, under a temporary id
    written = ray.get(actor.written_by_groups.remote(), timeout=60)
    assert pad in written["math"]  # the facade answered the pad row too
    assert not any("__teacher_pad_" in s for s in tq_keys())  # and the coordinator cleared it
    for meta, batch, (agent, _) in zip(metas, batches, prompt_groups, strict=True):
        got = sc.read_columns(data_plane, meta, ["teacher_reference_logprobs"])["teacher_reference_logprobs"]
        ckpt, temperature = ((tiny_qwen2_checkpoint, 1.0) if agent == "chat"
                             else (tiny_llama_checkpoint, LLAMA_DP2_TEMPERATURE))
        expected = hf_oracle_logprobs(ckpt, batch["input_ids"], batch["input_lengths"], temperature)
        width = int(batch["input_lengths"].max())
        assert got.dtype == torch.float32 and tuple(got.shape) == (len(meta.sample_ids), width), agent
        np.testing.assert_allclose(got.numpy(), expected[:, :width].numpy(), atol=ATOL, err_msg=agent)
    ray.kill(actor)


def tq_keys() -> list[str]:
    return list(sc.tq.kv_list(partition_id=PARTITION).get(PARTITION, {}))


def test_a_teacher_podium_down_stopped_fails_the_call_at_once_naming_it(
        tmp_path: Path, llama_group: Any, tiny_llama_checkpoint: Path, master_config: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch, data_plane: sc.TQDataPlaneClient) -> None:
    llama = TeacherDef(LLAMA.key, "llama", ("math", "code", "chat"), str(tiny_llama_checkpoint))
    layout, token = make_run(tmp_path, [llama], default_alias="math")
    teacher = Teacher(llama_group, layout, llama, token, generation=Generation(4000, 0)).start()
    config = {**master_config, "on_policy_distillation": {
        **master_config["on_policy_distillation"],
        "teacher_model_by_agent_name": {a: str(tiny_llama_checkpoint) for a in ("math", "code", "chat")}}}
    _, groups, alias_to_group_alias = sc_setup(layout.rendezvous_path, config, monkeypatch)
    batch = random_batch(256, [6, 9], seq_len=9, seed=61)
    meta = sc.kv_first_write({**batch, "sample_mask": torch.ones(2)}, sample_ids=["dead_0", "dead_1"],
                             client=data_plane, partition_id=PARTITION)
    teacher.stop()  # then the job's verdict, as `podium down` leaves it
    path = teacher.writer.path
    RecordWriter.resume(path, read_record(path)).publish(Status.STOPPED, reason="podium down asked it to stop",
                                                         will_retry=False, final=False)
    coordinator = sc.Coordinator(data_plane, groups, alias_to_group_alias, config["on_policy_distillation"])
    started = time.monotonic()
    with pytest.raises(TeacherStoppedError, match=r"teacher 'llama' .* generation 4000:0 was stopped at"):
        coordinator.enrich_sync(meta, "math")
    assert time.monotonic() - started < 30  # not the call's 30-minute deadline


def with_full(master_config: dict[str, Any], **full: Any) -> dict[str, Any]:
    """``master_config`` with ``on_policy_distillation.full`` enabled (NeMo RL's keys)."""
    return {**master_config, "on_policy_distillation": {**master_config["on_policy_distillation"],
                                                        "full": {"enabled": True, **full}}}


def enrich_in_the_coordinator(config: dict[str, Any], groups: dict[str, Any], alias_to_group_alias: dict[str, str],
                              data_plane: sc.TQDataPlaneClient, prompt_groups: list[tuple[str, list[int]]],
                              prefix: str) -> list[tuple[sc.KVBatchMeta, dict[str, torch.Tensor], str]]:
    """The rollout's first put of each prompt group, then NeMo RL's coordinator enriching them all
    at once (in this process: the actor's pickling is covered above); ``(meta, batch, agent)``."""
    out = []
    for n, (agent, lengths) in enumerate(prompt_groups):
        batch = random_batch(256, lengths, seq_len=16, seed=70 + n)
        batch = {"input_ids": batch["input_ids"], "input_lengths": batch["input_lengths"],
                 "sample_mask": torch.ones(len(lengths))}
        meta = sc.kv_first_write(batch, sample_ids=[f"{prefix}{n}_g{i}" for i in range(len(lengths))],
                                 client=data_plane, partition_id=PARTITION)
        out.append((meta, batch, agent))
    coordinator = sc.Coordinator(data_plane, groups, alias_to_group_alias, config["on_policy_distillation"])

    async def all_groups() -> list[sc.KVBatchMeta]:
        return await asyncio.gather(*(coordinator.enrich(meta, agent) for meta, _, agent in out))

    enriched = asyncio.run(all_groups())
    assert all(set(coordinator.enriched) <= set(meta.fields or []) for meta in enriched)
    return out


def teacher_of(agent: str, llama: Path, qwen: Path) -> tuple[Path, float]:
    return (qwen, 1.0) if agent == "chat" else (llama, LLAMA_DP2_TEMPERATURE)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_full_enabled_writes_hidden_states_and_the_teacher_index_beside_the_logprobs(
        sc_run: Path, master_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        data_plane: sc.TQDataPlaneClient, tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path, dtype: str) -> None:
    """NeMo RL's ``full.enabled`` with ``teacher_payload: hidden_states``: the HF model's
    ``output_hidden_states[-1]`` in ``payload_dtype`` under every row's id (DP pad row included,
    then cleared), ``log_softmax(lm_head(h) / T)`` at the next token = the logprobs written beside
    it, and the group's ``teacher_index`` per row."""
    config = with_full(master_config, teacher_payload="hidden_states", payload_dtype=dtype)
    _, groups, alias_to_group_alias = sc_setup(sc_run, config, monkeypatch)
    datatype = pnr.tq_group.PAYLOAD_DATATYPES[dtype]
    written = enrich_in_the_coordinator(config, groups, alias_to_group_alias, data_plane,
                                        [("math", [7, 12, 4]), ("chat", [5, 14, 8])], prefix=f"hs_{dtype}_")
    puts = [(ids, fields) for ids, fields in groups["math"].data_plane().put_fields]
    (pad,) = [s for ids, fields in puts for s in ids if "__teacher_pad_" in s]
    assert any(pad in ids and "teacher_full_hidden_states" in fields for ids, fields in puts)  # pad row covered
    assert not any("__teacher_pad_" in s for s in tq_keys())  # and cleared
    for meta, batch, agent in written:
        ckpt, temperature = teacher_of(agent, tiny_llama_checkpoint, tiny_qwen2_checkpoint)
        got = sc.read_columns(data_plane, meta, ["teacher_reference_logprobs", "teacher_full_hidden_states",
                                                 "opd_full_teacher_index"])
        width, lengths = int(batch["input_lengths"].max()), batch["input_lengths"]
        ids = batch["input_ids"][:, :width]
        hidden, logprobs = got["teacher_full_hidden_states"], got["teacher_reference_logprobs"]
        expected = hf_hidden_states(ckpt, ids, lengths)
        assert_payload_matches(hidden, expected, lengths, datatype)
        np.testing.assert_allclose(logprobs.numpy(), hf_oracle_logprobs(ckpt, ids, lengths, temperature).numpy(),
                                   atol=ATOL, err_msg=agent)
        valid = (torch.arange(width)[None, :] < lengths[:, None]).float()
        rebuilt = lm_head_logprobs(ckpt, hidden, ids, temperature) * valid
        # at fp32 the payload reproduces the logprobs; at bf16, to the payload's precision
        np.testing.assert_allclose(rebuilt.numpy(), logprobs.numpy(), atol=ATOL if dtype == "float32" else 0.05,
                                   err_msg=agent)
        group = groups[alias_to_group_alias[agent]]
        index = got["opd_full_teacher_index"]
        assert index.dtype == torch.int64 and index.tolist() == [group.teacher_index] * len(meta.sample_ids), agent


def test_full_enabled_with_logits_writes_the_full_vocabulary_logits(
        sc_run: Path, master_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        data_plane: sc.TQDataPlaneClient, tiny_llama_checkpoint: Path) -> None:
    """``teacher_payload: logits``: ``z / T`` over the whole vocabulary, fp32, no teacher index
    (NeMo RL's ``opd_full_teacher_index_field`` is None for logits)."""
    config = with_full(master_config, teacher_payload="logits", payload_dtype="float32")
    _, groups, alias_to_group_alias = sc_setup(sc_run, config, monkeypatch)
    ((meta, batch, _),) = enrich_in_the_coordinator(config, groups, alias_to_group_alias, data_plane,
                                                    [("code", [6, 11, 3])], prefix="lg_")
    got = sc.read_columns(data_plane, meta, ["teacher_reference_logprobs", "teacher_full_logits"])
    width, lengths = int(batch["input_lengths"].max()), batch["input_lengths"]
    ids = batch["input_ids"][:, :width]
    expected = hf_full_logits(tiny_llama_checkpoint, ids, lengths, LLAMA_DP2_TEMPERATURE)
    assert_payload_matches(got["teacher_full_logits"], expected, lengths, "FP32")
    assert not any("opd_full_teacher_index" in fields for _, fields in groups["math"].data_plane().put_fields)
