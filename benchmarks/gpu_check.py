"""The GPU path, checked in one command on a machine with one GPU (prints JSON).

For each model (nothing is downloaded: random weights from a fixed seed, written as HF safetensors):

- ``dense``: a Llama-like model of ~1B parameters (18 layers × 2048, GQA 16/8, 32k vocab);
- ``moe``: a small Qwen3-MoE (8 layers × 1024, 8 experts, top-2);
- ``nemotron``: a Nemotron-H at Nemotron 3 Nano's widths (hidden 2688, vocabulary 131072, Mamba-2 with
  64 heads × 64 in 8 groups and state 128, attention with 32 query heads and 2 KV groups × 128,
  experts of 1856 and a shared expert of 3712, top-6, scaling 2.5) with Super's latent MoE (latent
  1024), 10 layers ``MEM*EMEM*E`` (4 Mamba, 4 latent MoE, 2 attention) and 64 experts (Nano has 128:
  halved to keep the checkpoint ~8 GB); on CUDA it needs the Mamba kernels (``mamba-ssm``,
  ``causal-conv1d``): without them its entry says so (``error``) and the script exits 1;

it builds podium's teacher group with NCCL at TP1 on the GPU (TransformerEngine's layer spec when
TE is installed, the local spec otherwise; the hybrid model: ``hybrid_model.hybrid_spec_here``;
bf16), and reports:

- ``max_abs_err``: logprobs against HF transformers on the same GPU and dtype;
- ``podium_tok_per_s`` / ``hf_tok_per_s`` / ``ratio``: ``get_logprobs`` against HF's forward +
  log-softmax in-process, ``--batch`` rows × ``--seq`` tokens, median of ``--reps``;
- ``mfu``: model FLOPs (forward: 2 × active parameters per token + causal attention) per second
  over the GPU's dense bf16 peak (by device name; null when unknown).

``--dry-run`` (what CI runs, no GPU needed): the argument checks, both model configs as podium
plans and builds them (``TransformerConfig``), the HF models constructed on the meta device
(parameter counts, FLOPs per token) and the report, with no measurement.

``--quick``: batch 1 × 128 tokens, one repetition; ``--json PATH`` also writes the report there.

    bash benchmarks/gpu_check.sh [--models dense,moe,nemotron] [--batch 8] [--seq 1024] [--reps 5] [--dry-run] \
        [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import add_common_args, emit  # noqa: E402

QUICK = {"batch": 1, "seq": 128, "reps": 1}

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "dense": ("llama", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=18,
                            num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=4096)),
    "moe": ("qwen3_moe", dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, moe_intermediate_size=704,
                              num_experts=8, num_experts_per_tok=2, mlp_only_layers=[], num_hidden_layers=8,
                              num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                              max_position_embeddings=4096)),
    "nemotron": ("nemotron_h", dict(vocab_size=131072, hidden_size=2688, hybrid_override_pattern="MEM*EMEM*E",
                                    num_attention_heads=32, num_key_value_heads=2, head_dim=128,
                                    mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128,
                                    conv_kernel=4, chunk_size=128, n_routed_experts=64, num_experts_per_tok=6,
                                    moe_intermediate_size=1856, moe_shared_expert_intermediate_size=3712,
                                    moe_latent_size=1024, routed_scaling_factor=2.5, intermediate_size=1856,
                                    max_position_embeddings=4096)),
}
# Dense bf16 peak (FLOP/s) by a substring of torch.cuda.get_device_name().
PEAK_BF16: dict[str, float] = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12,
                               "A10": 125e12, "B200": 2250e12}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true", help="no GPU: configs, meta-device models, the report")
    add_common_args(parser)
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)  # what was given explicitly still wins
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        parser.error(f"--models: unknown {unknown or 'none given'}; choose from {', '.join(MODELS)}")
    for name in ("batch", "seq", "reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    return args


def hf_model_class_and_config(name: str) -> tuple[Any, Any]:
    import transformers

    from podium.apps.tiny_configs import BASE_CONFIGS

    kind, overrides = MODELS[name]
    config_cls, model_cls, base = BASE_CONFIGS[kind]
    config = getattr(transformers, config_cls)(**{**base, **overrides})
    config.architectures = [model_cls]
    return getattr(transformers, model_cls), config


def describe(name: str, seq: int) -> dict[str, Any]:
    """Parameters and forward FLOPs per token of a model, from its HF model on the meta device, and
    podium's TransformerConfig for it (bf16, TP1): what the dry run checks."""
    import torch

    from podium.teacher.model.hf import describe_hf_config
    from podium.teacher.model.megatron_config import build_transformer_config

    model_cls, config = hf_model_class_and_config(name)
    desc = describe_hf_config(config.to_dict(), name)
    megatron = build_transformer_config(desc, {}, "bf16", use_cpu_initialization=True)
    with torch.device("meta"):
        model = model_cls(config)
    params = sum(p.numel() for p in model.parameters())
    embedding = desc.vocab_size * desc.hidden_size
    if desc.is_moe:  # the experts a token does not visit do no work for it
        matrices = 3 if desc.activation == "swiglu" else 2  # gated (gate, up, down) or not (up, down)
        per_expert = matrices * (desc.moe_latent_size or desc.hidden_size) * desc.moe_ffn_hidden_size
        idle = sum(desc.moe_layers) * (desc.num_experts - desc.moe_topk) * per_expert
    else:
        idle = 0
    active = params - embedding - idle  # the input embedding is a lookup; the output layer is a matmul
    pattern = desc.hybrid_pattern
    attention_layers = pattern.count("*") if pattern else desc.num_layers
    attention = 2 * attention_layers * seq * desc.num_attention_heads * desc.head_dim  # causal: half of 4·L·s·d
    # the SSD scan of each Mamba layer: its state update and read-out, 2 × 2·d_inner·state per token
    scan = 4 * pattern.count("M") * desc.mamba_num_heads * desc.mamba_head_dim * desc.mamba_state_dim
    info = {"architecture": desc.architecture, "parameters": params, "active_parameters": active,
            "flops_per_token": 2 * active + attention + scan, "layers": desc.num_layers, "hidden": desc.hidden_size,
            "experts": desc.num_experts, "dispatcher": getattr(megatron, "moe_token_dispatcher_type", None)
            if desc.is_moe else None}
    if pattern:
        info.update(pattern=pattern, layer_kinds={k: pattern.count(k) for k in "M*E-" if k in pattern},
                    moe_latent_size=desc.moe_latent_size, mamba_heads=desc.mamba_num_heads,
                    mamba_groups=desc.mamba_num_groups)
    return info


def measure(name: str, args: argparse.Namespace, work: Path, info: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from podium.apps.tiny_models import make_tiny_checkpoint, random_batch
    from podium.config.spec import TeacherSpec
    from podium.teacher.compute.group import TeacherWorkerGroup
    from podium.teacher.model.hybrid_model import hybrid_spec_here
    from podium.teacher.model.megatron_config import te_available

    kind, overrides = MODELS[name]
    layer_spec = hybrid_spec_here() if "pattern" in info else "transformer_engine" if te_available() else "local"
    ckpt = make_tiny_checkpoint(kind, work / name, **overrides)
    batch = random_batch(int(overrides["vocab_size"]), [args.seq] * args.batch, seed=3)
    key = hashlib.sha256(name.encode()).hexdigest()[:12]
    spec = TeacherSpec(key=key, name=name, aliases=(name,), model_name=str(ckpt), num_nodes=1, gpus_per_node=1,
                       precision="bf16", micro_batch_size=args.batch)
    group = TeacherWorkerGroup(spec)
    try:
        out = group.get_logprobs(batch)["logprobs"]
        timings = []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            group.get_logprobs(batch)
            timings.append(time.perf_counter() - t0)
        device = group.worker_info[0].device
    finally:
        group.shutdown()
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    ids = batch["input_ids"].cuda()

    def hf_logprobs() -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()
            lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return torch.nn.functional.pad(lp, (1, 0))

    expected = hf_logprobs().cpu()
    hf_times = []
    for _ in range(args.reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hf_logprobs()
        torch.cuda.synchronize()
        hf_times.append(time.perf_counter() - t0)
    tokens = args.batch * args.seq
    ours, theirs = tokens / statistics.median(timings), tokens / statistics.median(hf_times)
    peak = next((v for k, v in PEAK_BF16.items() if k in torch.cuda.get_device_name()), None)
    return {"max_abs_err": float((out - expected).abs().max()), "podium_tok_per_s": round(ours, 1),
            "hf_tok_per_s": round(theirs, 1), "ratio": round(ours / theirs, 4),
            "mfu": round(ours * info["flops_per_token"] / peak, 4) if peak else None,
            "worker_device": device, "layer_spec": layer_spec,
            "podium_all_s": [round(t, 4) for t in timings]}


def use_own_ray_token(work: Path) -> None:
    """This run's own Ray token (a 0600 file in ``work``), named to the local cluster ``ray.init``
    starts and to this driver, as podium's launcher does (``ray_bootstrap.write_auth_token``,
    ``auth_env``). Left to Ray 2.60, ``ray.init()`` turns token auth on with ``~/.ray/auth_token`` and
    writes one there if there is none: that file then changes how every later ``ray start`` of this
    account behaves (a head turns auth on by itself; clients given an address do not). Call it
    before ``import ray``; ``RAY_AUTH_TOKEN`` (which wins over the file) is dropped."""
    from podium.launcher.job.ray_bootstrap import auth_env, write_auth_token

    if "ray" in sys.modules:
        raise RuntimeError("use_own_ray_token must run before Ray is imported (it reads RAY_AUTH_* then)")
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(auth_env(write_auth_token(work / "ray_auth_token")))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report: dict[str, Any] = {"benchmark": "gpu_check", "quick": args.quick, "dry_run": args.dry_run,
                              "batch": args.batch, "seq": args.seq, "models": {}}
    for name in args.models:
        report["models"][name] = describe(name, args.seq)
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device here; --dry-run checks the rest", file=sys.stderr)
            return 2
        report["gpu"] = torch.cuda.get_device_name()
        report["torch"] = torch.__version__
        from podium.teacher.model.hybrid_model import MambaKernelsMissing

        work = Path(tempfile.mkdtemp(prefix="podium-gpu-check-"))
        use_own_ray_token(work)
        import ray  # after use_own_ray_token: Ray reads RAY_AUTH_* when it is imported

        ray.init(num_gpus=1, include_dashboard=False, log_to_driver=False)
        try:
            for name in args.models:
                try:
                    report["models"][name].update(measure(name, args, work, report["models"][name]))
                except MambaKernelsMissing as exc:  # the other models still measure; the run fails
                    report["models"][name]["error"] = str(exc)
        finally:
            ray.shutdown()
    emit(report, args.json)
    return 1 if any("error" in m for m in report["models"].values()) else 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.exit(main())
