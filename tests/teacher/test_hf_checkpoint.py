"""HF name/layout maps: architecture descriptions, per-rank slices, sharded index, clear errors.

No processes, no Megatron model: the maps are called directly and checked against the full
tensors, so a TP rank's slice is exactly Megatron's partition of the fused tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from podium.teacher.model.checkpoint_loader import describe_model
from podium.teacher.model.hf import RankLayout, SafetensorsCheckpoint, describe_hf_config
from podium.teacher.model.hf.dense import gpt2_sources, llama_sources
from podium.teacher.model.hf.slices import SliceReader


def reader(path: Path, tp_rank: int = 0, tp: int = 1, padded: int | None = None) -> SliceReader:
    desc = describe_model(path)
    padded = padded or desc.vocab_size
    return SliceReader(SafetensorsCheckpoint(path), desc, RankLayout(tp_rank, tp, padded))


def test_descriptions(tiny_checkpoints):
    llama = describe_model(tiny_checkpoints["llama"])
    assert (llama.family, llama.num_query_groups, llama.head_dim, llama.tied_embeddings) == ("llama", 2, 16, False)
    assert not llama.qkv_bias and not llama.qk_norm and llama.rope_scaling is None
    qwen2 = describe_model(tiny_checkpoints["qwen2"])
    assert qwen2.qkv_bias and not qwen2.attn_out_bias and qwen2.rotary_base == 1e6
    qwen3 = describe_model(tiny_checkpoints["qwen3"])
    assert qwen3.qk_norm and qwen3.tied_embeddings and qwen3.head_dim == 24
    gpt2 = describe_model(tiny_checkpoints["gpt2"])
    assert (gpt2.family, gpt2.activation, gpt2.position_embedding_type, gpt2.normalization) == (
        "gpt2", "gelu_tanh", "learned_absolute", "LayerNorm")
    assert gpt2.tied_embeddings and gpt2.vocab_size == 101


def test_mistral_and_rope_scaling_configs():
    from transformers import LlamaConfig, MistralConfig

    mistral = MistralConfig(sliding_window=64).to_dict() | {"architectures": ["MistralForCausalLM"]}
    desc = describe_hf_config(mistral)
    assert desc.family == "llama" and desc.sliding_window == 64
    llama3 = LlamaConfig(
        max_position_embeddings=16384,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        rope_theta=500000.0,
    ).to_dict() | {"architectures": ["LlamaForCausalLM"]}
    desc = describe_hf_config(llama3)
    assert desc.rope_scaling == {"rope_type": "llama3", "factor": 8.0} and desc.rotary_base == 500000.0
    # transformers 4.x style fields
    old = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "intermediate_size": 96, "vocab_size": 10, "rope_theta": 123.0,
           "rope_scaling": {"type": "yarn", "factor": 4}}
    with pytest.raises(ValueError, match="checkpoint ckpt-x: rope scaling type 'yarn' is not supported"):
        describe_hf_config(old, "ckpt-x")
    old["rope_scaling"] = None
    assert describe_hf_config(old).rotary_base == 123.0


def test_unknown_architecture_names_checkpoint_and_architecture():
    with pytest.raises(ValueError, match=r"checkpoint /ckpt/bert: architecture \['BertForMaskedLM'\] is not supported"):
        describe_hf_config({"architectures": ["BertForMaskedLM"]}, "/ckpt/bert")


def full_llama_layer(path: Path, layer: int) -> dict[str, torch.Tensor]:
    r = reader(path)
    names = ["self_attention.linear_qkv.weight", "self_attention.linear_proj.weight",
             "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]
    return {n: llama_sources(r, layer, n) for n in names}


def test_llama_fused_qkv_layout_matches_hf(tiny_llama_checkpoint):
    from safetensors.torch import load_file

    sd = load_file(str(tiny_llama_checkpoint / "model.safetensors"))
    qkv = llama_sources(reader(tiny_llama_checkpoint), 1, "self_attention.linear_qkv.weight")
    hd, groups, qpg = 16, 2, 2
    q = sd["model.layers.1.self_attn.q_proj.weight"].view(groups, qpg * hd, -1)
    k = sd["model.layers.1.self_attn.k_proj.weight"].view(groups, hd, -1)
    v = sd["model.layers.1.self_attn.v_proj.weight"].view(groups, hd, -1)
    per_group = qkv.view(groups, (qpg + 2) * hd, -1)
    for g in range(groups):
        assert torch.equal(per_group[g, : qpg * hd], q[g])
        assert torch.equal(per_group[g, qpg * hd : (qpg + 1) * hd], k[g])
        assert torch.equal(per_group[g, (qpg + 1) * hd :], v[g])
    fc1 = llama_sources(reader(tiny_llama_checkpoint), 1, "mlp.linear_fc1.weight")
    assert torch.equal(fc1, torch.cat([sd["model.layers.1.mlp.gate_proj.weight"],
                                       sd["model.layers.1.mlp.up_proj.weight"]]))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_tp2_slices_are_megatron_partitions_of_the_full_tensors(tiny_checkpoints, kind):
    path = tiny_checkpoints[kind]
    full = reader(path)
    for rank in range(2):
        part = reader(path, rank, 2)
        for name in ["self_attention.linear_qkv.weight", "self_attention.linear_proj.weight",
                     "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"]:
            whole = llama_sources(full, 0, name)
            mine = llama_sources(part, 0, name)
            if name.endswith(("linear_qkv.weight",)):
                expected = whole.chunk(2, dim=0)[rank]  # whole query groups per rank
            elif name == "mlp.linear_fc1.weight":  # partition stride 2: gate and up halves each split
                gate, up = whole.chunk(2, dim=0)
                expected = torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]])
            else:  # row parallel: input columns
                expected = whole.chunk(2, dim=1)[rank]
            assert torch.equal(mine, expected), (kind, name, rank)
        if kind == "qwen2":
            whole_b = llama_sources(full, 0, "self_attention.linear_qkv.bias")
            assert torch.equal(llama_sources(part, 0, "self_attention.linear_qkv.bias"), whole_b.chunk(2)[rank])


def test_each_rank_reads_only_its_slices(tiny_llama_checkpoint):
    full = reader(tiny_llama_checkpoint)
    llama_sources(full, 2, "self_attention.linear_qkv.weight")
    llama_sources(full, 2, "mlp.linear_fc1.weight")
    half = reader(tiny_llama_checkpoint, 1, 2)
    llama_sources(half, 2, "self_attention.linear_qkv.weight")
    llama_sources(half, 2, "mlp.linear_fc1.weight")
    assert half.ckpt.bytes_read * 2 == full.ckpt.bytes_read


def test_padded_vocabulary_rows_are_zero_and_split(tiny_gpt2_checkpoint):
    from safetensors.torch import load_file

    wte = load_file(str(tiny_gpt2_checkpoint / "model.safetensors"))["transformer.wte.weight"]
    r0 = gpt2_sources(reader(tiny_gpt2_checkpoint, 0, 2, padded=256), None, "embedding.word_embeddings.weight")
    r1 = gpt2_sources(reader(tiny_gpt2_checkpoint, 1, 2, padded=256), None, "output_layer.weight")
    assert r0.shape == r1.shape == (128, 64)
    assert torch.equal(r0[:101], wte) and torch.all(r0[101:] == 0) and torch.all(r1 == 0)


def test_gpt2_conv1d_weights_are_transposed(tiny_gpt2_checkpoint):
    from safetensors.torch import load_file

    sd = load_file(str(tiny_gpt2_checkpoint / "model.safetensors"))
    r = reader(tiny_gpt2_checkpoint)
    assert torch.equal(gpt2_sources(r, 0, "mlp.linear_fc1.weight"), sd["transformer.h.0.mlp.c_fc.weight"].t())
    assert torch.equal(gpt2_sources(r, 0, "self_attention.linear_proj.weight"),
                       sd["transformer.h.0.attn.c_proj.weight"].t())
    qkv = gpt2_sources(r, 0, "self_attention.linear_qkv.weight").view(4, 3, 16, 64)  # [head, (q,k,v), hd, in]
    q, k, v = sd["transformer.h.0.attn.c_attn.weight"].t().view(3, 4, 16, 64)
    assert torch.equal(qkv[:, 0], q) and torch.equal(qkv[:, 1], k) and torch.equal(qkv[:, 2], v)
    half = reader(tiny_gpt2_checkpoint, 1, 2)
    assert torch.equal(gpt2_sources(half, 0, "self_attention.linear_qkv.weight"),
                       gpt2_sources(r, 0, "self_attention.linear_qkv.weight").chunk(2)[1])


def test_sharded_index_reads_the_same_tensors(tiny_llama_checkpoint, tiny_llama_sharded_checkpoint):
    assert (tiny_llama_sharded_checkpoint / "model.safetensors.index.json").is_file()
    a, b = reader(tiny_llama_checkpoint, 1, 2), reader(tiny_llama_sharded_checkpoint, 1, 2)
    for layer in range(4):
        for name in ["self_attention.linear_qkv.weight", "mlp.linear_fc2.weight", "input_layernorm.weight"]:
            assert torch.equal(llama_sources(a, layer, name), llama_sources(b, layer, name))
    assert torch.equal(llama_sources(a, None, "output_layer.weight"), llama_sources(b, None, "output_layer.weight"))


def test_missing_tensor_and_missing_shard_name_checkpoint_and_key(tiny_llama_checkpoint, tiny_llama_sharded_checkpoint,
                                                                   tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_checkpoint, broken)
    sd = load_file(str(broken / "model.safetensors"))
    del sd["model.layers.3.mlp.up_proj.weight"]
    save_file(sd, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match=f"checkpoint {broken}: tensor 'model.layers.3.mlp.up_proj.weight' is missing"):
        llama_sources(reader(broken), 3, "mlp.linear_fc1.weight")
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_llama_sharded_checkpoint, sharded)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.norm.weight"]
    (sharded / shard).unlink()
    missing = f"checkpoint {sharded}: shard {shard} \\(for tensor 'model.norm.weight'\\) is missing"
    with pytest.raises(ValueError, match=missing):
        llama_sources(reader(sharded), None, "decoder.final_layernorm.weight")
