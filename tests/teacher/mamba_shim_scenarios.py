"""The hybrid-model code path that needs each Mamba CPU shim (run as a script by test_mamba_shims.py).

``python mamba_shim_scenarios.py --skip NAME``: applies every CPU shim (podium's CUDA shims and the
Mamba shims) except the Mamba shim ``NAME``, then builds a tiny Nemotron-H-shaped hybrid model
(``MEM*-E``: Mamba-2, latent MoE with a shared expert, attention, MLP) as podium builds it and runs
one forward on one rank; exit status 0 when it worked, 3 when it failed (the error is printed). Run
it with CUDA hidden (``CUDA_VISIBLE_DEVICES=``, as the test does); TransformerEngine is hidden here.
``python mamba_shim_scenarios.py --each SKIP ...`` (``""`` for none): every case, each in a child
forked from one process that imported torch and megatron-core (``forked_cases.py``), their results
as one JSON line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback

from forked_cases import import_shared, run_each

CONFIG = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 64, "hidden_size": 32,
    "hybrid_override_pattern": "MEM*-E", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "intermediate_size": 48, "mamba_num_heads": 4, "mamba_head_dim": 8, "n_groups": 2, "ssm_state_size": 8,
    "conv_kernel": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
    "moe_shared_expert_intermediate_size": 24, "moe_latent_size": 16, "routed_scaling_factor": 2.0,
    "layer_norm_epsilon": 1e-5, "max_position_embeddings": 32,
}


def run_case(skip: str) -> int:
    try:
        import torch

        from podium.teacher.cpu.cuda_shims import apply_cuda_shims
        from podium.teacher.cpu.mamba_shims import apply_mamba_shims
        from podium.teacher.model.hf import describe_hf_config
        from podium.teacher.model.megatron_config import build_transformer_config
        from podium.teacher.model.parallel import destroy_parallel, init_parallel

        apply_cuda_shims()
        apply_mamba_shims(skip=[skip] if skip else [])
        from podium.teacher.model.hybrid_model import build_hybrid_model

        init_parallel(0, 1, f"file://{tempfile.mkdtemp()}/store", {})
        try:
            desc = describe_hf_config(CONFIG)
            model = build_hybrid_model(desc, build_transformer_config(desc, {}, "fp32"), 128)
            for param in model.parameters():  # the weights are not initialised: any finite values
                param.data.normal_(0, 0.1)
            ids = torch.randint(0, 64, (2, 12))
            with torch.no_grad():
                out = model(ids, torch.arange(12)[None].expand(2, 12), None)
            assert torch.isfinite(out).all(), "non-finite logits"
        finally:
            destroy_parallel()
    except Exception:
        traceback.print_exc()
        return 3
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip", default="")
    parser.add_argument("--each", nargs="+", metavar="SKIP", default=[])
    args = parser.parse_args()
    if args.each:
        run_each(run_case, args.each)
        return 0
    import_shared()
    return run_case(args.skip)


if __name__ == "__main__":
    sys.exit(main())
