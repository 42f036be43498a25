"""TeacherWorkerGroup on Qwen3 (q/k norm, tied embeddings across PP stages), GPT-2 (Conv1D, learned
positions, odd vocabulary padded for TP2), Qwen2 (q/k/v bias) and Mistral (sliding window shorter
than the sequences), plus lifecycle: shutdown, the ``__del__`` safety net, errors at construction."""

from __future__ import annotations

import gc

import pytest
import ray
from harness.teacher_groups import assert_matches_oracle, ragged_batch, shut_down_and_check, start_group, teacher_cfg

from podium.teacher.compute.group import TeacherWorkerGroup

pytestmark = [pytest.mark.ray, pytest.mark.megatron]


@pytest.fixture(scope="module")
def qwen3_pp2(ray_cluster, tiny_qwen3_checkpoint):
    yield from start_group(tiny_qwen3_checkpoint, nodes=2, pp=2)


@pytest.fixture(scope="module")
def gpt2_tp2(ray_cluster, tiny_gpt2_checkpoint):
    yield from start_group(tiny_gpt2_checkpoint, per_node=2, tp=2)


@pytest.fixture(scope="module")
def qwen2_tp2(ray_cluster, tiny_qwen2_checkpoint):
    yield from start_group(tiny_qwen2_checkpoint, per_node=2, tp=2)


def test_qwen3_tied_embeddings_across_pipeline_stages(qwen3_pp2, tiny_qwen3_checkpoint):
    assert_matches_oracle(qwen3_pp2, tiny_qwen3_checkpoint, ragged_batch(256, seed=7), top_k=3)


def test_gpt2_tp2_with_padded_vocabulary(gpt2_tp2, tiny_gpt2_checkpoint):
    assert gpt2_tp2.facts.vocab_size == 101
    padded = gpt2_tp2.worker_info[0].padded_vocab_size
    assert padded % 2 == 0 and padded > 101
    assert_matches_oracle(gpt2_tp2, tiny_gpt2_checkpoint, ragged_batch(101, seed=8), top_k=6)


def test_gpt2_rejects_padded_vocabulary_ids(gpt2_tp2):
    batch = ragged_batch(101, (3,), seed=0)
    batch["input_ids"][0, 1] = 101  # a padded row of the embedding, not a token
    with pytest.raises(ValueError, match=r"input_ids\[0, 1\] = 101 not in 0..100"):
        gpt2_tp2.get_logprobs(batch)


def test_qwen2_tp2_with_qkv_bias(qwen2_tp2, tiny_qwen2_checkpoint):
    assert_matches_oracle(qwen2_tp2, tiny_qwen2_checkpoint, ragged_batch(256, seed=9), top_k=2)


def test_mistral_sliding_window(ray_cluster, tiny_mistral_checkpoint):
    with TeacherWorkerGroup(teacher_cfg(tiny_mistral_checkpoint)) as group:
        assert_matches_oracle(group, tiny_mistral_checkpoint, ragged_batch(256, seed=11), top_k=2)


def test_shutdown_releases_actors_and_placement_group_twice(ray_cluster, tiny_gpt2_checkpoint):
    group = TeacherWorkerGroup(teacher_cfg(tiny_gpt2_checkpoint))
    assert_matches_oracle(group, tiny_gpt2_checkpoint, ragged_batch(101, (4, 2), seed=1))
    # removed placement group, dead workers, a harmless repeat, calls refused
    shut_down_and_check(group)


def test_dropped_group_is_released_by_del(ray_cluster, tiny_gpt2_checkpoint):
    group = TeacherWorkerGroup(teacher_cfg(tiny_gpt2_checkpoint))
    pg_id = group._placement_group.id.hex()
    del group
    gc.collect()
    assert ray.util.placement_group_table()[pg_id]["state"] == "REMOVED"


def test_construction_errors_name_the_problem(ray_cluster, tiny_llama_checkpoint, tmp_path):
    before = len(ray.util.placement_group_table())
    with pytest.raises(ValueError, match=r"megatron_cfg_overrides\.not_a_megatron_key: unknown key: not a "):
        TeacherWorkerGroup(teacher_cfg(tiny_llama_checkpoint, megatron_cfg_overrides={"not_a_megatron_key": 1}))
    with pytest.raises(ValueError, match=r"3 GPUs is not divisible by TP2 × PP1 × CP1 = 2"):
        TeacherWorkerGroup(teacher_cfg(tiny_llama_checkpoint, per_node=3, tp=2))
    # 2 KV groups at TP4 is fine (fewer groups than TP: test_kv_groups.py); 4 heads at TP8 is not
    with pytest.raises(ValueError, match=r"TP8 must divide the attention heads \(4: 4 / 8 is not whole\)"):
        TeacherWorkerGroup(teacher_cfg(tiny_llama_checkpoint, per_node=8, tp=8))
    with pytest.raises(ValueError, match=f"checkpoint {tmp_path}/nope: no such directory"):
        TeacherWorkerGroup(teacher_cfg(tmp_path / "nope"))
    # nothing was placed for any of them
    assert len(ray.util.placement_group_table()) == before


def test_training_only_overrides_are_accepted(ray_cluster, tiny_gpt2_checkpoint):
    cfg = teacher_cfg(tiny_gpt2_checkpoint,
                      megatron_cfg_overrides={"optimizer": {"lr": 1.0}, "layernorm_zero_centered_gamma": False})
    with TeacherWorkerGroup(cfg) as group:
        assert_matches_oracle(group, tiny_gpt2_checkpoint, ragged_batch(101, (5, 3), seed=2))
