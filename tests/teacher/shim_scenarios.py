"""Megatron code paths that need each CPU shim (run as a script by test_cuda_shims.py).

``python shim_scenarios.py SCENARIO --skip NAME``: applies every CPU shim except ``NAME`` and runs
the scenario; exit status 0 when it worked, 3 when it failed (the error is printed). Run it with
CUDA hidden (``CUDA_VISIBLE_DEVICES=``, as the test does); TransformerEngine is hidden here.
``python shim_scenarios.py --each SCENARIO:NAME ...``: every case, each in a child forked from one
process that imported torch and megatron-core (``forked_cases.py``), their results as one JSON line.

Scenarios:
- ``forward``: one rank, a tiny GPTModel forward (needs ``current_device``);
- ``save``: one rank, ``dist_checkpointing.save`` of that model (needs ``synchronize``);
- ``tied_pp2``: two ranks, PP2 with tied embeddings, model construction (needs ``tied_embedding_cuda``);
- ``moe_ep2``: two ranks, a Qwen3-MoE-shaped model built as podium builds it (experts split EP2,
  the ``alltoall`` dispatcher), one forward (needs ``te_general_gemm``, ``moe_dtoh_stream``,
  ``moe_dtoh_sync``);
- ``mla``: one rank, a DeepSeek-V3-shaped model (multi-latent attention) built as podium builds it,
  one forward (needs ``mla_have_te``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback

from forked_cases import import_shared, run_each

SCENARIOS = ("forward", "save", "tied_pp2", "moe_ep2", "mla")


def _build(pp: int):
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
        pipeline_model_parallel_size=pp, use_cpu_initialization=True, hidden_dropout=0.0,
        attention_dropout=0.0, activation_func=F.silu, gated_linear_unit=True, normalization="RMSNorm",
        params_dtype=torch.float32, pipeline_dtype=torch.float32, bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
    )
    from podium.teacher.model.megatron_model import _sdpa_core_attention_cls

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")  # what podium runs: SDPA core attention
    spec.submodules.self_attention.submodules.core_attention = _sdpa_core_attention_cls()
    return GPTModel(
        config=config, transformer_layer_spec=spec,
        vocab_size=64, max_sequence_length=16, share_embeddings_and_output_weights=True,
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage(),
        position_embedding_type="rope",
    )


def _rank(rank: int, world: int, store: str, scenario: str, skip: str, out: str) -> None:
    import torch

    from podium.teacher.cpu.cuda_shims import apply_cuda_shims
    from podium.teacher.model.parallel import destroy_parallel, init_parallel

    apply_cuda_shims(skip=[skip] if skip else [])
    if scenario in ("moe_ep2", "mla"):
        _moe_forward(rank, world, store, MOE_CONFIG if scenario == "moe_ep2" else MLA_CONFIG)
        return
    init_parallel(rank, world, store, {"pipeline_model_parallel_size": world})
    try:
        model = _build(world)
        if scenario == "forward":
            ids = torch.randint(0, 64, (2, 8))
            with torch.no_grad():
                model(ids, torch.arange(8)[None].expand(2, 8), None)
        elif scenario == "save":
            from megatron.core import dist_checkpointing

            dist_checkpointing.save(model.sharded_state_dict(), out)
    finally:
        destroy_parallel()


MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
    "norm_topk_prob": True, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "hidden_act": "silu",
}


MLA_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "max_position_embeddings": 32,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "mscale": 1.0,
                     "mscale_all_dim": 1.0},
}


def _moe_forward(rank: int, world: int, store: str, hf_config: dict) -> None:
    import torch

    from podium.teacher.model.hf import describe_hf_config
    from podium.teacher.model.megatron_config import build_transformer_config
    from podium.teacher.model.megatron_model import build_gpt_model
    from podium.teacher.model.parallel import destroy_parallel, init_parallel

    parallel = {"expert_model_parallel_size": world}
    init_parallel(rank, world, store, parallel)
    try:
        desc = describe_hf_config(hf_config)
        config = build_transformer_config(desc, parallel, "fp32")
        assert config.moe_token_dispatcher_type == "alltoall", config.moe_token_dispatcher_type
        model = build_gpt_model(desc, config, 64)
        ids = torch.randint(0, 64, (2, 6 + rank))  # each rank its own rows: uneven token counts
        with torch.no_grad():
            model(ids, torch.arange(ids.shape[1])[None].expand_as(ids), None)
    finally:
        destroy_parallel()


def run_case(scenario: str, skip: str) -> int:
    """One case, its ranks forked from this process (which has imported torch and megatron-core)."""
    import torch.multiprocessing as mp

    world = 2 if scenario in ("tied_pp2", "moe_ep2") else 1
    tmp = tempfile.mkdtemp(prefix="shims-")
    out = os.path.join(tmp, "ckpt")
    os.makedirs(out)
    try:
        mp.start_processes(_rank, args=(world, f"file://{tmp}/store", scenario, skip, out),
                           nprocs=world, join=True, start_method="fork")
    except Exception:
        traceback.print_exc()
        return 3
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", nargs="?", choices=SCENARIOS)
    parser.add_argument("--skip", default="")
    parser.add_argument("--each", nargs="+", metavar="SCENARIO:SKIP", default=[])
    args = parser.parse_args()
    if args.each:
        run_each(lambda key: run_case(*key.split(":")), args.each)
        return 0
    if args.scenario is None:
        parser.error("name a SCENARIO, or cases with --each")
    import_shared()
    return run_case(args.scenario, args.skip)


if __name__ == "__main__":
    sys.exit(main())
