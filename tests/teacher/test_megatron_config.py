"""TransformerConfig from (architecture, layout, precision, overrides): layout in the config,
overrides applied, unknown keys reported."""

from __future__ import annotations

import pytest
import torch

from podium.teacher.checkpoint_loader import describe_model
from podium.teacher.megatron_model import build_transformer_config, padded_vocab_size, split_overrides

pytestmark = [pytest.mark.megatron]

LAYOUT = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}


def test_layout_and_architecture_go_into_the_config(tiny_checkpoints):
    desc = describe_model(tiny_checkpoints["qwen3"])
    cfg = build_transformer_config(desc, LAYOUT, "bf16")
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (2, 2)
    assert (cfg.num_layers, cfg.kv_channels, cfg.num_query_groups, cfg.qk_layernorm) == (2, 24, 2, True)
    assert cfg.params_dtype == torch.bfloat16 and cfg.bf16 and cfg.normalization == "RMSNorm"
    assert cfg.gated_linear_unit and not cfg.add_bias_linear and not cfg.perform_initialization
    gpt2 = build_transformer_config(describe_model(tiny_checkpoints["gpt2"]), {}, "fp32")
    assert gpt2.add_bias_linear and gpt2.add_qkv_bias and not gpt2.gated_linear_unit
    assert gpt2.normalization == "LayerNorm" and gpt2.layernorm_epsilon == 1e-5


def test_overrides_applied_and_unknown_keys_reported(tiny_llama_checkpoint):
    desc = describe_model(tiny_llama_checkpoint)
    cfg = build_transformer_config(desc, {}, "fp32", {"layernorm_zero_centered_gamma": True, "optimizer": {"lr": 1}})
    assert cfg.layernorm_zero_centered_gamma is True
    with pytest.raises(ValueError, match=r"teacher 'x': unknown key\(s\) \['hidden_sise'\].*similar fields: .*hidden_size"):
        build_transformer_config(desc, {}, "fp32", {"hidden_sise": 3}, where="teacher 'x'")
    with pytest.raises(ValueError, match="tensor_model_parallel_size=4 contradicts the planned layout"):
        build_transformer_config(desc, {"tensor_model_parallel_size": 2}, "fp32", {"tensor_model_parallel_size": 4})
    config_part, model_part = split_overrides({"make_vocab_size_divisible_by": 64, "num_layers": 4})
    assert config_part == {"num_layers": 4} and model_part == {"make_vocab_size_divisible_by": 64}


def test_padded_vocab():
    assert padded_vocab_size(101, 1) == 128
    assert padded_vocab_size(101, 2) == 256
    assert padded_vocab_size(151936, 8, 128) == 152576
    assert padded_vocab_size(256, 2, 1) == 256
