"""Benchmark: one teacher shared by K callers, FIFO versus the token-budget scheduler (prints JSON).

K concurrent callers (K = 1, 4, 16; threads of one client process, each a trainer's collector
thread) send ragged batches like rollouts — a prompt group of 2-8 rows whose lengths are drawn
from a long-tailed distribution (many short, few long, 8..1024 tokens) — to the real Megatron
group (CPU/gloo, fp32) behind podium's endpoint. Every mode serves the same requests, in the same
run, from the same group (one endpoint per mode in front of it):

- ``today``: one request per group call in arrival order, one row per micro-batch (today's
  endpoint with the default ``micro_batch_size: 1``);
- ``fifo``: one request per group call (``server.batch_requests: false``), its rows in token-budget
  micro-batches;
- ``batched``: the scheduler (``podium.teacher.endpoint.batching``): every caller's rows in shared calls.

Per mode and K: tokens/s served (real tokens / wall time), p50/p99 request latency, and the
padding share (padded share of the token positions computed, from the endpoint's ``/metrics``).
Goal: batched >= 1.5x today's tokens/s at K = 16 with a padding share <= 10%.

    python benchmarks/bench_shared.py [--quick] [--json PATH] [--callers 1,4,16] [--requests 6]

On CPU a forward's cost grows with its tokens nearly linearly, so batching gains less here than
on a GPU (where a small micro-batch leaves most of the device idle); the numbers say how much of
the per-call and per-micro-batch overhead the scheduler removes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_endpoint import bench_run, build_megatron_group, reexec_with_allocator, serve  # noqa: E402

MODES = {  # name -> (endpoint settings, request parameters)
    "today": ({"batch_requests": False}, {"micro_batch_size": 1}),
    "fifo": ({"batch_requests": False}, {}),
    "batched": ({"batch_requests": True}, {}),
}


def rollout_requests(seed: int, n: int, vocab: int, max_len: int) -> list[tuple[Any, Any]]:
    """``n`` prompt groups: 2-8 rows, lengths long-tailed (Pareto, 8..max_len), ids random."""
    import numpy as np

    rng = np.random.default_rng(abs(seed))
    out = []
    for _ in range(n):
        rows = int(rng.integers(2, 9))
        lengths = np.clip((8 * (1 + rng.pareto(1.1, rows))).astype(np.int64), 8, max_len)
        ids = rng.integers(1, vocab, (rows, int(lengths.max()))).astype(np.int64)
        out.append((ids, lengths))
    return out


def callers_main(args: argparse.Namespace) -> None:
    """The client process: K threads, each sending its own requests back to back; JSON result."""
    import podium

    client = podium.connect(args.rendezvous, ready_timeout_s=600)
    k, per = args.k, args.requests
    work = [rollout_requests(1000 * args.seed + c, per, args.vocab, args.max_len) for c in range(k)]
    params = json.loads(args.params)
    warm_ids, warm_lengths = rollout_requests(-1 - args.seed, 1, args.vocab, 16)[0]
    client.get_logprobs(args.alias, {"input_ids": warm_ids, "input_lengths": warm_lengths}, **params)  # connect
    latencies: list[float] = []
    errors: list[str] = []
    start = threading.Barrier(k + 1)

    def run(c: int) -> None:
        start.wait()
        for ids, lengths in work[c]:
            t0 = time.perf_counter()
            try:
                out = client.get_logprobs(args.alias, {"input_ids": ids, "input_lengths": lengths}, **params)
                assert tuple(out["logprobs"].shape) == ids.shape
            except Exception as exc:  # counted, reported
                errors.append(repr(exc))
            latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(k)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(int(lengths.sum()) for w in work for _, lengths in w)
    client.close()
    print(json.dumps({"wall_s": wall, "tokens": tokens, "latencies": latencies, "errors": errors}))


def scrape(url: str) -> dict[str, float]:
    import requests

    from podium.teacher.endpoint.metrics import totals

    return totals(requests.get(f"{url}/metrics", timeout=30).text)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rendezvous", help=argparse.SUPPRESS)
    parser.add_argument("--alias", help=argparse.SUPPRESS)
    parser.add_argument("--params", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model, K = 1 and 4, 2 requests each")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--callers", default="1,4,16")
    parser.add_argument("--requests", type=int, default=6, help="requests per caller")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.client:
        callers_main(args)
        return
    if args.quick:
        args.callers, args.requests, args.layers, args.hidden, args.vocab, args.max_len = "1,4", 2, 2, 64, 512, 128
    reexec_with_allocator()

    import torch
    from fixtures.checkpoints import make_tiny_checkpoint

    torch.set_num_threads(args.threads)
    names = {f"{mode:<12}"[:12].replace(" ", "0"): mode for mode in MODES}
    tmp, layout, token = bench_run("podium-bench-shared-", names)
    ckpt = make_tiny_checkpoint("llama", tmp / "ckpt", hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                                num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                                vocab_size=args.vocab, max_position_embeddings=max(4096, args.max_len))
    group, teardown = build_megatron_group(ckpt, tmp)
    servers = {}
    result: dict[str, Any] = {
        "model": {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab, "dtype": "fp32",
                  "max_tokens_per_microbatch": group.facts.max_tokens_per_microbatch},
        "workload": {"rows_per_request": "2-8", "lengths": f"8 * (1 + Pareto(1.1)), clipped to 8..{args.max_len}",
                     "requests_per_caller": args.requests},
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg()},
        "callers": [],
    }
    try:
        for i, (key, mode) in enumerate(names.items()):
            settings, _ = MODES[mode]
            servers[mode] = serve(group, layout, key, mode, token, 10 + i, **settings)
        for k in (int(x) for x in args.callers.split(",")):
            for mode in MODES:
                url = servers[mode].url
                before = scrape(url)
                cmd = [sys.executable, __file__, "--client", "--rendezvous", str(layout.rendezvous_path),
                       "--alias", mode, "--params", json.dumps(MODES[mode][1]), "--k", str(k),
                       "--requests", str(args.requests), "--seed", str(k), "--vocab", str(args.vocab),
                       "--max-len", str(args.max_len)]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
                if proc.returncode != 0:
                    raise RuntimeError(f"callers failed ({mode}, K={k}):\n{proc.stderr[-3000:]}")
                run = json.loads(proc.stdout.strip().splitlines()[-1])
                after = scrape(url)
                computed = after["podium_computed_tokens_total"] - before.get("podium_computed_tokens_total", 0.0)
                real = after["podium_call_tokens_sum"] - before.get("podium_call_tokens_sum", 0.0)
                calls = after["podium_group_calls_total"] - before.get("podium_group_calls_total", 0.0)
                lat = run["latencies"]
                row = {"mode": mode, "callers": k, "requests": len(lat), "errors": len(run["errors"]),
                       "tokens": run["tokens"], "wall_s": round(run["wall_s"], 3),
                       "tokens_per_s": round(run["tokens"] / run["wall_s"], 1),
                       "p50_ms": round(percentile(lat, 0.5) * 1e3, 1), "p99_ms": round(percentile(lat, 0.99) * 1e3, 1),
                       "padding_share": round(1 - real / computed, 4) if computed else None,
                       "group_calls": int(calls) - 1}  # less the client's warm-up call
                result["callers"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        by = {(r["mode"], r["callers"]): r for r in result["callers"]}
        top = max(int(x) for x in args.callers.split(","))
        result["speedup_at_max_callers"] = {
            "callers": top,
            "batched_over_today": round(by[("batched", top)]["tokens_per_s"] / by[("today", top)]["tokens_per_s"], 3),
            "batched_over_fifo": round(by[("batched", top)]["tokens_per_s"] / by[("fifo", top)]["tokens_per_s"], 3),
            "goal": 1.5, "padding_goal": 0.10,
        }
    finally:
        for server in servers.values():
            server.stop(grace_s=5)
        teardown()
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
