"""Benchmark: NeMo RL's ``get_topk_logits`` through podium (prints JSON).

Classic distillation asks the teacher for the top-k logits of every position (NeMo RL's
``distillation.topk_logits_k``, 64 in its recipes): the answer is ``B x S x k`` values and ids,
far larger than the request. What it measures:

- ``wire``: per shape (``--shapes``, default 8 x 512 and 64 x 2048, k = 64) and values/ids pair
  (FP32/INT64, FP32/INT32, BF16/INT32), through server + client (a client in another process,
  binary tensors, keep-alive) to a group that answers at once, no batching window (the transport alone): podium's
  MB/s (answer bytes / call time, the call's decode to float32/int64 included) next to the raw
  loopback's for the same bytes in the same run (two processes: one ``sendall`` of a buffer made
  once, ``recv_into`` one allocated once), alternating; ``ratio`` = raw time / podium time
  (goal >= 0.7); ``one_request_*``: the same with the client's pipelining off. Medians of
  ``--wire-reps`` x 2.
- ``request``: the request side: ``get_logprobs`` of large int64 ``input_ids`` (``--request-shape``,
  default 64 x 16384: 8 MB up, 4 MB of logprobs down) from a teacher without a batching window,
  against the raw loopback moving the same bytes; ``ratio`` as above.
- ``callers``: aggregate answer MB/s of 1, 4 and 16 callers at once (``--callers``; threads of
  up to 4 client processes) at the largest shape, FP32/INT32, and the endpoint's health-probe
  latency meanwhile.
- ``overlap``: a stand-in group that computes at a GPU's speed (``--gpu-tokens-per-s``, default
  1e5: a 1.7B teacher on one H100) called in this process versus through the endpoint, with the
  client's pipelining (row chunks in flight at once) on and off; ``ratio`` = in-process /
  endpoint time (goal >= 0.95).
- ``model``: the real Megatron group (2-node Ray test cluster on 127.0.0.2/.3, started and
  stopped by PID): ``get_topk_logits`` through the endpoint versus the same group called in the
  serving process, alternating, median of ``--reps``; ``ratio`` = in-process / endpoint time
  (goal >= 0.98). ``ratio_of_fastest`` compares the fastest of each (other work on a shared
  machine only adds time). Model: ``--layers/--hidden/--vocab`` (default 2 x 256, 8k vocab, so
  64 x 2048 runs on 2 cores).

The load average at the start and the end is in ``machine``. ``--quick``: a 1-layer model of
hidden 64, small shapes, k = 8, one repetition (seconds, for tests).

    python benchmarks/bench_topk.py [--shapes 8x512,64x2048] [--k 64] [--reps 3] [--request-shape 64x16384]
        [--skip-model] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import add_common_args, emit  # noqa: E402
from bench_endpoint import ClientProcess, bench_run, build_megatron_group, reexec_with_allocator, serve  # noqa: E402

from podium.protocol.query import Query, ask  # noqa: E402
from podium.teacher.seam import GroupFacts, Liveness  # noqa: E402

QUICK = {"layers": 1, "hidden": 64, "vocab": 512, "reps": 1, "wire_reps": 2, "k": 8, "shapes": "2x32,4x64",
         "callers": "1,2", "request_shape": "4x256"}
DATATYPES = (("FP32", "INT64"), ("FP32", "INT32"), ("BF16", "INT32"))
BYTES = {"FP32": 4, "BF16": 2, "INT64": 8, "INT32": 4}
CALLER_PROCESSES = 4  # concurrent callers run as threads of this many client processes (fewer when fewer callers)
CALLER_WARMUP = 3  # untimed calls each caller makes first


def _topk_call(client: Any, cmd: dict[str, Any], data: dict[str, Any]) -> Any:
    return client.get_topk_logits(cmd["alias"], data, cmd["k"], values_datatype=cmd["values"],
                                  indices_datatype=cmd["indices"])


def _raw_receive(cmd: dict[str, Any], fresh: bool = False) -> list[float]:
    """The loopback's own speed: ``nbytes`` from the benchmark's :class:`RawSender` into a buffer
    allocated (and touched) once, one ``recv_into`` loop per transfer; ``fresh``: into memory
    allocated for each transfer (its page faults paid, as a receiver handing each answer over in
    memory of its own pays them)."""
    import numpy as np

    n = cmd["nbytes"]
    view = memoryview(np.ones(n, dtype=np.uint8))
    times = []
    with socket.create_connection(("127.0.0.1", cmd["port"])) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(n.to_bytes(8, "little"))
        for i in range(cmd["warmup"] + cmd["reps"]):
            t0 = time.perf_counter()
            if fresh:
                view = memoryview(np.empty(n, dtype=np.uint8))
            sock.sendall(b"g")
            got = 0
            while got < n:
                k = sock.recv_into(view[got:], n - got)
                if not k:
                    raise RuntimeError("the raw sender closed the connection")
                got += k
            if i >= cmd["warmup"]:
                times.append(time.perf_counter() - t0)
    return times


def _callers(client: Any, cmd: dict[str, Any], data: dict[str, Any]) -> list[float]:
    """``threads`` callers at once, each ``reps`` calls; the wall time of all of them. Each caller
    first makes :data:`CALLER_WARMUP` calls of its own, untimed: a fresh thread's first answers
    pay for its connection and for growing its allocator's memory (350 ms, then 100, then ~40)."""
    import concurrent.futures

    threads = cmd["threads"]
    start = threading.Barrier(threads + 1)

    def one() -> None:
        try:
            for _ in range(CALLER_WARMUP):
                _topk_call(client, cmd, data)
        finally:
            start.wait()
        for _ in range(cmd["reps"]):
            _topk_call(client, cmd, data)

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(one) for _ in range(threads)]
        start.wait()
        t0 = time.perf_counter()
        for future in futures:
            future.result()
    return [time.perf_counter() - t0]


class _Probe:
    """``GET /v2/health/ready`` every 20 ms on a connection of its own, timed, until stopped."""

    def __init__(self, url: str, token: str) -> None:
        import http.client

        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.headers = {"Authorization": f"Bearer {token}"}
        self.times: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            t0 = time.perf_counter()
            self.conn.request("GET", "/v2/health/ready", headers=self.headers)
            self.conn.getresponse().read()
            self.times.append(time.perf_counter() - t0)

    def finish(self) -> list[float]:
        self.stop.set()
        self.thread.join()
        self.conn.close()
        return self.times


def client_main(rendezvous: str) -> None:
    """Run the commands read as JSON lines on stdin (``op``: ``topk`` timed calls, ``raw`` loopback
    transfers, ``callers`` concurrent calls); answers ``{"times": [...]}`` on stdout."""
    import numpy as np

    import podium

    default = podium.connect(rendezvous, ready_timeout_s=600)
    clients: dict[Any, Any] = {}
    rng = np.random.default_rng(0)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op", "topk")
        if op in ("raw", "probe", "probe_end"):
            if op == "probe":
                probe = _Probe(cmd["url"], cmd["token"])
                times = []
            else:
                times = _raw_receive(cmd) if op == "raw" else probe.finish()
            sys.stdout.write(json.dumps({"times": times}) + "\n")
            sys.stdout.flush()
            continue
        if "pipeline_mb" in cmd:  # a client of its own for this setting (kept for the next commands)
            key = cmd["pipeline_mb"]
            if key not in clients:
                clients[key] = podium.connect(rendezvous, ready_timeout_s=600, pipeline_mb=key)
            client = clients[key]
        else:
            client = default
        b, s = cmd["batch"]
        data = {"input_ids": rng.integers(0, cmd["vocab"], (b, s)).astype(np.int64),
                "input_lengths": np.full((b,), s, dtype=np.int64)}
        if op == "callers":
            times = _callers(client, cmd, data)
        elif op == "logprobs":  # the request side: large input_ids, a small answer
            times = []
            for i in range(cmd["warmup"] + cmd["reps"]):
                t0 = time.perf_counter()
                out = client.get_logprobs(cmd["alias"], data)
                if i >= cmd["warmup"]:
                    times.append(time.perf_counter() - t0)
            assert tuple(out["logprobs"].shape) == (b, s)
        else:
            times = []
            for i in range(cmd["warmup"] + cmd["reps"]):
                t0 = time.perf_counter()
                out = _topk_call(client, cmd, data)
                if i >= cmd["warmup"]:
                    times.append(time.perf_counter() - t0)
            assert tuple(out["topk_logits"].shape) == (b, s, cmd["k"])
            assert str(out["topk_indices"].dtype).endswith("int64")
        sys.stdout.write(json.dumps({"times": times}) + "\n")
        sys.stdout.flush()


class RawSender:
    """The other end of :func:`_raw_receive`, in the benchmark's process (where the endpoint
    serves): for each connection, ``nbytes`` (its first 8 bytes) sent with one ``sendall`` of a
    buffer made once, for each byte the client sends."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="raw-sender", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import numpy as np

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                head = b""
                while len(head) < 8:
                    head += conn.recv(8 - len(head))
                payload = memoryview(np.ones(int.from_bytes(head, "little"), dtype=np.uint8))
                while conn.recv(1):
                    conn.sendall(payload)

    def close(self) -> None:
        self.sock.close()


class InstantTopkGroup:
    """Answers the top-k outputs at once (zeros, cached per shape): isolates the transport. Its ids
    are in the dtype the real worker's head answers them in (:func:`podium.teacher.compute.head.index_dtype`)."""

    broken = None
    last_batch = None
    liveness = Liveness()
    max_tokens_per_microbatch: int | None = None

    def __init__(self, vocab_size: int) -> None:
        self.facts = GroupFacts(vocab_size=vocab_size, max_tokens_per_microbatch=self.max_tokens_per_microbatch)
        self._cache: dict[tuple, dict[str, Any]] = {}

    def compute(self, data: Any, query: Query) -> dict[str, Any]:
        import torch

        from podium.teacher.compute.head import index_dtype

        shape = (data.rows, data.width, int(query.top_k or 1))
        if shape not in self._cache:
            self._cache[shape] = {"topk_logits": torch.zeros(shape),
                                  "topk_logit_indices": torch.zeros(shape, dtype=index_dtype(self.facts.vocab_size)),
                                  "logprobs": torch.zeros(shape[:2])}
        return {name: value for name, value in self._cache[shape].items() if query.wants(name)}

    def shutdown(self) -> bool:
        return True


class GpuSpeedTopkGroup(InstantTopkGroup):
    """Computes at a GPU's speed: each call takes its tokens / ``tokens_per_s`` (the host is idle
    meanwhile, as it is while a GPU computes), then answers as :class:`InstantTopkGroup`. Its
    micro-batch budget makes the endpoint's batches ``BATCH_MICROBATCHES`` micro-batches each."""

    max_tokens_per_microbatch = 16384

    def __init__(self, vocab_size: int, tokens_per_s: float) -> None:
        super().__init__(vocab_size)
        self.tokens_per_s = tokens_per_s

    def compute(self, data: Any, query: Query) -> dict[str, Any]:
        time.sleep(data.rows * data.width / self.tokens_per_s)
        return super().compute(data, query)


def overlap_rows(client: Any, group: GpuSpeedTopkGroup, shapes: list[tuple[int, int]],
                 args: argparse.Namespace) -> dict[str, Any]:
    """The GPU-speed stand-in called in this process versus through the endpoint (FP32/INT32,
    podium's default wire), with the client's pipelining on (its default) and off; alternating,
    medians of ``--reps``; ``ratio`` = in-process / endpoint time."""
    rows: dict[str, Any] = {}
    for b, s in shapes:
        shape = type("Shape", (), {"rows": b, "width": s})()
        local: list[float] = []
        remote: dict[str, list[float]] = {"pipelined": [], "one_request": []}
        cmd = dict(alias="gpu", batch=[b, s], vocab=args.vocab, k=args.k, values="FP32", indices="INT32", warmup=0,
                   reps=1)
        client.run(**cmd)  # warm
        for _ in range(args.reps):
            t0 = time.perf_counter()
            group.compute(shape, ask(top_k=args.k, outputs=("topk_logits", "topk_logit_indices")))
            local.append(time.perf_counter() - t0)
            remote["pipelined"] += client.run(**cmd)
            remote["one_request"] += client.run(**cmd, pipeline_mb=None)
        in_process = statistics.median(local)
        rows[f"{b}x{s}"] = {"in_process_s": round(in_process, 4), **{
            how: {"endpoint_s": round(statistics.median(t), 4), "ratio": round(in_process / statistics.median(t), 4),
                  "ratio_of_fastest": round(min(local) / min(t), 4)} for how, t in remote.items()}}
    return {"tokens_per_s": args.gpu_tokens_per_s, "values/indices": "FP32/INT32", "goal_ratio": 0.95,
            "why": "a 1.7B teacher (Qwen3-1.7B) on one H100: ~3.6 GFLOP per token at 2k context, ~1e15 FLOP/s "
                   "bf16 peak at ~35% utilisation in prefill -> ~1e5 tokens/s", "rows": rows}


class WholeCallGroup(InstantTopkGroup):
    """:class:`InstantTopkGroup` whose token budget takes a large request in one call (the
    request-side row measures the wire, not the batcher's per-batch costs)."""

    max_tokens_per_microbatch = 1 << 22


def request_rows(client: Any, raw: RawSender, shape: tuple[int, int], args: argparse.Namespace) -> dict[str, Any]:
    """The request side: ``get_logprobs`` of large int64 ``input_ids`` (8 bytes a token up, 4 of
    logprobs down) from a teacher with no batching window, against the raw loopback moving the
    same bytes; alternating, medians."""
    b, s = shape
    up, down = b * s * 8 + b * 8, b * s * 4
    raw_t: list[float] = []
    podium_t: list[float] = []
    for _ in range(2):
        raw_t += client.run(op="raw", port=raw.port, nbytes=up + down, warmup=1, reps=args.wire_reps)
        podium_t += client.run(op="logprobs", alias="whole", batch=[b, s], vocab=args.vocab, warmup=2,
                               reps=args.wire_reps)
    raw_s, podium_s = statistics.median(raw_t), statistics.median(podium_t)
    return {"shape": f"{b}x{s}", "request": up, "response": down, "median_ms": round(podium_s * 1e3, 2),
            "raw_median_ms": round(raw_s * 1e3, 2), "MB_per_s": round((up + down) / podium_s / 1e6, 1),
            "raw_MB_per_s": round((up + down) / raw_s / 1e6, 1), "ratio": round(raw_s / podium_s, 3)}


def wire_bytes(b: int, s: int, k: int, values: str, indices: str) -> dict[str, int]:
    request = b * s * 8 + b * 8  # int64 ids and lengths
    response = b * s * k * (BYTES[values] + BYTES[indices])
    return {"request": request, "response": response}


def wire_rows(client: Any, raw: RawSender, shapes: list[tuple[int, int]], args: argparse.Namespace) -> dict[str, Any]:
    """Per shape and values/indices pair: the raw loopback's MB/s for the answer's bytes and
    podium's (answer bytes / call time), measured alternately in this run; their ratio."""
    rows = {}
    for b, s in shapes:
        for values, indices in DATATYPES:
            nbytes = wire_bytes(b, s, args.k, values, indices)
            raw_t: list[float] = []
            podium_t: list[float] = []
            single_t: list[float] = []
            cmd = dict(alias="instant", batch=[b, s], vocab=args.vocab, k=args.k, values=values, indices=indices,
                       warmup=2, reps=args.wire_reps)
            for _ in range(2):  # alternate, so drift hits both alike
                raw_t += client.run(op="raw", port=raw.port, nbytes=nbytes["response"], warmup=1,
                                    reps=args.wire_reps)
                podium_t += client.run(**cmd)
                single_t += client.run(**cmd, pipeline_mb=None)
            raw_s, podium_s, single_s = (statistics.median(t) for t in (raw_t, podium_t, single_t))
            rows[f"{b}x{s} {values}/{indices}"] = {
                **nbytes, "median_ms": round(podium_s * 1e3, 2), "raw_median_ms": round(raw_s * 1e3, 2),
                "raw_MB_per_s": round(nbytes["response"] / raw_s / 1e6, 1),
                "MB_per_s": round(nbytes["response"] / podium_s / 1e6, 1),
                "ratio": round(raw_s / podium_s, 3),
                "ratio_of_fastest": round(min(raw_t) / min(podium_t), 3),
                "one_request_MB_per_s": round(nbytes["response"] / single_s / 1e6, 1),  # pipelining off
                "one_request_ratio": round(raw_s / single_s, 3)}
    return rows


def _summary_ms(times: list[float]) -> dict[str, Any]:
    return {"count": len(times), "median": round(statistics.median(times) * 1e3, 2) if times else None,
            "max": round(max(times) * 1e3, 2) if times else None}


def callers_rows(rendezvous: Path, shape: tuple[int, int], args: argparse.Namespace, prober: Any,
                 url: str, token: str) -> dict[str, Any]:
    """Aggregate answer MB/s of 1, 4, 16 callers at once (threads of up to
    :data:`CALLER_PROCESSES` client processes), FP32/INT32 (podium's default wire); meanwhile
    ``prober`` (a client process) times the endpoint's health probe every 20 ms."""
    b, s = shape
    response = wire_bytes(b, s, args.k, "FP32", "INT32")["response"]
    rows = {}
    for callers in (int(c) for c in args.callers.split(",")):
        procs = min(callers, CALLER_PROCESSES)
        clients = [ClientProcess(rendezvous, __file__) for _ in range(procs)]
        try:
            reps = max(1, args.wire_reps // 2)
            for i, c in enumerate(clients):
                threads = callers // procs + (1 if i < callers % procs else 0)
                assert c.proc.stdin is not None
                c.proc.stdin.write(json.dumps(dict(op="callers", alias="instant", batch=[b, s], vocab=args.vocab,
                                                   k=args.k, values="FP32", indices="INT32", threads=threads,
                                                   reps=reps)) + "\n")
                c.proc.stdin.flush()
            prober.run(op="probe", url=url, token=token)
            walls = []
            for c in clients:
                assert c.proc.stdout is not None
                walls += json.loads(c.proc.stdout.readline())["times"]
            probes = prober.run(op="probe_end")
        finally:
            for c in clients:
                c.close()
        rows[str(callers)] = {"callers": callers, "client_processes": procs, "calls": callers * reps,
                              "wall_s": round(max(walls), 3),
                              "aggregate_MB_per_s": round(callers * reps * response / max(walls) / 1e6, 1),
                              "health_probe_ms": _summary_ms(probes)}
    return {"shape": f"{b}x{s}", "k": args.k, "values/indices": "FP32/INT32",
            "how": f"callers are threads of up to {CALLER_PROCESSES} client processes; each caller makes its calls "
                   "one after another; MB/s counts answer bytes", "rows": rows}


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
    parser.add_argument("--callers", default="1,4,16", help="concurrent callers of the aggregate rows")
    parser.add_argument("--request-shape", default="64x16384", help="the request-side row's batch (8 MB of ids)")
    parser.add_argument("--gpu-tokens-per-s", type=float, default=100_000.0,
                        help="the GPU-speed stand-in's forward speed (a 1.7B teacher on one H100)")
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
    tmp, layout, token = bench_run("podium-bench-topk-", {"instant00000": "instant", "model0000000": "model",
                                                           "gpuspeed0000": "gpu", "whole0000000": "whole"})
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
    result: dict[str, Any] = {"benchmark": "topk", "quick": args.quick, "k": args.k,
                              "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
                              "torch_threads": args.threads}
    servers: list[Any] = []
    teardown = None
    client = ClientProcess(layout.rendezvous_path, __file__)
    raw = RawSender()
    try:
        # no batching window: these rows measure the transport (the 5 ms window is the scheduler's policy)
        servers.append(serve(InstantTopkGroup(args.vocab), layout, "instant00000", "instant", token, 1,
                             max_queue_delay_ms=0))
        result["wire"] = wire_rows(client, raw, shapes, args)
        result["wire_goal_ratio"] = 0.7
        servers.append(serve(WholeCallGroup(args.vocab), layout, "whole0000000", "whole", token, 4,
                             max_queue_delay_ms=0))
        result["request"] = request_rows(client, raw, tuple(map(int, args.request_shape.split("x"))), args)
        result["callers"] = callers_rows(layout.rendezvous_path, shapes[-1], args, client, servers[0].url, token)
        gpu = GpuSpeedTopkGroup(args.vocab, args.gpu_tokens_per_s)
        servers.append(serve(gpu, layout, "gpuspeed0000", "gpu", token, 3))
        result["overlap"] = overlap_rows(client, gpu, shapes[-1:], args)

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
        raw.close()
        for server in servers:
            server.stop(grace_s=5)
        if teardown is not None:
            teardown()
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"]["load_average_at_end"] = os.getloadavg()
    emit(result, args.json)


if __name__ == "__main__":
    main()
