"""torch_dist checkpoints: ``convert_hf_to_torch_dist`` output, loaded at other layouts (resharding),
dense (TP/PP), MoE (experts saved at EP2, loaded at EP1 split over expert-TP) and gpt-oss's
attention sinks (saved at TP2, loaded at TP1).

Converts run in a subprocess (``dist_checkpointing.save`` starts spawned processes and a process
group; the test process stays clean).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fixtures.checkpoints import hf_oracle_logprobs
from harness.teacher_groups import assert_matches_oracle, ragged_batch, start_group

pytestmark = [pytest.mark.megatron]

VOCAB = 256


def run_convert(src: Path, dst: Path, tp: int = 1, pp: int = 1, expect_ok: bool = True,
                ep: int = 1) -> subprocess.CompletedProcess:
    """``podium convert`` as a user runs it (the CLI in a subprocess)."""
    proc = subprocess.run(
        [sys.executable, "-m", "podium.cli", "convert", str(src), str(dst), "--tp", str(tp), "--pp", str(pp),
         "--ep", str(ep), "--precision", "fp32"],
        capture_output=True, text=True, timeout=300,
    )
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def converted_tp1(tiny_llama_checkpoint, tmp_path_factory):
    dst = tmp_path_factory.mktemp("dist") / "llama_tp1"
    run_convert(tiny_llama_checkpoint, dst)
    return dst


@pytest.fixture(scope="module")
def converted_tp2(tiny_llama_checkpoint, tmp_path_factory):
    dst = tmp_path_factory.mktemp("dist") / "llama_tp2"
    run_convert(tiny_llama_checkpoint, dst, tp=2)
    return dst


@pytest.fixture(scope="module")
def hf_tp2(ray_cluster, tiny_llama_checkpoint):
    yield from start_group(tiny_llama_checkpoint, per_node=2, tp=2)


@pytest.fixture(scope="module")
def dist_tp1_at_tp2(ray_cluster, converted_tp1):
    yield from start_group(converted_tp1, per_node=2, tp=2)


def test_convert_output_layout(converted_tp1, tiny_llama_checkpoint):
    names = {p.name for p in converted_tp1.iterdir()}
    assert {"metadata.json", "config.json", "podium_convert.json", "common.pt"} <= names
    provenance = json.loads((converted_tp1 / "podium_convert.json").read_text())
    assert provenance["architecture"] == "LlamaForCausalLM"
    assert provenance["saved_layout"] == {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1}
    assert provenance["source"] == str(tiny_llama_checkpoint)
    # no temp dir left next to it, nothing written next to the source
    assert [p.name for p in converted_tp1.parent.iterdir()] == [converted_tp1.name]
    assert not any(".tmp-" in p.name for p in tiny_llama_checkpoint.parent.iterdir())


@pytest.mark.ray
def test_converted_loads_at_tp2_and_equals_direct_hf_load(hf_tp2, dist_tp1_at_tp2, tiny_llama_checkpoint):
    assert {i.checkpoint_kind for i in dist_tp1_at_tp2.worker_info} == {"torch_dist"}
    batch = ragged_batch(VOCAB, seed=21)
    direct = assert_matches_oracle(hf_tp2, tiny_llama_checkpoint, batch, top_k=3)
    loaded = assert_matches_oracle(dist_tp1_at_tp2, tiny_llama_checkpoint, batch, top_k=3)
    for key in direct:
        assert torch.equal(direct[key], loaded[key]), key


@pytest.mark.ray
@pytest.mark.parametrize("layout", [{"nodes": 2, "pp": 2}, {}], ids=["PP2", "TP1"])
def test_saved_at_tp2_loads_at_other_layouts(ray_cluster, converted_tp2, tiny_llama_checkpoint, layout):
    provenance = json.loads((converted_tp2 / "podium_convert.json").read_text())
    assert provenance["saved_layout"]["tensor_model_parallel_size"] == 2
    for group in start_group(converted_tp2, **layout):
        assert_matches_oracle(group, tiny_llama_checkpoint, ragged_batch(VOCAB, seed=22), top_k=2)


@pytest.fixture(scope="module")
def converted_moe_ep2(tiny_qwen3_moe_checkpoint, tmp_path_factory):
    """The tiny Qwen3-MoE written by two processes at EP2 (each reads and saves only its experts)."""
    dst = tmp_path_factory.mktemp("dist") / "qwen3_moe_ep2"
    code = ("import sys\nfrom podium.teacher.model.convert import convert_hf_to_torch_dist\n"
            "if __name__ == '__main__':\n"
            "    convert_hf_to_torch_dist(sys.argv[1], sys.argv[2], ep=2, precision='fp32')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_qwen3_moe_checkpoint), str(dst)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dst


@pytest.mark.ray
def test_moe_saved_at_ep2_loads_with_every_expert_split_over_tp2(ray_cluster, converted_moe_ep2,
                                                                 tiny_qwen3_moe_checkpoint):
    """Experts resharded: saved as two EP ranks of two whole experts each, loaded as one EP rank
    holding all four, each split over expert-TP2 (TP2·EP1·ETP2 on 2 ranks)."""
    provenance = json.loads((converted_moe_ep2 / "podium_convert.json").read_text())
    assert provenance["saved_layout"]["expert_model_parallel_size"] == 2
    for group in start_group(converted_moe_ep2, per_node=2, tp=2, expert_tensor_parallel_size=2):
        assert {(i.ep_rank, i.etp_rank) for i in group.worker_info} == {(0, 0), (0, 1)}
        batch = ragged_batch(VOCAB, seed=23)
        out = assert_matches_oracle(group, tiny_qwen3_moe_checkpoint, batch, top_k=3)
        expected = hf_oracle_logprobs(tiny_qwen3_moe_checkpoint, batch["input_ids"], batch["input_lengths"])
        diff = float((out["logprobs"] - expected).abs().max())
        print(f"max abs diff vs HF {diff:.3g}")
        assert diff <= 1e-5


@pytest.mark.ray
def test_gpt_oss_sinks_saved_at_tp2_load_at_tp1(ray_cluster, tiny_gpt_oss_checkpoint, tmp_path):
    """gpt-oss's attention sinks (podium's SDPA core attention's ``softmax_offset``) are saved split
    over TP along the heads, as megatron's own attention saves them: converted at TP2, served at TP1
    (without that, the TP1 load fails: the checkpoint holds one rank's half)."""
    dst = tmp_path / "gpt_oss_tp2"
    run_convert(tiny_gpt_oss_checkpoint, dst, tp=2)
    for group in start_group(dst):
        assert_matches_oracle(group, tiny_gpt_oss_checkpoint, ragged_batch(VOCAB, seed=83), top_k=3)


def test_convert_refuses_existing_destination_and_non_hf_sources(converted_tp1, tiny_llama_checkpoint, tmp_path):
    from podium.teacher.model.convert import convert_hf_to_torch_dist

    proc = run_convert(tiny_llama_checkpoint, converted_tp1, expect_ok=False)
    assert proc.returncode == 2 and f"destination {converted_tp1} exists" in proc.stderr, proc.stderr
    with pytest.raises(ValueError, match="exists"):
        convert_hf_to_torch_dist(tiny_llama_checkpoint, converted_tp1)
    with pytest.raises(ValueError, match="not an HF directory"):
        convert_hf_to_torch_dist(converted_tp1, tmp_path / "out")
    with pytest.raises(ValueError, match="LlamaForCausalLM: has no routed experts; expert_model_parallel_size=2"):
        convert_hf_to_torch_dist(tiny_llama_checkpoint, tmp_path / "out", ep=2)
    proc = run_convert(tiny_llama_checkpoint, tmp_path / "out", ep=2, expect_ok=False)  # the CLI's --ep
    assert proc.returncode == 2 and "has no routed experts; expert_model_parallel_size=2" in proc.stderr, proc.stderr
    bad = tmp_path / "bert"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    (bad / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=f"checkpoint {bad}: architecture \\['BertModel'\\] is not supported"):
        convert_hf_to_torch_dist(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_run_directory_with_latest_iteration_resolves(converted_tp1, tmp_path):
    """One rule for plan and worker: what the planner accepts is what the worker loads."""
    from podium.config.checkpoints import CheckpointError, checkpoint_problem, find_checkpoint, torch_dist_dir
    from podium.teacher.model.checkpoint_loader import resolve_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    (run / "iter_0000007").symlink_to(converted_tp1, target_is_directory=True)
    (run / "latest_checkpointed_iteration.txt").write_text("7\n")
    assert torch_dist_dir(run) == run / "iter_0000007"
    assert find_checkpoint(run).kind == "torch_dist" and checkpoint_problem(run) is None
    assert resolve_checkpoint(run).path == run / "iter_0000007"
    (run / "latest_checkpointed_iteration.txt").write_text("9\n")
    with pytest.raises(CheckpointError, match="iter_0000009"):
        torch_dist_dir(run)
    assert "iter_0000009" in checkpoint_problem(run)
    with pytest.raises(ValueError, match="iter_0000009"):
        resolve_checkpoint(run)
    assert torch_dist_dir(tmp_path) is None
