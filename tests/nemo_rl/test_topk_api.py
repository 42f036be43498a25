"""NeMo RL's top-k MOPD API (NVIDIA-NeMo/RL PR #3608) on podium's ``RemoteTeacherWorkerGroup``:
``get_topk_logprobs`` and ``get_logprobs_on_support`` on real TP1, TP2 and DP2 teachers (Megatron,
CPU/gloo) at a temperature != 1, through the endpoint and through a facade pickled into another process,
checked against HF transformers fp32 (values within 1e-4, indices exact). Each negative control
(top-k shifted by one position, the temperature ignored, renormalised over the k ids) is computed
from the same oracle and shown to differ from the facade's answer beyond that tolerance. What podium
puts where the loss never reads (docs/nemo_rl.md) is checked too. And
#3608's recipe spellings (``teacher_topk``/``student_topk``, ``precision: float32|bfloat16``,
``expert_tensor_parallel_size``) plan."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from fixtures.checkpoints import hf_oracle_log_softmax, hf_oracle_logits, hf_oracle_logprobs, random_batch
from fixtures.groups import LLAMA_DP2_TEMPERATURE
from harness.lifecycle import Teacher
from harness.run import LLAMA, make_run
from harness.teacher_groups import teacher_cfg

from podium.client.options import ClientOptions
from podium.client.teacher import TeacherClient
from podium.config.plan import load_plan
from podium.nemo_rl import RemoteTeacherWorkerGroup

ATOL = 1e-4
TEMPERATURE = 0.7
K = 8
LENGTHS = [12, 5, 9, 2]
OPTIONS = ClientOptions(ready_timeout_s=120.0, poll_interval_s=0.05, max_poll_interval_s=0.2)
REPO = Path(__file__).resolve().parents[2]

class Run(NamedTuple):
    rendezvous: Path
    temperature: float  # the teacher's own, which the facades' answers are at


@pytest.fixture(scope="module", params=["tp1", "tp2", "dp2"])
def warm_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, ray_cluster: Any,
             tiny_llama_checkpoint: Path) -> Iterator[Run]:
    """A run whose one teacher (fp32; TP1, TP2: the top-k merged and the support summed across
    ranks, or DP2: the rows split over two replicas and joined) divides its logits by its own
    temperature (``TEMPERATURE``; the shared DP2 group's ``LLAMA_DP2_TEMPERATURE``)."""
    from podium.teacher.compute.group import TeacherWorkerGroup

    layout, token = make_run(tmp_path_factory.mktemp("topk"), [LLAMA])
    if request.param == "dp2":
        group = request.getfixturevalue("llama_dp2_group")  # fixtures.groups: shared with the group tests
        assert group.facts.data_parallel_size == 2
        teacher = Teacher(group, layout, LLAMA, token).start()
        yield Run(layout.rendezvous_path, LLAMA_DP2_TEMPERATURE)
        teacher.stop()
        return
    tp = int(request.param[-1])
    group = TeacherWorkerGroup(teacher_cfg(tiny_llama_checkpoint, per_node=tp, tp=tp, temperature=TEMPERATURE))
    teacher = Teacher(group, layout, LLAMA, token).start()
    yield Run(layout.rendezvous_path, TEMPERATURE)
    teacher.stop()
    group.shutdown()


def _batch() -> dict[str, torch.Tensor]:
    return random_batch(256, LENGTHS, seq_len=12, seed=53)


def _next_valid(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, S]: positions whose next token is in the row (t < length - 1), the ones the loss reads."""
    return torch.arange(batch["input_ids"].shape[1])[None, :] < (batch["input_lengths"][:, None] - 1)


def _oracle(ckpt: Path, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Full-vocabulary log-softmax of z / T, next-token aligned: row t = the distribution after t."""
    return torch.log_softmax(hf_oracle_logits(ckpt, batch["input_ids"], batch["input_lengths"], temperature), dim=-1)


def _support(batch: dict[str, torch.Tensor], ckpt: Path) -> torch.Tensor:
    """A student's support per position: its own top-3 (the teacher's at T=1, shuffled) and 3 random ids."""
    gen = torch.Generator().manual_seed(7)
    top = torch.topk(_oracle(ckpt, batch, 1.0), 3, dim=-1).indices.flip(-1)
    rand = torch.randint(0, 256, (*batch["input_ids"].shape, 3), generator=gen)
    return torch.cat([top, rand], dim=-1)


def _differs(name: str, got: np.ndarray, control: np.ndarray) -> float:
    worst = float(np.max(np.abs(got - control)))
    assert worst > 10 * ATOL, f"negative control {name!r} matches the answer (max |diff| {worst:.2e})"
    return worst


def check_topk(out: Any, ckpt: Path, batch: dict[str, torch.Tensor], temperature: float) -> dict[str, float]:
    """The facade's ``get_topk_logprobs`` answer equals the oracle; each control differs; returns
    the error and each control's distance."""
    ref_lp, idx, lp = out["reference_logprobs"], out["topk_indices"], out["topk_logprobs"]
    b, s = batch["input_ids"].shape
    assert idx.shape == lp.shape == (b, s, K) and ref_lp.shape == (b, s)
    assert idx.dtype == torch.int64 and lp.dtype == ref_lp.dtype == torch.float32
    assert lp.device.type == idx.device.type == "cpu"
    valid = _next_valid(batch)
    oracle = _oracle(ckpt, batch, temperature)
    want = torch.topk(oracle, K, dim=-1)
    assert torch.equal(idx[valid], want.indices[valid])
    err = float((lp[valid] - want.values[valid]).abs().max())
    assert err < ATOL, err
    assert (lp[valid][:, :-1] >= lp[valid][:, 1:]).all()  # descending
    assert torch.equal(lp[~valid], torch.zeros_like(lp[~valid])) and not idx[~valid].any()  # podium's filler
    expected_ref = hf_oracle_logprobs(ckpt, batch["input_ids"], batch["input_lengths"], temperature)
    err_ref = float((ref_lp - expected_ref).abs().max())
    assert err_ref < ATOL, err_ref
    past = torch.arange(s)[None, :] >= batch["input_lengths"][:, None]
    assert not ref_lp[:, 0].any() and not ref_lp[past].any()  # as get_logprobs' (docs/nemo_rl.md)
    got = lp[valid].numpy()
    # controls: the shifted alignment (get_logprobs' own), the logits at T = 1, a softmax over the k only
    shifted = torch.topk(hf_oracle_log_softmax(ckpt, batch["input_ids"], batch["input_lengths"], temperature), K,
                         dim=-1).values
    return {
        "error": err, "reference_error": err_ref,
        "shifted_by_one": _differs("shifted", got, shifted[valid].numpy()),
        "temperature_ignored": _differs("T=1", got, torch.topk(_oracle(ckpt, batch, 1.0), K, dim=-1).values[valid]
                                        .numpy()),
        "renormalised_over_k": _differs("over k", got, torch.log_softmax(want.values, dim=-1)[valid].numpy()),
    }


def check_support(out: Any, ckpt: Path, batch: dict[str, torch.Tensor], support: torch.Tensor,
                  temperature: float) -> dict[str, float]:
    """The facade's ``get_logprobs_on_support`` answer equals the oracle; each control differs."""
    lp = out["support_logprobs"]
    assert lp.shape == support.shape and lp.dtype == torch.float32 and lp.device.type == "cpu"
    valid = _next_valid(batch)
    want = _oracle(ckpt, batch, temperature).gather(-1, support)
    err = float((lp[valid] - want[valid]).abs().max())
    assert err < ATOL, err
    assert torch.equal(lp[~valid], torch.zeros_like(lp[~valid]))  # podium's filler (docs/nemo_rl.md)
    got = lp[valid].numpy()
    shifted = hf_oracle_log_softmax(ckpt, batch["input_ids"], batch["input_lengths"], temperature).gather(-1, support)
    return {
        "error": err,
        "shifted_by_one": _differs("shifted", got, shifted[valid].numpy()),
        "temperature_ignored": _differs("T=1", got, _oracle(ckpt, batch, 1.0).gather(-1, support)[valid].numpy()),
        "renormalised_over_k": _differs("over k", got, torch.log_softmax(want, dim=-1)[valid].numpy()),
    }


@pytest.mark.ray
@pytest.mark.megatron
def test_topk_api_through_the_endpoint_one_request_each(warm_run: Run, tiny_llama_checkpoint: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    requests: list[tuple[str, ...]] = []
    real = TeacherClient.get_logprobs_arrays

    def counted(self: TeacherClient, *args: Any, **kwargs: Any) -> Any:
        requests.append(tuple(kwargs.get("outputs") or ()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TeacherClient, "get_logprobs_arrays", counted)
    group = RemoteTeacherWorkerGroup(warm_run.rendezvous, "math", options=OPTIONS)
    batch = _batch()
    topk = check_topk(group.get_topk_logprobs(batch, k=K), tiny_llama_checkpoint, batch, warm_run.temperature)
    support = _support(batch, tiny_llama_checkpoint)
    on_support = check_support(group.get_logprobs_on_support({**batch, "topk_indices": support}),
                               tiny_llama_checkpoint, batch, support, warm_run.temperature)
    assert requests == [("logprobs", "topk_logprobs", "topk_indices"), ("candidate_logprobs",)]
    # #3608 sends no input_lengths to the support call when the trainer has none: every row is full
    assert LENGTHS[0] == batch["input_ids"].shape[1]  # row 0 is full
    alone = group.get_logprobs_on_support({"input_ids": batch["input_ids"][:1], "topk_indices": support[:1]})
    want = _oracle(tiny_llama_checkpoint, batch, warm_run.temperature).gather(-1, support)
    np.testing.assert_allclose(alone["support_logprobs"][0, :-1].numpy(), want[0, :-1].numpy(), atol=ATOL)
    assert not alone["support_logprobs"][0, -1].any()  # the last position has no next token: 0 (docs/nemo_rl.md)
    group.shutdown()
    print("topk", topk, "support", on_support)


@pytest.mark.ray
@pytest.mark.megatron
def test_topk_api_of_a_facade_pickled_into_another_process(warm_run: Run, tiny_llama_checkpoint: Path,
                                                           tmp_path: Path) -> None:
    """#3608's collector calls both methods on the groups NeMo RL pickled into its actor."""
    group = RemoteTeacherWorkerGroup(warm_run.rendezvous, "math", options=OPTIONS)
    batch = _batch()
    support = _support(batch, tiny_llama_checkpoint)
    (tmp_path / "group.pkl").write_bytes(pickle.dumps(group))
    torch.save({"batch": batch, "support": support}, tmp_path / "in.pt")
    script = (
        "import pickle, sys, torch\n"
        "group = pickle.load(open(sys.argv[1], 'rb'))\n"
        "d = torch.load(sys.argv[2])\n"
        f"topk = dict(group.get_topk_logprobs(d['batch'], k={K}))\n"
        "sup = dict(group.get_logprobs_on_support({**d['batch'], 'topk_indices': d['support']}))\n"
        "group.shutdown()\n"
        "torch.save({'topk': topk, 'support': sup}, sys.argv[3])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "group.pkl"), str(tmp_path / "in.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = torch.load(tmp_path / "out.pt")
    print("topk", check_topk(out["topk"], tiny_llama_checkpoint, batch, warm_run.temperature),
          "support", check_support(out["support"], tiny_llama_checkpoint, batch, support, warm_run.temperature))


# #3608's recipe side: examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml and
# nemotron-3-ultra/mopd.yaml gained expert_tensor_parallel_size and spell precision bfloat16;
# OnPolicyDistillationConfig gained teacher_topk / student_topk (one or the other).
RECIPE_3608 = """\
policy: {{generation: {{temperature: 0.7}}}}
on_policy_distillation:
  enabled: true
  {selector}: 16
  teacher_model_by_agent_name: {{math: /ckpt/a, chat: /ckpt/b}}
  default_teacher_alias: math
  non_colocated_teachers:
    enabled: true
    default_teacher_cfg:
      tensor_model_parallel_size: 2
      pipeline_model_parallel_size: 1
      context_parallel_size: 1
      expert_tensor_parallel_size: 1
      expert_model_parallel_size: 1
      num_nodes: 1
      gpus_per_node: 8
      precision: bfloat16
      micro_batch_size: 1
    teacher_overrides:
      chat: {{precision: float32, expert_tensor_parallel_size: 2, expert_model_parallel_size: 2}}
"""


@pytest.mark.parametrize("selector", ["teacher_topk", "student_topk"])
def test_a_recipe_as_3608_ships_it_plans(tmp_path: Path, selector: str) -> None:
    path = tmp_path / "mopd.yaml"
    path.write_text(RECIPE_3608.format(selector=selector))
    teachers = {t.name: t for t in load_plan(path).teachers}
    assert set(teachers) == {"math", "chat"}
    assert teachers["math"].precision == "bf16" and teachers["chat"].precision == "fp32"
    assert teachers["math"].expert_tensor_parallel_size == 1 and teachers["chat"].expert_tensor_parallel_size == 2
    assert teachers["chat"].expert_model_parallel_size == 2 and teachers["math"].temperature == 0.7


# NeMo RL main's create_teacher_configs_from_opd_config (0054c4e) merges a teacher's block over the
# default's one level deep ({**default_teacher_cfg, **teacher_overrides[alias]}): an alias's
# megatron_cfg_overrides replaces the default's whole, a Megatron key an alias sets at the top of its
# block folds under the map (the map wins), one it sets to null keeps the default's (its override is
# dumped without None fields). #3608 (open) merged the maps key by key; podium follows main, and the
# plan warns of what an alias's map drops and of an alias's key the default map overrides.
RECIPE_3608_OVERRIDES = """\
on_policy_distillation:
  teacher_model_by_agent_name: {math: /ckpt/a, chat: /ckpt/b, code: /ckpt/c}
  default_teacher_alias: math
  non_colocated_teachers:
    default_teacher_cfg:
      tensor_model_parallel_size: 2
      num_nodes: 1
      gpus_per_node: 8
      precision: bfloat16
      megatron_cfg_overrides: {moe_token_dispatcher_type: alltoall, sequence_parallel: true, moe_router_topk: 4,
                               context_parallel_size: 1}
    teacher_overrides:
      chat: {context_parallel_size: 2, megatron_cfg_overrides: {sequence_parallel: false}}
      code: {moe_router_topk: 2, precision: null, num_nodes: null}
"""


def test_a_teachers_megatron_overrides_replace_the_defaults_as_nemo_rl_main_merges_them(tmp_path: Path) -> None:
    path = tmp_path / "mopd.yaml"
    path.write_text(RECIPE_3608_OVERRIDES)
    plan = load_plan(path)
    teachers = {t.name: t for t in plan.teachers}
    common = {"moe_token_dispatcher_type": "alltoall", "sequence_parallel": True, "moe_router_topk": 4}
    assert teachers["math"].megatron_cfg_overrides == common and teachers["math"].context_parallel_size == 1
    assert teachers["chat"].megatron_cfg_overrides == {"sequence_parallel": False}  # its own map, whole
    assert teachers["chat"].context_parallel_size == 2  # its own setting (the default map's went with the map)
    assert teachers["code"].megatron_cfg_overrides == common  # the default map beats the folded moe_router_topk
    assert teachers["code"].context_parallel_size == 1
    assert (teachers["code"].precision, teachers["code"].num_nodes) == ("bf16", 1)
    nct = "on_policy_distillation.non_colocated_teachers"
    chat_map, default_map = f"{nct}.teacher_overrides.chat.megatron_cfg_overrides", \
        f"{nct}.default_teacher_cfg.megatron_cfg_overrides"
    merge_notes = tuple(n for n in plan.notes if n.startswith("warning: "))
    assert merge_notes == (
        f"warning: {chat_map} replaces {default_map} whole, as NeMo RL merges a teacher's settings "
        "({**default_teacher_cfg, **teacher_overrides.<alias>}, one level deep): teacher 'chat' runs without the "
        f"default's moe_token_dispatcher_type, moe_router_topk; to keep them, repeat them in {chat_map}",
        f"warning: {nct}.teacher_overrides.code.moe_router_topk (2) gives way to {default_map}.moe_router_topk (4): "
        "in NeMo RL the map wins over a key folded into it; to set it for 'code', put it in "
        f"{nct}.teacher_overrides.code.megatron_cfg_overrides",
    )
