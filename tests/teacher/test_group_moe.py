"""MoE teachers (routed experts) against HF transformers: Qwen3-MoE (``norm_topk_prob`` true and
false, a dense layer between MoE layers), Qwen2-MoE (a shared expert behind a sigmoid gate, q/k/v
bias) and Mixtral, on the real Megatron group (Ray, CPU/gloo, the ``alltoall`` dispatcher with the
CPU shims), at the layouts that split experts differently:

- TP1·EP1: one rank holds every expert;
- TP1·EP2: two ranks, each with half the experts and its own rows (attention data-parallel,
  uneven token counts per rank);
- TP2·EP2·ETP1 on 2 ranks (Qwen2-MoE: the shared expert split over the attention TP, the routed
  experts in two groups);
- TP2·EP2·ETP1 and TP2·EP2·ETP2 on 4 ranks (2 nodes): attention split in two, experts in two
  groups, whole or split again.

One group per layout, each used by one test and so started and shut down around it (function
scope): held together for the module, the seven groups would ask for more CPUs than the test
cluster's 16 and the last would wait for a placement. Logprobs within 1e-4 of the oracle (fp32),
top-k too (Qwen2-MoE: within 1e-5).
"""

from __future__ import annotations

import controls
import pytest
from fixtures.checkpoints import hf_oracle_logprobs
from harness.teacher_groups import assert_matches_oracle, ragged_batch, start_group

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

VOCAB = 256


@pytest.fixture
def qwen_ep1(ray_cluster, tiny_qwen3_moe_checkpoint):
    yield from start_group(tiny_qwen3_moe_checkpoint)


@pytest.fixture
def qwen_ep2(ray_cluster, tiny_qwen3_moe_checkpoint):
    yield from start_group(tiny_qwen3_moe_checkpoint, per_node=2, expert_model_parallel_size=2)


@pytest.fixture
def qwen_unnormed_ep2(ray_cluster, tiny_qwen3_moe_unnormed_checkpoint):
    yield from start_group(tiny_qwen3_moe_unnormed_checkpoint, per_node=2, expert_model_parallel_size=2)


@pytest.fixture
def qwen_tp2_ep2(ray_cluster, tiny_qwen3_moe_checkpoint):
    yield from start_group(tiny_qwen3_moe_checkpoint, nodes=2, per_node=2, tp=2, expert_model_parallel_size=2)


@pytest.fixture
def mixtral_tp2_ep2_etp2(ray_cluster, tiny_mixtral_checkpoint):
    yield from start_group(tiny_mixtral_checkpoint, nodes=2, per_node=2, tp=2, expert_model_parallel_size=2,
                           expert_tensor_parallel_size=2)


@pytest.fixture
def qwen2_moe_ep2(ray_cluster, tiny_qwen2_moe_checkpoint):
    yield from start_group(tiny_qwen2_moe_checkpoint, per_node=2, expert_model_parallel_size=2)


@pytest.fixture
def qwen2_moe_tp2_ep2(ray_cluster, tiny_qwen2_moe_checkpoint):
    yield from start_group(tiny_qwen2_moe_checkpoint, per_node=2, tp=2, expert_model_parallel_size=2)


def test_qwen3_moe_one_rank_holds_every_expert(qwen_ep1, tiny_qwen3_moe_checkpoint):
    assert_matches_oracle(qwen_ep1, tiny_qwen3_moe_checkpoint, ragged_batch(VOCAB, seed=51), top_k=4)


def test_qwen3_moe_experts_split_over_two_ranks_with_their_own_rows(qwen_ep2, tiny_qwen3_moe_checkpoint):
    assert qwen_ep2.facts.data_parallel_size == 2
    assert sorted(i.ep_rank for i in qwen_ep2.worker_info) == [0, 1]
    for lengths in [(5,), (3, 9, 1), (16, 2, 7, 7, 11)]:  # odd counts: ranks get different tokens
        assert_matches_oracle(qwen_ep2, tiny_qwen3_moe_checkpoint, ragged_batch(VOCAB, lengths, seed=len(lengths)),
                              top_k=3)


def test_qwen3_moe_without_renormalised_top_k(qwen_unnormed_ep2, tiny_qwen3_moe_unnormed_checkpoint):
    assert_matches_oracle(qwen_unnormed_ep2, tiny_qwen3_moe_unnormed_checkpoint, ragged_batch(VOCAB, seed=52))


def test_qwen3_moe_tp2_ep2(qwen_tp2_ep2, tiny_qwen3_moe_checkpoint):
    # attention split in two (TP2), the experts in two groups (EP2) of whole experts (ETP1)
    info = qwen_tp2_ep2.worker_info
    assert sorted(i.tp_rank for i in info) == sorted(i.ep_rank for i in info) == [0, 0, 1, 1]
    assert {i.etp_rank for i in info} == {0}
    assert_matches_oracle(qwen_tp2_ep2, tiny_qwen3_moe_checkpoint, ragged_batch(VOCAB, seed=53, width=18), top_k=4)


def test_mixtral_tp2_ep2_with_experts_split_again(mixtral_tp2_ep2_etp2, tiny_mixtral_checkpoint):
    assert_matches_oracle(mixtral_tp2_ep2_etp2, tiny_mixtral_checkpoint, ragged_batch(VOCAB, seed=54), top_k=4)


def _assert_within(group, checkpoint, batch, top_k, tol=1e-5):
    out = assert_matches_oracle(group, checkpoint, batch, top_k=top_k)
    diff = (out["logprobs"] - hf_oracle_logprobs(checkpoint, batch["input_ids"], batch["input_lengths"])).abs().max()
    print(f"max abs diff vs HF {float(diff):.3g}")
    assert diff <= tol, f"max abs diff vs HF {float(diff):.3g} > {tol}"


def test_qwen2_moe_shared_expert_with_experts_split_over_two_ranks(qwen2_moe_ep2, tiny_qwen2_moe_checkpoint):
    assert sorted(i.ep_rank for i in qwen2_moe_ep2.worker_info) == [0, 1]
    for lengths in [(3, 9, 1), (16, 2, 7, 7, 11)]:  # odd counts: ranks get different tokens
        _assert_within(qwen2_moe_ep2, tiny_qwen2_moe_checkpoint, ragged_batch(VOCAB, lengths, seed=len(lengths)), 3)


def test_qwen2_moe_shared_expert_split_over_tp2(qwen2_moe_tp2_ep2, tiny_qwen2_moe_checkpoint):
    # two ranks: attention and the shared expert split in two (TP2), the routed experts in two
    # groups of whole experts (EP2·ETP1)
    info = qwen2_moe_tp2_ep2.worker_info
    assert sorted(i.tp_rank for i in info) == sorted(i.ep_rank for i in info) == [0, 1]
    _assert_within(qwen2_moe_tp2_ep2, tiny_qwen2_moe_checkpoint, ragged_batch(VOCAB, seed=55), 4)


def test_the_oracle_catches_a_forgotten_ep_offset_a_flipped_router_and_a_wrong_shared_gate(
        tiny_qwen3_moe_checkpoint, tiny_qwen2_moe_checkpoint, tmp_path):
    """Negative controls (``moe_controls.py``, TP1·EP2, one pair of processes for both models):
    the same model built with every rank's experts taken from 0, or with ``norm_topk_prob`` read
    the wrong way round, or (Qwen2-MoE) with the shared expert's gate left out or applied without
    its sigmoid, is far from HF; as podium builds it, it matches."""
    result = controls.run("moe_controls.py", tmp_path, [tiny_qwen3_moe_checkpoint, tiny_qwen2_moe_checkpoint])
    qwen3, qwen2 = result[str(tiny_qwen3_moe_checkpoint)], result[str(tiny_qwen2_moe_checkpoint)]
    for diffs in (qwen3, qwen2):
        assert diffs["right"] < 1e-4, result
        assert diffs["no_ep_offset"] > 1e-2 and diffs["router_flipped"] > 1e-2, result
    assert qwen2["shared_gate_left_out"] > 1e-2 and qwen2["shared_gate_without_sigmoid"] > 1e-2, result
