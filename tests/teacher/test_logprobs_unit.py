"""Logprob numerics and bookkeeping without processes: the head at TP1, NeMo RL alignment,
micro-batch plans, the CP split, and the group's input handling that needs no workers."""

from __future__ import annotations

import pytest
import torch

from podium.teacher.logprobs import (
    LogprobHead,
    cp_split,
    cp_unsplit,
    next_token_labels,
    plan_microbatches,
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
    # masked positions skip the head and come back as zeros
    mask = torch.rand(batch, seq, generator=gen) > 0.5
    head.pending_masks = [mask]
    model.output_layer.forward(h)
    masked = model.compute_language_model_loss(labels, h)
    assert torch.allclose(masked["logprobs"][mask], out["logprobs"][mask], atol=1e-6)
    assert torch.all(masked["logprobs"][~mask] == 0) and torch.all(masked["topk_indices"][~mask] == 0)
    assert torch.equal(masked["topk_indices"][mask], out["topk_indices"][mask])


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


def test_microbatch_plan_trims_each_to_its_longest_row():
    plan = plan_microbatches([3, 9, 1, 4, 2], 2, seq_multiple=4)
    assert [(m.start, m.end, m.seq_len) for m in plan] == [(0, 2, 12), (2, 4, 4), (4, 5, 4)]


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_split_round_trip(cp):
    x = torch.arange(2 * 16).view(2, 16)
    pieces = [cp_split(x, cp, r) for r in range(cp)]
    if cp == 2:
        assert pieces[0][0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert torch.equal(cp_unsplit(pieces, cp), x)


def test_group_input_validation_without_workers():
    from podium.teacher.group import TeacherWorkerGroup

    group = TeacherWorkerGroup.__new__(TeacherWorkerGroup)  # only _prepare's attributes
    group.vocab_size, group.max_sequence_length = 50, 32
    ids, lengths = group._prepare({"input_ids": [[1, 2, 3, 99]], "input_lengths": [3]}, None, None)
    assert ids.tolist() == [[1, 2, 3]] and lengths.tolist() == [3]  # trimmed, padding ignored
    with pytest.raises(ValueError, match="data must hold"):
        group._prepare([1, 2], None, None)
    with pytest.raises(ValueError, match="top_k"):
        group._prepare({"input_ids": [[1]], "input_lengths": [1]}, None, True)


def test_teacher_cfg_mappings():
    from podium.config.spec import TeacherSpec
    from podium.teacher.group import GroupOptions, coerce_teacher_spec

    spec = coerce_teacher_spec({
        "model_name": "/ckpt/qwen/", "precision": "bfloat16",
        "megatron_cfg": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "optimizer": {}},
        "cluster": {"num_nodes": 2, "gpus_per_node": 4},
    })
    assert isinstance(spec, TeacherSpec)
    assert (spec.name, spec.precision, spec.tensor_model_parallel_size, spec.world_size) == ("qwen", "bf16", 2, 8)
    assert dict(spec.megatron_cfg_overrides) == {"optimizer": {}}
    assert coerce_teacher_spec(spec) is spec
    with pytest.raises(ValueError, match="model_name"):
        coerce_teacher_spec({"num_nodes": 1})
    opts = GroupOptions.from_sources({"env_vars": {"NCCL_DEBUG": "WARN"}, "other": 1}, {"torch_threads": 2})
    assert opts.env_vars == {"NCCL_DEBUG": "WARN"} and opts.torch_threads == 2
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['bogus'\]"):
        GroupOptions.from_sources(None, {"bogus": 1})


def test_layout_errors_come_before_ray(tiny_llama_checkpoint):
    from podium.teacher.group import TeacherWorkerGroup

    cfg = {"model_name": str(tiny_llama_checkpoint), "num_nodes": 1, "gpus_per_node": 3,
           "tensor_model_parallel_size": 2, "name": "math"}
    with pytest.raises(ValueError, match=r"teacher 'math': 3 workers \(1 nodes × 3\) is not a multiple of TP2 × PP1 × CP1 = 2"):
        TeacherWorkerGroup(cfg)
