"""The logprob head at TP1 without processes: logprobs, top-k, log-sum-exp and candidates against
``log_softmax`` of the logits, padded positions skipped, exact ties by id."""

from __future__ import annotations

import pytest
import torch
from harness.head_model import HeadModel

from podium.teacher.compute.head import HeadCall, HeadInputs, LogprobHead, ties_by_id


@pytest.mark.parametrize("chunk_elements", [7, 1 << 21])
def test_head_matches_log_softmax_and_skips_padded_rows(chunk_elements):
    gen = torch.Generator().manual_seed(0)
    seq, batch, hidden, vocab, padded = 5, 3, 8, 10, 16
    weight = torch.randn(padded, hidden, generator=gen)
    weight[vocab:] = 100.0  # padded rows must never count, whatever they hold
    h = torch.randn(seq, batch, hidden, generator=gen)
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    head = LogprobHead(vocab_size=vocab, tp_group=None, tp_rank=0, tp_size=1, chunk_elements=chunk_elements)
    model = HeadModel(weight)
    head.install(model)
    hidden_out, _ = model.output_layer.forward(h)
    call = HeadCall(top_k=4)
    with head.serving(call, [HeadInputs()]):
        out = model.compute_language_model_loss(labels, hidden_out)
    ref = torch.log_softmax(h @ weight[:vocab].t(), dim=-1).transpose(0, 1)  # [b, s, v]
    assert torch.allclose(out["logprobs"], ref.gather(-1, labels[..., None]).squeeze(-1), atol=1e-5)
    vals, idx = torch.topk(ref, 4, dim=-1)
    assert torch.allclose(out["topk_values"], vals, atol=1e-5) and torch.equal(out["topk_indices"], idx)
    assert out["topk_indices"].dtype == torch.int32  # narrowed where it is free (the device)
    # masked positions skip the head and come back as zeros
    mask = torch.rand(batch, seq, generator=gen) > 0.5
    model.output_layer.forward(h)
    with head.serving(call, [HeadInputs(wanted=mask)]):
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
    model = HeadModel(weight)
    head.install(model)
    hidden_out, _ = model.output_layer.forward(h)
    with head.serving(HeadCall(temperature=t, top_k=5, want_lse=True), [HeadInputs(candidates=cands)]):
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
    model = HeadModel(weight)
    head.install(model)
    model.output_layer.forward(h)
    with head.serving(HeadCall(top_k=4), [HeadInputs()]):
        out = model.compute_language_model_loss(torch.zeros(1, 1, dtype=torch.long), h)
    assert out["topk_indices"][0, 0, :3].tolist() == [2, 5, 7]


def test_exact_ties_come_by_ascending_id():
    values = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    indices = torch.tensor([[9, 7, 4, 1, 5]])
    v, i = ties_by_id(values, indices)
    assert torch.equal(v, torch.tensor([[3.0, 3.0, 3.0, 2.0, 1.0]]))
    assert torch.equal(i, torch.tensor([[4, 5, 7, 1, 9]]))
