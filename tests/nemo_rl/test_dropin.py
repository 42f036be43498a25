"""podium's teachers where NeMo RL holds its own: NeMo RL's call sequences (``nemo_rl_callers``,
each citing the upstream lines at 7ea279a) on ``podium.nemo_rl``'s objects, on real teachers
(the package's Megatron groups, CPU/gloo), checked against HF transformers.

- MOPD: what ``teacher_worker_groups`` returns passes NeMo RL's setup checks and its trajectory
  collector's fan-out (a lock per teacher, a thread per teacher, rows routed by agent name) gets
  each row from its own teacher; the groups, pickled into another process as NeMo RL pickles them
  into its collector actor, answer there.
- Classic distillation: the loop's teacher calls give NeMo RL's top-k logits and leave the
  training batch as it was; ``distillation_policy`` makes NeMo RL's ``setup`` build that teacher.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fixtures.checkpoints import hf_oracle_logits, hf_oracle_logprobs, random_batch
from harness.lifecycle import Teacher
from harness.nemo_rl_callers import Timer, TrajectoryCollector, distillation_step, pad_to_multiple, readiness_refs
from harness.run import LLAMA, QWEN, TeacherDef, make_run
from omegaconf import OmegaConf

import podium.nemo_rl as pnr
from podium.client.options import ClientOptions
from podium.rendezvous import Generation

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

ATOL = 5e-5
OPTIONS = ClientOptions(ready_timeout_s=120.0, poll_interval_s=0.05, max_poll_interval_s=0.2)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mopd_run(tmp_path_factory: pytest.TempPathFactory, llama_group: Any, qwen_group: Any,
             tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path) -> Iterator[Path]:
    """A run serving a recipe's three agents: math and code on the Llama, chat on the Qwen."""
    llama = TeacherDef(LLAMA.key, "llama", ("math", "code"), str(tiny_llama_checkpoint))
    qwen = TeacherDef(QWEN.key, "qwen", ("chat",), str(tiny_qwen2_checkpoint))
    layout, token = make_run(tmp_path_factory.mktemp("mopd"), [llama, qwen], default_alias="math")
    teachers = [Teacher(llama_group, layout, llama, token).start(),
                Teacher(qwen_group, layout, qwen, token, generation=Generation(3000, 0)).start()]
    yield layout.rendezvous_path
    for teacher in teachers:
        teacher.stop()


@pytest.fixture(scope="module")
def opd_cfg(tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path) -> Any:
    """The recipe's ``on_policy_distillation`` section, as NeMo RL's config object holds it."""
    return OmegaConf.create({
        "enabled": True,
        "teacher_model_by_agent_name": {"math": str(tiny_llama_checkpoint), "code": str(tiny_llama_checkpoint),
                                        "chat": str(tiny_qwen2_checkpoint)},
        "default_teacher_alias": "math",
        "non_colocated_teachers": {"enabled": False},
    })


def test_mopd_setup_gets_what_nemo_rl_builds(mopd_run: Path, opd_cfg: Any, tiny_llama_checkpoint: Path) -> None:
    groups, alias_to_group_alias = pnr.teacher_worker_groups(mopd_run, opd_cfg, options=OPTIONS)
    # as create_teacher_worker_groups: one group per checkpoint under its first alias, every alias mapped
    assert list(groups) == ["math", "chat"]
    assert alias_to_group_alias == {"math": "math", "code": "math", "chat": "chat"}
    assert readiness_refs(groups) == []  # nothing to wait for in the trainer's Ray cluster
    collector = TrajectoryCollector(groups, alias_to_group_alias, opd_cfg, policy_make_seq_div_by=64)
    assert collector.pad_multiple == 64  # podium takes any width: the policy's multiple stands
    math = groups["math"]
    assert math.sharding_annotations.get_axis_size("data_parallel") == 1
    assert math.sharding_annotations.get_axis_size("tensor_parallel") == 1
    assert math.model_name == str(tiny_llama_checkpoint)


def test_mopd_fan_out_gets_each_row_from_its_own_teacher(mopd_run: Path, opd_cfg: Any, tiny_llama_checkpoint: Path,
                                                         tiny_qwen2_checkpoint: Path) -> None:
    groups, alias_to_group_alias = pnr.teacher_worker_groups(mopd_run, opd_cfg, options=OPTIONS)
    collector = TrajectoryCollector(groups, alias_to_group_alias, opd_cfg, policy_make_seq_div_by=8)
    batch = random_batch(256, [12, 3, 16, 9, 20, 5, 11], seq_len=20, seed=41)
    ids = pad_to_multiple(batch["input_ids"], collector.pad_multiple)  # width 24, as the collector pads
    lengths = batch["input_lengths"].to(torch.int32)  # the collector's lengths are int32
    agents = ["chat", "math", "code", "unlisted", "chat", "math", "code"]  # unlisted -> default (math)
    out = collector.compute_teacher_logprobs(ids, agents, lengths)
    llama_rows = hf_oracle_logprobs(tiny_llama_checkpoint, ids, lengths)
    qwen_rows = hf_oracle_logprobs(tiny_qwen2_checkpoint, ids, lengths)
    expected = torch.stack([qwen_rows[i] if a == "chat" else llama_rows[i] for i, a in enumerate(agents)])
    assert out.shape == (7, 24) and out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), expected.numpy(), atol=ATOL)
    assert sorted(collector.calls) == [("chat", 2), ("math", 5)]  # one call per teacher, math and code together


def test_groups_pickled_into_another_process_answer_there(mopd_run: Path, opd_cfg: Any, tmp_path: Path,
                                                          tiny_qwen2_checkpoint: Path) -> None:
    """NeMo RL pickles the dict of groups into its collector actor (another process, another
    virtualenv); each copy connects there on first use and never stops the teacher."""
    groups, _ = pnr.teacher_worker_groups(mopd_run, opd_cfg, options=OPTIONS)
    batch = random_batch(256, [6, 9, 2], seq_len=9, seed=43)
    (tmp_path / "groups.pkl").write_bytes(pickle.dumps(groups))
    torch.save(batch, tmp_path / "batch.pt")
    script = (
        "import pickle, sys, torch\n"
        "groups = pickle.load(open(sys.argv[1], 'rb'))\n"
        "batch = torch.load(sys.argv[2])\n"
        "out = groups['chat'].get_logprobs(batch)['reference_logprobs']\n"
        "groups['chat'].shutdown()\n"
        "torch.save(out, sys.argv[3])\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "groups.pkl"), str(tmp_path / "batch.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = hf_oracle_logprobs(tiny_qwen2_checkpoint, batch["input_ids"], batch["input_lengths"])
    np.testing.assert_allclose(torch.load(tmp_path / "out.pt").numpy(), expected.numpy(), atol=ATOL)
    # the copy's shutdown closed its own connections only: this process's group still serves
    again = groups["chat"].get_logprobs(batch)["reference_logprobs"]
    np.testing.assert_allclose(again.numpy(), expected.numpy(), atol=ATOL)


def test_distillation_loop_gets_nemo_rl_top_k_logits(mopd_run: Path, tiny_llama_checkpoint: Path) -> None:
    teacher = pnr.distillation_teacher(mopd_run, options=OPTIONS)  # two teachers: the default alias
    assert teacher.alias == "math"
    batch = random_batch(256, [10, 4, 16, 7], seq_len=16, seed=45)
    train_data = {**batch, "token_mask": torch.ones(4, 16), "sample_mask": torch.ones(4),
                  "loss_multiplier": torch.ones(4)}
    before = copy.deepcopy(train_data)
    timer = Timer()
    distillation_step(teacher, train_data, k=64, timer=timer)
    assert timer.labels == ["get_topk_logits/podium"]
    for key, value in before.items():  # the batch the student then trains on is as it was
        assert torch.equal(train_data[key], value), key
    logits, indices = train_data["teacher_topk_logits"], train_data["teacher_topk_indices"]
    assert logits.shape == indices.shape == (4, 16, 64) and logits.dtype == torch.float32
    assert indices.dtype == torch.int64
    ref = torch.topk(hf_oracle_logits(tiny_llama_checkpoint, batch["input_ids"], batch["input_lengths"]), 64, dim=-1)
    valid = torch.arange(16)[None, :] < (batch["input_lengths"][:, None] - 1)
    np.testing.assert_allclose(logits[valid].numpy(), ref.values[valid].numpy(), atol=ATOL)
    assert torch.equal(indices[valid], ref.indices[valid])
    # NeMo RL's loss reads [:, :-1] and a log-softmax over the k values: finite where the mask reads
    assert torch.isfinite(torch.log_softmax(logits[:, :-1], dim=-1)).all()
    teacher.shutdown()


def test_distillation_setup_builds_the_podium_teacher(mopd_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``distillation_policy`` replaces ``nemo_rl.algorithms.distillation.Policy`` for the teacher
    only (``name_prefix="teacher"``, ``distillation.py:487``), as long as the block lasts. NeMo RL
    is not installed here: a module with its ``Policy`` name and the two constructions of its
    ``setup`` stands in for it."""

    class Policy:  # the student's Policy, built as before
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

    def setup() -> tuple[Any, Any]:  # distillation.py:487-497 and :608-617, the two Policy builds
        teacher = module.Policy(name_prefix="teacher", cluster=None, config={}, tokenizer=None, weights_path=None,
                                optimizer_path=None, init_optimizer=False, init_reference_model=False)
        teacher.offload_after_refit()
        student = module.Policy(name_prefix="student", cluster=None, config={}, tokenizer=None, weights_path=None,
                                optimizer_path=None, init_optimizer=True, init_reference_model=False)
        return student, teacher

    module = types.ModuleType("nemo_rl.algorithms.distillation")
    module.Policy, module.setup = Policy, setup
    for name in ("nemo_rl", "nemo_rl.algorithms"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "nemo_rl.algorithms.distillation", module)
    with pnr.distillation_policy(mopd_run, "code", options=OPTIONS) as podium_teacher:
        student, teacher = module.setup()
    assert teacher is podium_teacher and teacher.alias == "code"
    assert isinstance(student, Policy) and student.kwargs["name_prefix"] == "student"
    assert module.Policy is Policy  # restored after the block
    out = teacher.get_topk_logits(random_batch(256, [5, 3]), k=4)
    assert out["topk_logits"].shape == (2, 5, 4)
