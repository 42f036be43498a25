"""Benchmark: NeMo RL's ``get_topk_logits`` through podium (prints JSON).

Classic distillation asks the teacher for the top-k logits of every position (NeMo RL's
``distillation.topk_logits_k``, 64 in its recipes): the answer is ``B x S x k`` values and ids,
far larger than the request. What it measures:

- ``wire``: bytes and time per call at ``--shapes`` (default 8 x 512 and 64 x 2048, k = 64), with
  values/ids as FP32/INT64 (NeMo RL's own dtypes) and as BF16/INT32, through server + client (a
  client in another process, binary tensors, keep-alive) to a group that answers at once: the
  transport alone. Median of ``--wire-reps``.
- ``model``: the real Megatron group (2-node Ray test cluster on 127.0.0.2/.3, started and
  stopped by PID): ``get_topk_logits`` through the endpoint versus the same group called in the
  serving process, alternating, median of ``--reps``; ``ratio`` = in-process / endpoint time
  (goal >= 0.98). ``ratio_of_fastest`` compares the fastest of each (other work on a shared
  machine only adds time). Model: ``--layers/--hidden/--vocab`` (default 2 x 256, 8k vocab, so
  64 x 2048 runs on 2 cores).

``--quick``: a 1-layer model of hidden 64, small shapes, k = 8, one repetition (seconds, for tests).

    python benchmarks/bench_topk.py [--shapes 8x512,64x2048] [--k 64] [--reps 3] [--skip-model] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import add_common_args, emit  # noqa: E402
from bench_endpoint import ClientProcess, bench_run, build_megatron_group, reexec_with_allocator, serve  # noqa: E402

QUICK = {"layers": 1, "hidden": 64, "vocab": 512, "reps": 1, "wire_reps": 2, "k": 8, "shapes": "2x32,4x64"}
DATATYPES = (("FP32", "INT64"), ("BF16", "INT32"))
BYTES = {"FP32": 4, "BF16": 2, "INT64": 8, "INT32": 4}


def client_main(rendezvous: str) -> None:
    """Time ``get_topk_logits`` for commands read as JSON lines on stdin; answers on stdout."""
    import numpy as np

    import podium

    client = podium.connect(rendezvous, ready_timeout_s=600)
    rng = np.random.default_rng(0)
    for line in sys.stdin:
        cmd = json.loads(line)
        b, s = cmd["batch"]
        data = {"input_ids": rng.integers(0, cmd["vocab"], (b, s)).astype(np.int64),
                "input_lengths": np.full((b,), s, dtype=np.int64)}
        times = []
        for i in range(cmd["warmup"] + cmd["reps"]):
            t0 = time.perf_counter()
            out = client.get_topk_logits(cmd["alias"], data, cmd["k"], values_datatype=cmd["values"],
                                         indices_datatype=cmd["indices"])
            if i >= cmd["warmup"]:
                times.append(time.perf_counter() - t0)
        assert tuple(out["topk_logits"].shape) == (b, s, cmd["k"])
        sys.stdout.write(json.dumps({"times": times}) + "\n")
        sys.stdout.flush()


class InstantTopkGroup:
    """Answers the top-k outputs at once (zeros, cached per shape): isolates the transport."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.max_sequence_length = None
        self.sequence_length_multiple = 1
        self._cache: dict[tuple, dict[str, Any]] = {}

    def get_logprobs(self, data: Any, micro_batch_size: int | None = None, top_k: int | None = None, *,
                     temperature: float | None = None, outputs: Any = None, **_: Any) -> dict[str, Any]:
        import torch

        shape = (data.rows, data.width, int(top_k or 1))
        if shape not in self._cache:
            self._cache[shape] = {"topk_logits": torch.zeros(shape),
                                  "topk_logit_indices": torch.zeros(shape, dtype=torch.long),
                                  "logprobs": torch.zeros(shape[:2])}
        return {name: value for name, value in self._cache[shape].items() if outputs is None or name in outputs}

    def shutdown(self) -> bool:
        return True


def wire_bytes(b: int, s: int, k: int, values: str, indices: str) -> dict[str, int]:
    request = b * s * 8 + b * 8  # int64 ids and lengths
    response = b * s * k * (BYTES[values] + BYTES[indices])
    return {"request": request, "response": response}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", default="8x512,64x2048")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--wire-reps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-model", action="store_true", help="the transport part only")
    add_common_args(parser)
    args = parser.parse_args()
    if args.client:
        client_main(args.client)
        return
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()  # what was given explicitly still wins
    reexec_with_allocator()

    import torch

    from podium.protocol.names import TOPK_LOGIT_INDICES, TOPK_LOGITS

    torch.set_num_threads(args.threads)
    tmp, layout, token = bench_run("podium-bench-topk-", {"instant00000": "instant", "model0000000": "model"})
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
    result: dict[str, Any] = {"benchmark": "topk", "quick": args.quick, "k": args.k,
                              "machine": {"cpus": os.cpu_count()}, "torch_threads": args.threads}
    servers: list[Any] = []
    teardown = None
    client = ClientProcess(layout.rendezvous_path, __file__)
    try:
        servers.append(serve(InstantTopkGroup(args.vocab), layout, "instant00000", "instant", token, 1))
        wire = {}
        for b, s in shapes:
            for values, indices in DATATYPES:
                t = client.run(alias="instant", batch=[b, s], vocab=args.vocab, k=args.k, values=values,
                               indices=indices, warmup=2, reps=args.wire_reps)
                nbytes = wire_bytes(b, s, args.k, values, indices)
                wire[f"{b}x{s} {values}/{indices}"] = {
                    **nbytes, "median_ms": round(statistics.median(t) * 1e3, 2),
                    "MB_per_s": round((nbytes["request"] + nbytes["response"]) / statistics.median(t) / 1e6, 1)}
        result["wire"] = wire

        if not args.skip_model:
            from fixtures.checkpoints import make_tiny_checkpoint

            ckpt = make_tiny_checkpoint("llama", tmp / "ckpt", hidden_size=args.hidden,
                                        intermediate_size=args.hidden * 3, num_hidden_layers=args.layers,
                                        num_attention_heads=8, num_key_value_heads=4, vocab_size=args.vocab,
                                        max_position_embeddings=4096)
            group, teardown = build_megatron_group(ckpt, tmp)
            servers.append(serve(group, layout, "model0000000", "model", token, 2))
            outputs = (TOPK_LOGITS, TOPK_LOGIT_INDICES)
            rows = {}
            for b, s in shapes:
                data = {"input_ids": torch.randint(0, args.vocab, (b, s)), "input_lengths": torch.full((b,), s)}
                group.get_logprobs(data, top_k=args.k, outputs=outputs)  # warm both paths up
                cmd = dict(alias="model", batch=[b, s], vocab=args.vocab, k=args.k, values="FP32", indices="INT64",
                           warmup=0, reps=1)
                client.run(**cmd)
                local: list[float] = []
                remote: list[float] = []
                for _ in range(args.reps):  # alternate, so drift hits both alike
                    t0 = time.perf_counter()
                    group.get_logprobs(data, top_k=args.k, outputs=outputs)
                    local.append(time.perf_counter() - t0)
                    remote += client.run(**cmd)
                rows[f"{b}x{s}"] = {
                    "in_process_s": round(statistics.median(local), 4),
                    "endpoint_s": round(statistics.median(remote), 4),
                    "ratio": round(statistics.median(local) / statistics.median(remote), 4),
                    "ratio_of_fastest": round(min(local) / min(remote), 4),
                    "in_process_all_s": [round(x, 3) for x in local],
                    "endpoint_all_s": [round(x, 3) for x in remote],
                }
            result["model"] = {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab, "dtype": "fp32",
                               "values/indices": "FP32/INT64", "rows": rows, "goal_ratio": 0.98}
    finally:
        client.close()
        for server in servers:
            server.stop(grace_s=5)
        if teardown is not None:
            teardown()
        shutil.rmtree(tmp, ignore_errors=True)
    emit(result, args.json)


if __name__ == "__main__":
    main()
