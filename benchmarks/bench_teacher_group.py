"""Benchmark: ``TeacherWorkerGroup.get_logprobs`` versus HF transformers in-process (prints JSON).

What it measures, in one run on one model (Llama-like, default 4 layers × 512 hidden, 8 heads /
4 KV groups, MLP 2048, vocab 32000, fp32, ~194 MB; batch 8 × 512 tokens):

- ``throughput``: tokens/s of ``get_logprobs`` through the group at TP1 (one Ray worker, ``--threads``
  torch threads) versus the HF forward + log-softmax + gather in this process (same threads, SDPA
  attention, ``inference_mode``), calls alternating, median of ``--reps``; ``ratio`` = group / HF
  (goal ≥ 1.05). ``group_worker_compute_s`` is the time inside the worker (the rest of ``group_s``
  is Ray: arguments, scheduling, results). ``ratio_of_fastest`` compares the best call of each side
  (on a machine shared with other work, interference only adds time). Both sides compute the same
  numbers (checked: ``max_abs_diff``).
- ``watch``: tokens/s of the same call with the group's watch of its calls (progress polls, the
  stuck verdict: :mod:`podium.teacher.compute.liveness`) on and off, alternating; ``ratio`` =
  watched / unwatched (goal >= 0.98);
- ``load``: group construction time (placement, actor start, imports, model build, checkpoint read)
  and the checkpoint read itself per worker, at TP1 and TP2;
- ``memory``: per worker, RSS after loading and peak RSS after a call, parameter bytes and checkpoint
  bytes read, at TP1 and TP2 (a TP2 worker holds about half the weights; each worker reads the
  checkpoint once, only its slices).

The allocator is fixed for both sides: glibc with ``MALLOC_MMAP_MAX_=0`` and
``MALLOC_TRIM_THRESHOLD_=68719476736`` (the script re-executes itself with them; the Ray nodes it
starts inherit them), so the ratio measures compute, not page faults. A 2-node Ray test cluster
(127.0.0.2/.3, ports from 20000–21999) is started and ended by PID, as the test fixture does.

``--quick``: 1 layer × 64 hidden, vocab 512, batch 2 × 32, one repetition (seconds, for tests).

    python benchmarks/bench_teacher_group.py [--layers 4 --hidden 512 --vocab 32000]
        [--batch 8 --seq 512] [--reps 5] [--threads 2] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import ALLOCATOR_ENV, add_common_args, emit, reexec_with_allocator  # noqa: E402

MB = 2**20
QUICK = {"layers": 1, "hidden": 64, "ffn": 128, "vocab": 512, "batch": 2, "seq": 32, "micro_batch": 2, "reps": 1}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--tp1-only", action="store_true", help="skip the TP2 group (load and memory at TP1 only)")
    add_common_args(p)
    args = p.parse_args()
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args()  # what was given explicitly still wins
    return args


def _hf_logprobs(model: Any, ids: Any, lengths: Any) -> Any:
    import torch

    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
        logsm = torch.log_softmax(logits.float(), dim=-1)
        out = torch.zeros(ids.shape, dtype=torch.float32)
        out[:, 1:] = logsm[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return out * (torch.arange(ids.shape[1])[None, :] < lengths[:, None])


def _memory_row(group: Any, label: str) -> list[dict[str, Any]]:
    rows = []
    for info, mem in zip(group.worker_info, group.memory(), strict=True):
        rows.append({
            "layout": label,
            "rank": info.rank,
            "parameters_mb": round(info.parameters_bytes / MB, 1),
            "checkpoint_read_mb": round(info.load_stats["bytes_read"] / MB, 1),
            "checkpoint_load_s": round(info.load_seconds, 3),
            "rss_mb": round(mem["rss_bytes"] / MB, 1),
            "peak_rss_mb": round(mem["peak_rss_bytes"] / MB, 1),
        })
    return rows


def _watch_cost(group: Any, batch: dict, tokens: int, reps: int) -> dict[str, Any]:
    """Tokens/s of the same call with the group's watch of its calls on and off, alternating (what
    the watch costs; ``ratio`` = watched / unwatched, goal >= 0.98)."""
    import dataclasses

    watched, times = group.options, {True: [], False: []}
    try:
        for _ in range(reps):
            for flag in (True, False):
                group.options = dataclasses.replace(watched, watch_calls=flag)
                t0 = time.perf_counter()
                group.get_logprobs(batch)
                times[flag].append(time.perf_counter() - t0)
    finally:
        group.options = watched
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"watched_tokens_per_s": round(tokens / on, 1), "unwatched_tokens_per_s": round(tokens / off, 1),
            "ratio": round(off / on, 3), "watched_s": [round(t, 3) for t in times[True]],
            "unwatched_s": [round(t, 3) for t in times[False]]}


def main() -> None:
    reexec_with_allocator()
    args = _args()
    import torch
    import transformers
    from fixtures.checkpoints import make_tiny_checkpoint, random_batch
    from fixtures.ray_cluster import start_test_cluster, stop_test_cluster

    from podium.config.spec import TeacherSpec
    from podium.teacher.compute.group import TeacherWorkerGroup

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="podium-bench-teacher-"))
    ckpt = make_tiny_checkpoint(
        "llama", work / "llama", vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(2048, args.seq),
    )
    ckpt_mb = sum(f.stat().st_size for f in ckpt.glob("*.safetensors")) / MB
    batch = random_batch(args.vocab, [args.seq] * args.batch, seed=0)
    tokens = args.batch * args.seq

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32, attn_implementation="sdpa")
    hf.eval()

    cluster, procs = start_test_cluster(num_cpus=8, log_dir=work)
    import ray

    ray.init(address=cluster.address, _node_ip_address=cluster.head_ip, log_to_driver=False)
    result: dict[str, Any] = {
        "benchmark": "teacher_group",
        "quick": args.quick,
        "allocator": "glibc malloc, " + " ".join(f"{k}={v}" for k, v in ALLOCATOR_ENV.items()),
        "model": {"arch": "llama", "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                  "kv_heads": args.kv_heads, "ffn": args.ffn, "vocab": args.vocab, "precision": "fp32",
                  "checkpoint_mb": round(ckpt_mb, 1)},
        "batch": {"batch": args.batch, "seq": args.seq, "tokens": tokens, "micro_batch": args.micro_batch},
        "threads": args.threads,
        "cpus": os.cpu_count(),
    }
    try:
        cfg = TeacherSpec(key="bench0000000", name="bench", aliases=("bench",), model_name=str(ckpt), num_nodes=1,
                          gpus_per_node=1, precision="fp32", micro_batch_size=args.micro_batch)
        started = time.perf_counter()
        tp1 = TeacherWorkerGroup(cfg, torch_threads=args.threads)
        load = {"tp1_group_setup_s": round(time.perf_counter() - started, 2)}
        mem_rows = _memory_row(tp1, "TP1 after load")
        group_times, hf_times, inside_times = [], [], []
        out = tp1.get_logprobs(batch)  # warm-up both sides
        ref = _hf_logprobs(hf, batch["input_ids"], batch["input_lengths"])
        for _ in range(args.reps):
            t0 = time.perf_counter()
            out = tp1.get_logprobs(batch)
            group_times.append(time.perf_counter() - t0)
            inside_times.append(ray.get(tp1._actors[0].stats.remote())["last_call_seconds"])
            t0 = time.perf_counter()
            ref = _hf_logprobs(hf, batch["input_ids"], batch["input_lengths"])
            hf_times.append(time.perf_counter() - t0)
        g_med, h_med = statistics.median(group_times), statistics.median(hf_times)
        result["throughput"] = {
            "group_tp1_tokens_per_s": round(tokens / g_med, 1),
            "hf_in_process_tokens_per_s": round(tokens / h_med, 1),
            "ratio": round(h_med / g_med, 3),
            "ratio_of_fastest": round(min(hf_times) / min(group_times), 3),
            "group_s": [round(t, 3) for t in group_times],
            "group_worker_compute_s": [round(t, 3) for t in inside_times],
            "hf_s": [round(t, 3) for t in hf_times],
            "max_abs_diff": float((out["logprobs"] - ref).abs().max()),
        }
        result["watch"] = _watch_cost(tp1, batch, tokens, max(args.reps, 30 if args.quick else 5))  # ms calls: more
        mem_rows += _memory_row(tp1, "TP1 after calls")
        tp1.shutdown()
        del hf
        result["load"] = load
        result["memory"] = mem_rows
        if args.tp1_only:
            return
        started = time.perf_counter()
        tp2 = TeacherWorkerGroup(cfg.model_copy(update={"gpus_per_node": 2, "tensor_model_parallel_size": 2}),
                                 torch_threads=max(1, args.threads // 2))
        load["tp2_group_setup_s"] = round(time.perf_counter() - started, 2)
        mem_rows += _memory_row(tp2, "TP2 after load")
        t0 = time.perf_counter()
        out2 = tp2.get_logprobs(batch)
        load["tp2_first_call_s"] = round(time.perf_counter() - t0, 3)
        mem_rows += _memory_row(tp2, "TP2 after call")
        result["tp2_max_abs_diff_vs_hf"] = float((out2["logprobs"] - ref).abs().max())
        tp2.shutdown()
    finally:
        ray.shutdown()
        stop_test_cluster(cluster, procs)
        shutil.rmtree(work, ignore_errors=True)
        emit(result, args.json)


if __name__ == "__main__":
    main()
