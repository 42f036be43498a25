"""Logprob numerics and bookkeeping without processes: the head at TP1, NeMo RL alignment,
the CP split, and the group's input handling that needs no workers."""

from __future__ import annotations

import pytest
import torch

from podium.teacher.compute.logprobs import (
    LogprobHead,
    cp_split,
    cp_unsplit,
    next_token_labels,
    next_token_outputs,
    ties_by_id,
    to_nemo_rl,
)


class _FakeLayer:
    def __init__(self, weight):
        self.weight = weight
        self.forward = None


class _FakeModel:
    def __init__(self, weight):
        self.output_layer = _FakeLayer(weight)


@pytest.mark.parametrize("chunk_elements", [7, 1 << 21])
def test_head_matches_log_softmax_and_skips_padded_rows(chunk_elements):
    gen = torch.Generator().manual_seed(0)
    seq, batch, hidden, vocab, padded = 5, 3, 8, 10, 16
    weight = torch.randn(padded, hidden, generator=gen)
    weight[vocab:] = 100.0  # padded rows must never count, whatever they hold
    h = torch.randn(seq, batch, hidden, generator=gen)
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    head = LogprobHead(vocab_size=vocab, tp_group=None, tp_rank=0, tp_size=1, chunk_elements=chunk_elements)
    model = _FakeModel(weight)
    head.install(model)
    hidden_out, _ = model.output_layer.forward(h)
    head.top_k = 4
    out = model.compute_language_model_loss(labels, hidden_out)
    ref = torch.log_softmax(h @ weight[:vocab].t(), dim=-1).transpose(0, 1)  # [b, s, v]
    assert torch.allclose(out["logprobs"], ref.gather(-1, labels[..., None]).squeeze(-1), atol=1e-5)
    vals, idx = torch.topk(ref, 4, dim=-1)
    assert torch.allclose(out["topk_values"], vals, atol=1e-5) and torch.equal(out["topk_indices"], idx)
    assert out["topk_indices"].dtype == torch.int32  # narrowed where it is free (the device)
    # masked positions skip the head and come back as zeros
    mask = torch.rand(batch, seq, generator=gen) > 0.5
    head.pending_masks = [mask]
    model.output_layer.forward(h)
    masked = model.compute_language_model_loss(labels, h)
    assert torch.allclose(masked["logprobs"][mask], out["logprobs"][mask], atol=1e-6)
    assert torch.all(masked["logprobs"][~mask] == 0) and torch.all(masked["topk_indices"][~mask] == 0)
    assert torch.equal(masked["topk_indices"][mask], out["topk_indices"][mask])


def test_head_at_a_temperature_gives_lse_and_candidate_logprobs():
    gen = torch.Generator().manual_seed(1)
    seq, batch, hidden, vocab, t = 4, 2, 8, 12, 0.6
    weight = torch.randn(vocab, hidden, generator=gen)
    h = torch.randn(seq, batch, hidden, generator=gen)
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    cands = torch.randint(0, vocab, (batch, seq, 3), generator=gen)
    head = LogprobHead(vocab_size=vocab, tp_group=None, tp_rank=0, tp_size=1)
    model = _FakeModel(weight)
    head.install(model)
    head.top_k, head.temperature, head.want_lse, head.pending_candidates = 5, t, True, [cands]
    hidden_out, _ = model.output_layer.forward(h)
    out = model.compute_language_model_loss(labels, hidden_out)
    z = (h @ weight.t()).transpose(0, 1) / t  # [b, s, v]
    ref = torch.log_softmax(z, dim=-1)
    assert torch.allclose(out["logprobs"], ref.gather(-1, labels[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(out["lse"], torch.logsumexp(z, dim=-1), atol=1e-5)
    assert torch.allclose(out["candidate_logprobs"], ref.gather(-1, cands), atol=1e-5)
    vals, idx = torch.topk(z, 5, dim=-1)  # top-k *logits* = top-k logprobs + lse
    assert torch.allclose(out["topk_values"] + out["lse"][..., None], vals, atol=1e-5)
    assert torch.equal(out["topk_indices"], idx)


def test_exact_ties_in_the_head_come_by_ascending_id():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(10, 6, generator=gen)
    weight[7] = weight[2] = weight[5] = 3.0 * torch.ones(6)  # three ids with the same, largest logit
    h = torch.ones(1, 1, 6)
    head = LogprobHead(vocab_size=10, tp_group=None, tp_rank=0, tp_size=1)
    model = _FakeModel(weight)
    head.install(model)
    head.top_k = 4
    model.output_layer.forward(h)
    out = model.compute_language_model_loss(torch.zeros(1, 1, dtype=torch.long), h)
    assert out["topk_indices"][0, 0, :3].tolist() == [2, 5, 7]


def test_exact_ties_come_by_ascending_id():
    values = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    indices = torch.tensor([[9, 7, 4, 1, 5]])
    v, i = ties_by_id(values, indices)
    assert torch.equal(v, torch.tensor([[3.0, 3.0, 3.0, 2.0, 1.0]]))
    assert torch.equal(i, torch.tensor([[4, 5, 7, 1, 9]]))


def test_next_token_outputs_are_logits_and_stop_before_the_last_token():
    lengths = torch.tensor([3, 1])
    topk = torch.full((2, 3, 2), -1.0)  # logprobs of two ids at each position
    lse = torch.full((2, 3), 4.0)
    out = next_token_outputs(lengths, topk_values=topk, topk_indices=torch.ones(2, 3, 2, dtype=torch.long), lse=lse,
                             candidate_logprobs=torch.full((2, 3, 1), -2.0))
    # position t describes the token after t: rows 0..length-2 only (a 1-token row has none)
    assert torch.equal(out["topk_logits"][0], torch.tensor([[3.0, 3.0], [3.0, 3.0], [0.0, 0.0]]))
    assert torch.all(out["topk_logits"][1] == 0) and torch.all(out["topk_logit_indices"][1] == 0)
    assert torch.equal(out["candidate_logprobs"][0, :, 0], torch.tensor([-2.0, -2.0, 0.0]))


def test_nemo_rl_alignment():
    ids = torch.tensor([[5, 6, 7, 8], [1, 2, 0, 0]])
    lengths = torch.tensor([4, 2])
    assert torch.equal(next_token_labels(ids), torch.tensor([[6, 7, 8, 0], [2, 0, 0, 0]]))
    per_position = torch.tensor([[-1.0, -2.0, -3.0, -9.0], [-4.0, -9.0, -9.0, -9.0]])
    out = to_nemo_rl(per_position, lengths)["logprobs"]
    assert torch.equal(out, torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -4.0, 0.0, 0.0]]))
    vals = per_position[..., None].repeat(1, 1, 2)
    idx = torch.ones(2, 4, 2, dtype=torch.long)
    shifted = to_nemo_rl(per_position, lengths, vals, idx)
    assert torch.equal(shifted["topk_indices"][1], torch.tensor([[0, 0], [1, 1], [0, 0], [0, 0]]))
    assert shifted["topk_logprobs"].dtype == torch.float32


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_split_round_trip(cp):
    x = torch.arange(2 * 16).view(2, 16)
    pieces = [cp_split(x, cp, r) for r in range(cp)]
    if cp == 2:
        assert pieces[0][0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert torch.equal(cp_unsplit(pieces, cp), x)


def test_group_validates_a_plain_mapping_with_the_one_batch_rule():
    from podium.protocol.batch import Batch, BatchError
    from podium.teacher.compute.group import TeacherWorkerGroup

    group = TeacherWorkerGroup.__new__(TeacherWorkerGroup)  # only validate's attributes
    group.vocab_size, group.max_sequence_length = 50, 32
    batch = group.validate({"input_ids": [[1, 2, 3, 99]], "input_lengths": [3]})
    assert batch.input_ids.tolist() == [[1, 2, 3]] and batch.width == 4  # cut, padding not checked
    assert group.validate(batch) is batch  # a validated batch is trusted, not checked again
    with pytest.raises(BatchError, match="must be a mapping"):
        group.validate([1, 2])
    with pytest.raises(BatchError, match=r"input_ids\[0, 1\] = 77 not in 0..49"):
        group.validate({"input_ids": [[1, 77]], "input_lengths": [2]})
    assert isinstance(batch, Batch)


def test_group_takes_a_spec_from_the_plan_and_known_options_only(tiny_llama_checkpoint):
    from podium.config.spec import TeacherSpec
    from podium.teacher.compute.group import GroupOptions, TeacherWorkerGroup

    with pytest.raises(TypeError, match="takes a TeacherSpec"):
        TeacherWorkerGroup({"model_name": str(tiny_llama_checkpoint)})
    spec = TeacherSpec(key="k", name="math", aliases=("math",), model_name=str(tiny_llama_checkpoint),
                       num_nodes=1, gpus_per_node=1)
    with pytest.raises(TypeError, match="bogus"):
        TeacherWorkerGroup(spec, GroupOptions(), bogus=1)


def test_layout_errors_come_before_ray(tiny_llama_checkpoint):
    from pydantic import ValidationError

    from podium.config.spec import TeacherSpec

    with pytest.raises(ValidationError,
                       match=r"teacher 'math': 1 nodes × 3 GPUs = 3 GPUs is not divisible by TP2 × PP1 × CP1 = 2"):
        TeacherSpec(key="k", name="math", aliases=("math",), model_name=str(tiny_llama_checkpoint),
                    num_nodes=1, gpus_per_node=3, tensor_model_parallel_size=2)
