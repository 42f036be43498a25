"""Fewer KV groups than TP: a dense (Qwen2, q/k/v bias) and an MoE (Qwen3-MoE, q/k norm) teacher with
ONE KV group at TP2, against HF transformers (fp32, within 1e-4), and the slicing arithmetic for
Ultra-like shapes.

Megatron (``Attention.get_query_key_value_tensors``, megatron-core 0.16.1) gives each TP rank ``1/TP``
of the fused QKV rows, all-gathers the fused output, keeps group ``rank // (TP / groups)`` and of it
query heads ``rank % (TP / groups)``; the loader must hand each rank exactly those rows, reading
only them. Negative controls (``kv_groups_controls.py``, one pair of processes for both models):
the old whole-groups slicing (no rows per rank here) is refused by the loader instead of loading
zeros, and q/k/v each cut in TP parts is far from HF; podium's map matches.
"""

from __future__ import annotations

from pathlib import Path

import controls
import pytest
import torch
from fixtures.checkpoints import make_tiny_checkpoint
from harness.teacher_groups import assert_matches_oracle, ragged_batch, start_group

from podium.config.architecture import attention_tp_problem
from podium.teacher.model.hf.slices import RankLayout, SliceReader, fuse_qkv

VOCAB = 256


@pytest.fixture(scope="module")
def qwen2_one_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint("qwen2", tmp_path_factory.mktemp("hf_qwen2_1kv"), num_key_value_heads=1)


@pytest.fixture(scope="module")
def qwen3_moe_one_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint("qwen3_moe", tmp_path_factory.mktemp("hf_qwen3_moe_1kv"), num_key_value_heads=1)


class _Desc:
    """The three fields the QKV slicing reads."""

    def __init__(self, heads: int, groups: int, head_dim: int) -> None:
        self.num_attention_heads, self.num_query_groups, self.head_dim = heads, groups, head_dim


@pytest.mark.parametrize(("heads", "groups", "head_dim", "tp"), [
    (4, 1, 16, 2), (4, 2, 16, 4), (8, 2, 4, 8), (64, 2, 8, 8), (64, 8, 8, 8), (6, 2, 4, 2), (4, 4, 4, 2),
])
def test_each_rank_reads_the_rows_megatron_keeps(heads: int, groups: int, head_dim: int, tp: int) -> None:
    """Rank slices, in rank order, are Megatron's whole fused matrix (its column-parallel split);
    with fewer groups than TP a rank's rows are share ``rank % (tp / groups)`` of group
    ``rank // (tp / groups)`` (Ultra: 64 heads, 2 groups, TP8)."""
    assert attention_tp_problem(heads, groups, head_dim, tp) is None
    q = torch.arange(heads * head_dim, dtype=torch.float64)[:, None] + 0.1  # row ids, told apart by part
    k = torch.arange(groups * head_dim, dtype=torch.float64)[:, None] + 0.2
    v = torch.arange(groups * head_dim, dtype=torch.float64)[:, None] + 0.3
    full = fuse_qkv(q, k, v, groups, heads // groups, head_dim)
    reads: list[int] = []

    def read(part: int, rows: slice) -> torch.Tensor:
        reads.append(rows.stop - rows.start)
        return (q, k, v)[part][rows]

    desc = _Desc(heads, groups, head_dim)
    pieces = [SliceReader(None, desc, RankLayout(tp_rank=r, tp_size=tp, padded_vocab_size=tp)).qkv(read)  # type: ignore[arg-type]
              for r in range(tp)]
    assert all(p.shape[0] == full.shape[0] // tp for p in pieces)
    assert torch.equal(torch.cat(pieces), full)
    assert sum(reads) == full.shape[0]  # every row read once, by one rank
    if groups < tp:  # a rank's rows lie in the block of the group Megatron keeps on it, at its share
        block, per = full.shape[0] // groups, full.shape[0] // tp
        for r, piece in enumerate(pieces):
            g, share = divmod(r, tp // groups)
            assert torch.equal(piece, full[g * block + share * per:g * block + (share + 1) * per])


@pytest.mark.parametrize(("heads", "groups", "head_dim", "tp", "message"), [
    (4, 2, 16, 8, "TP8 must divide the attention heads (4: 4 / 8 is not whole)"),
    (12, 3, 8, 2, "TP2 must divide the KV groups (3: 3 / 2 is not whole)"),
    (24, 3, 8, 8, "with fewer KV groups (3) than TP8, TP must be a multiple of them (8 / 3 is not whole)"),
    (8, 2, 1, 8, "with fewer KV groups (2) than TP8, TP must divide the fused QKV rows "
                 "((heads 8 + 2 × groups 2) × head_dim 1 = 12)"),
])
def test_what_megatron_cannot_split_is_refused_with_the_arithmetic(heads: int, groups: int, head_dim: int, tp: int,
                                                                   message: str) -> None:
    assert attention_tp_problem(heads, groups, head_dim, tp) == message


def test_the_worker_check_accepts_one_group_at_tp2_and_names_the_rule(qwen2_one_group: Path) -> None:
    from podium.teacher.model.checkpoint_loader import describe_model
    from podium.teacher.model.megatron_config import check_model_layout

    desc = describe_model(qwen2_one_group)
    assert (desc.num_attention_heads, desc.num_query_groups) == (4, 1)
    check_model_layout(desc, {"tensor_model_parallel_size": 2})
    check_model_layout(desc, {"tensor_model_parallel_size": 4})
    with pytest.raises(ValueError, match=r"Qwen2ForCausalLM: TP8 must divide the attention heads \(4: 4 / 8"):
        check_model_layout(desc, {"tensor_model_parallel_size": 8})


@pytest.fixture
def dense_tp2(ray_cluster, qwen2_one_group: Path):
    yield from start_group(qwen2_one_group, per_node=2, tp=2)


@pytest.fixture
def moe_tp2_ep2(ray_cluster, qwen3_moe_one_group: Path):
    yield from start_group(qwen3_moe_one_group, per_node=2, tp=2, expert_model_parallel_size=2)


@pytest.mark.ray
@pytest.mark.megatron
def test_dense_teacher_with_one_kv_group_at_tp2_matches_hf(dense_tp2, qwen2_one_group: Path) -> None:
    assert {i.tp_rank for i in dense_tp2.worker_info} == {0, 1}
    assert_matches_oracle(dense_tp2, qwen2_one_group, ragged_batch(VOCAB, seed=21), top_k=4)


@pytest.mark.ray
@pytest.mark.megatron
def test_moe_teacher_with_one_kv_group_at_tp2_matches_hf(moe_tp2_ep2, qwen3_moe_one_group: Path) -> None:
    info = moe_tp2_ep2.worker_info
    assert sorted(i.tp_rank for i in info) == sorted(i.ep_rank for i in info) == [0, 1]
    assert_matches_oracle(moe_tp2_ep2, qwen3_moe_one_group, ragged_batch(VOCAB, seed=22), top_k=4)


@pytest.mark.megatron
def test_the_oracle_catches_the_old_slicing_and_a_per_projection_split(
        qwen2_one_group: Path, qwen3_moe_one_group: Path, tmp_path: Path) -> None:
    result = controls.run("kv_groups_controls.py", tmp_path, [qwen2_one_group, qwen3_moe_one_group])
    for diffs in result.values():
        assert diffs["right"] < 1e-4 and diffs["split_per_projection"] > 1.0, result
        assert "map selected no rows for Megatron parameter 'decoder.layers.0.self_attention.linear_qkv.weight' " \
               "(TP rank 0/2)" in diffs["old_slicing"], result
