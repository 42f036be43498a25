"""TeacherWorkerGroup on the tiny Llama (GQA) at TP1, TP2, PP2, TP2×PP2 and DP2 on a 2-node Ray cluster.

The oracle is HF transformers in this process; every layout must match it to 1e-4 (fp32).
One group per layout for the whole module; DP2's is the session's (``fixtures.groups``), shared
with NeMo RL's top-k facade tests.
"""

from __future__ import annotations

import threading

import pytest
import torch
from fixtures.checkpoints import hf_oracle_logprobs
from harness.payloads import assert_payload_matches, hf_full_logits, hf_hidden_states, lm_head_logprobs
from harness.teacher_groups import (
    TOL,
    assert_matches_oracle,
    assert_next_token_outputs_match,
    ragged_batch,
    start_group,
)

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

VOCAB = 256


@pytest.fixture(scope="module")
def tp1(ray_cluster, tiny_llama_checkpoint):
    yield from start_group(tiny_llama_checkpoint)


@pytest.fixture(scope="module")
def tp2(ray_cluster, tiny_llama_checkpoint):
    yield from start_group(tiny_llama_checkpoint, per_node=2, tp=2)


@pytest.fixture(scope="module")
def pp2(ray_cluster, tiny_llama_checkpoint):
    yield from start_group(tiny_llama_checkpoint, nodes=2, pp=2)


@pytest.fixture(scope="module")
def tp2pp2(ray_cluster, tiny_llama_checkpoint):
    yield from start_group(tiny_llama_checkpoint, nodes=2, per_node=2, tp=2, pp=2)


@pytest.fixture
def dp2(llama_dp2_group):
    return llama_dp2_group  # fixtures.groups: shared with NeMo RL's top-k facade tests


def test_tp1_matches_hf_with_topk(tp1, tiny_llama_checkpoint):
    assert tp1.facts.vocab_size == VOCAB and tp1.facts.max_sequence_length == 128
    assert tp1.facts.sequence_length_multiple == 1
    assert tp1.facts.checkpoint_path == str(tiny_llama_checkpoint)
    assert_matches_oracle(tp1, tiny_llama_checkpoint, ragged_batch(VOCAB, width=20), top_k=5)


@pytest.mark.parametrize("micro_batch_size", [1, 3, 64])
def test_tp1_micro_batch_sizes_agree(tp1, tiny_llama_checkpoint, micro_batch_size):
    assert_matches_oracle(tp1, tiny_llama_checkpoint, ragged_batch(VOCAB, seed=1), micro_batch_size=micro_batch_size)


def test_tp2_matches_hf_with_topk(tp2, tiny_llama_checkpoint):
    assert {i.tp_rank for i in tp2.worker_info} == {0, 1}
    assert_matches_oracle(tp2, tiny_llama_checkpoint, ragged_batch(VOCAB, seed=2), top_k=4)


def test_tp2_worker_holds_half_the_weights(tp1, tp2):
    full = tp1.worker_info[0].parameters_bytes
    for info in tp2.worker_info:
        # embedding, output layer and linear layers split; norms are replicated (tiny)
        assert info.parameters_bytes < 0.55 * full
        assert info.load_stats["bytes_read"] < 0.55 * tp1.worker_info[0].load_stats["bytes_read"]


def test_pp2_matches_hf(pp2, tiny_llama_checkpoint):
    assert {i.node_ip for i in pp2.worker_info} == {"127.0.0.2", "127.0.0.3"}
    assert [i.pp_rank for i in pp2.worker_info] == [0, 1]
    assert_matches_oracle(pp2, tiny_llama_checkpoint, ragged_batch(VOCAB, seed=3))


def test_tp2pp2_matches_hf_with_topk(tp2pp2, tiny_llama_checkpoint):
    nodes = {}
    for info in tp2pp2.worker_info:
        nodes.setdefault(info.node_ip, set()).add(info.pp_rank)
    # each node holds one pipeline stage (its TP pair), stages on different nodes
    assert sorted(map(sorted, nodes.values())) == [[0], [1]]
    assert_matches_oracle(tp2pp2, tiny_llama_checkpoint, ragged_batch(VOCAB, seed=4, width=18), top_k=3)


def test_dp2_matches_hf_on_odd_batches(dp2, tiny_llama_checkpoint):
    assert dp2.facts.data_parallel_size == 2 and dp2.spec.temperature == 0.8
    for lengths in [(5,), (3, 9, 1), (16, 2, 7, 7, 11)]:
        assert_matches_oracle(dp2, tiny_llama_checkpoint, ragged_batch(VOCAB, lengths, seed=len(lengths)), top_k=2)
    # DP copies get balanced tokens, not equal shares of micro-batches: of the micro-batches of 120
    # (3 × 40), 104 (the 100-token row) and 24 tokens (2 × 12), the smallest joins the 104 (taken in
    # turn, it would join the 120: 144 vs 104)
    assert_matches_oracle(dp2, tiny_llama_checkpoint, ragged_batch(VOCAB, (100, 40, 40, 40, 12, 12), seed=3))
    assert sorted(dp2.last_batch.dp_tokens) == [120, 128] and dp2.last_batch.microbatches == 3, dp2.last_batch


@pytest.mark.parametrize("layout", ["tp1", "tp2", "pp2"])
def test_topk_logits_and_candidates_match_hf_at_a_temperature(request, layout, tiny_llama_checkpoint):
    """NeMo RL's classic-distillation form (top-k of z / T, next-token alignment) through every way
    the head is split: whole (TP1), vocabulary halves merged (TP2), on the last stage (PP2)."""
    group = request.getfixturevalue(layout)
    assert_next_token_outputs_match(group, tiny_llama_checkpoint, ragged_batch(VOCAB, seed=6, width=18), k=8,
                                    temperature=0.7)


@pytest.mark.parametrize(("layout", "datatype"), [("tp1", "FP32"), ("tp1", "BF16"), ("tp2", "FP32"), ("pp2", "FP16")])
def test_hidden_states_payload_matches_hf(request, layout, datatype, tiny_llama_checkpoint):
    """NeMo RL's ``teacher_full_hidden_states``: the LM head's input (after the final norm) at every
    position of each row, as transformers' ``output_hidden_states[-1]``, captured on the last stage
    (PP2), in the dtype asked; ``log_softmax(lm_head(h))`` at the next token is the logprobs."""
    group = request.getfixturevalue(layout)
    batch = ragged_batch(VOCAB, seed=8, width=18)
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    out = group.get_logprobs(batch, outputs=["logprobs", "hidden_states"], payload_datatype=datatype)
    expected = hf_hidden_states(tiny_llama_checkpoint, ids, lengths)
    assert_payload_matches(out["hidden_states"], expected, lengths, datatype)
    if datatype == "FP32":
        valid = torch.arange(18)[None, :] < lengths[:, None]
        rebuilt = lm_head_logprobs(tiny_llama_checkpoint, out["hidden_states"], ids) * valid
        assert (rebuilt - out["logprobs"]).abs().max().item() <= TOL


@pytest.mark.parametrize(("layout", "datatype"), [("tp1", "FP32"), ("tp2", "BF16"), ("pp2", "FP32")])
def test_full_logits_payload_matches_hf(request, layout, datatype, tiny_llama_checkpoint):
    """NeMo RL's ``teacher_full_logits``: ``z / T`` over the whole vocabulary (TP2: the halves
    gathered) at every position, in the model's alignment, zero past each row."""
    group = request.getfixturevalue(layout)
    batch = ragged_batch(VOCAB, seed=9, width=18)
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    out = group.get_logprobs(batch, outputs=["logits"], temperature=0.7, payload_datatype=datatype)
    assert list(out) == ["logits"]
    assert_payload_matches(out["logits"], hf_full_logits(tiny_llama_checkpoint, ids, lengths, 0.7), lengths, datatype)


def test_concurrent_callers_are_serialised(tp2pp2, tiny_llama_checkpoint):
    batches = [ragged_batch(VOCAB, seed=10 + i) for i in range(3)]
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            results[i] = tp2pp2.get_logprobs(batches[i])["logprobs"]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for i, batch in enumerate(batches):
        expected = hf_oracle_logprobs(tiny_llama_checkpoint, batch["input_ids"], batch["input_lengths"])
        assert (results[i] - expected).abs().max().item() <= TOL


def _batch(ids, lengths):
    return {"input_ids": ids, "input_lengths": lengths}


GOOD = ragged_batch(VOCAB, (4, 6), seed=5)
BAD_INPUTS = {
    "missing key": ({"input_ids": GOOD["input_ids"]}, "input_lengths"),
    "1-D ids": (_batch(torch.tensor([1, 2, 3]), torch.tensor([3])), r"must be \[B, S\]"),
    "float ids": (_batch(GOOD["input_ids"].float(), GOOD["input_lengths"]), "integer"),
    "empty batch": (_batch(torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, dtype=torch.long)), "empty batch"),
    "lengths shape": (_batch(GOOD["input_ids"], torch.tensor([4, 6, 2])),
                      "input_ids has B=2 rows but input_lengths has 3"),
    "length > S": (_batch(GOOD["input_ids"], torch.tensor([4, 7])), r"input_lengths\[1\] = 7 not in 1..6"),
    "length < 1": (_batch(GOOD["input_ids"], torch.tensor([0, 6])), r"input_lengths\[0\] = 0 not in 1..6"),
    "token >= vocab": (_batch(torch.tensor([[1, 2, VOCAB]]), torch.tensor([3])), "outside the vocabulary"),
    "negative token": (_batch(torch.tensor([[1, -5, 3]]), torch.tensor([3])), "outside the vocabulary"),
    "too long": (_batch(torch.ones(1, 200, dtype=torch.long), torch.tensor([200])), "max_sequence_length 128"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_a_value_error_and_group_stays_usable(tp1, tiny_llama_checkpoint, case):
    data, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        tp1.validate(data)
    with pytest.raises(ValueError, match=message):
        tp1.get_logprobs(data)
    assert_matches_oracle(tp1, tiny_llama_checkpoint, GOOD)


def test_bad_call_options(tp1, tiny_llama_checkpoint):
    with pytest.raises(ValueError, match="top_k"):
        tp1.get_logprobs(GOOD, top_k=VOCAB + 1)
    with pytest.raises(ValueError, match="micro_batch_size"):
        tp1.get_logprobs(GOOD, micro_batch_size=0)
    # padding beyond the length may hold anything (ignored), e.g. -100
    data = {k: v.clone() for k, v in GOOD.items()}
    data["input_ids"][0, 4:] = -100
    out = tp1.get_logprobs(data)
    expected = hf_oracle_logprobs(tiny_llama_checkpoint, GOOD["input_ids"], GOOD["input_lengths"])
    assert (out["logprobs"] - expected).abs().max().item() <= TOL
