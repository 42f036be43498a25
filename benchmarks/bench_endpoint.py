"""Benchmark: a teacher through podium's endpoint + client versus the same group in-process (prints JSON).

What it measures, in one run on one model:

- ``throughput``: ``get_logprobs`` tokens/s through server + client (client in another process,
  binary tensors, keep-alive) versus calling the same group in the serving process, at 8 x 512 and
  64 x 512 tokens, and their ratio (goal >= 0.99). Endpoint and in-process calls alternate, median
  of ``--reps``.
- ``request_overhead``: round trip of a 1 x 16 request to a group that answers instantly (goal
  <= 1.5 ms on loopback), median of 300.
- ``bulk``: 64 x 4096 through the same instant group: (request + response bytes) / time (goal >=
  500 MB/s end to end), median of 20.
- ``two_teachers``: two teachers called at once by ``get_logprobs_by_agent`` versus the slower one
  alone (goal: <= 1.1x). The two teachers take a fixed time per call without using this machine's
  CPUs (each stands for its own allocation); on a shared 2-core box two CPU-bound models would
  measure core contention, not the client.

The model is the real Megatron group (``--group megatron``: a 2-node Ray test cluster on
127.0.0.2/.3 is started and stopped by PID) or a HF ``transformers`` model in-process
(``--group hf``). The allocator is fixed (``MALLOC_MMAP_MAX_=0``,
``MALLOC_TRIM_THRESHOLD_=68719476736``; the script re-executes itself with them) so timings measure
compute, not page faults. Model size: ``--layers/--hidden/--vocab`` (default 4 x 512, 32k vocab).
On a machine shared with other work, compare ``ratio_of_fastest`` (interference only adds time).
``--quick``: a 1-layer model of hidden 64, small shapes, a few repetitions (seconds, for tests).

    python benchmarks/bench_endpoint.py [--group megatron|hf] [--reps 3] [--shapes 8x512,64x512] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import ALLOCATOR_ENV, add_common_args, emit  # noqa: E402
from bench_common import reexec_with_allocator as _reexec  # noqa: E402

from podium.teacher.seam import GroupFacts, Liveness  # noqa: E402

PORTS = (23000, 23999)
QUICK = {"layers": 1, "hidden": 64, "vocab": 512, "reps": 1, "shapes": "2x32,4x32"}


# ----------------------------------------------------------------------------------------------
# client side (a subprocess: the trainer)
# ----------------------------------------------------------------------------------------------


def client_main(rendezvous: str) -> None:
    """Serve timing commands (JSON lines on stdin) with podium's client; answers on stdout."""
    import numpy as np

    import podium

    client = podium.connect(rendezvous, ready_timeout_s=600)
    rng = np.random.default_rng(0)

    def make(b: int, s: int, vocab: int) -> dict[str, Any]:
        return {"input_ids": rng.integers(0, vocab, (b, s)).astype(np.int64),
                "input_lengths": np.full((b,), s, dtype=np.int64)}

    for line in sys.stdin:
        cmd = json.loads(line)
        b, s = cmd["batch"]
        data = make(b, s, cmd["vocab"])
        times: list[float] = []
        if cmd["op"] == "time":
            for i in range(cmd["warmup"] + cmd["reps"]):
                t0 = time.perf_counter()
                out = client.get_logprobs(cmd["alias"], data)
                dt = time.perf_counter() - t0
                if i >= cmd["warmup"]:
                    times.append(dt)
            assert tuple(out["logprobs"].shape) == (b, s)
        elif cmd["op"] == "pair":
            agents = [cmd["aliases"][i % 2] for i in range(b)]
            for i in range(cmd["warmup"] + cmd["reps"]):
                t0 = time.perf_counter()
                client.get_logprobs_by_agent(data, agents)
                dt = time.perf_counter() - t0
                if i >= cmd["warmup"]:
                    times.append(dt)
        sys.stdout.write(json.dumps({"times": times}) + "\n")
        sys.stdout.flush()


class ClientProcess:
    """A benchmark's client in its own process (``script --client RENDEZVOUS``, which runs its
    ``client_main``): one JSON command per line in, one ``{"times": [...]}`` per line out."""

    def __init__(self, rendezvous: Path, script: str = __file__) -> None:
        self.proc = subprocess.Popen([sys.executable, script, "--client", str(rendezvous)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, **cmd: Any) -> list[float]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"client process exited with {self.proc.wait()}")
        return json.loads(line)["times"]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ----------------------------------------------------------------------------------------------
# groups
# ----------------------------------------------------------------------------------------------


def _arrays(data: Any) -> tuple[Any, Any, int]:
    """(ids, lengths, width) as torch tensors: the server hands a validated ``Batch``, the
    in-process timing a mapping of tensors."""
    import torch

    from podium.protocol.batch import Batch

    if isinstance(data, Batch):
        return torch.from_numpy(data.input_ids), torch.from_numpy(data.input_lengths), data.width
    return data["input_ids"].long(), data["input_lengths"].long(), int(data["input_ids"].shape[1])


class InstantGroup:
    """Answers at once (zeros): isolates the transport."""

    broken = None
    last_batch = None
    liveness = Liveness()

    def __init__(self, vocab_size: int, delay_s: float = 0.0) -> None:
        self.facts = GroupFacts(vocab_size=vocab_size)
        self.delay_s = delay_s
        self._zeros: dict[tuple[int, ...], Any] = {}

    def compute(self, data: Any, query: Any) -> dict:
        import torch

        if self.delay_s:
            time.sleep(self.delay_s)
        ids, _, width = _arrays(data)
        shape = (int(ids.shape[0]), width)
        if shape not in self._zeros:  # made once per shape: the answer costs nothing
            self._zeros[shape] = torch.zeros(shape, dtype=torch.float32)
        return {"logprobs": self._zeros[shape]}

    def shutdown(self) -> bool:
        return True


class HFInProcessGroup:
    """A HF model (SDPA) behind the group interface, NeMo RL logprob convention."""

    def __init__(self, path: Path, threads: int) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.set_num_threads(threads)
        cfg = AutoConfig.from_pretrained(path)
        self.facts = GroupFacts(vocab_size=cfg.vocab_size, max_sequence_length=cfg.max_position_embeddings,
                                checkpoint_path=str(path))
        self.broken = None
        self.last_batch = None
        self.liveness = Liveness()
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()

    def get_logprobs(self, data: Any, micro_batch_size: int | None = None, top_k: int | None = None, **kw: Any) -> dict:
        import torch

        ids, lengths, width = _arrays(data)
        out = torch.zeros((ids.shape[0], width), dtype=torch.float32)
        mb = micro_batch_size or 1
        with torch.no_grad():
            for start in range(0, ids.shape[0], mb):
                chunk = ids[start:start + mb]
                logits = self.model(input_ids=chunk).logits
                logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, chunk[:, 1:, None]).squeeze(-1)
                out[start:start + mb, 1:ids.shape[1]] = logp
        out *= torch.arange(width)[None, :] < lengths[:, None]
        return {"logprobs": out}

    def compute(self, data: Any, query: Any) -> dict:
        return self.get_logprobs(data, query.micro_batch_size)

    def shutdown(self) -> bool:
        return True


def build_megatron_group(ckpt: Path, log_dir: Path) -> tuple[Any, Any]:
    """A 2-node Ray test cluster (ports by bind test, stopped by PID) and the real group on it."""
    import ray
    from fixtures.ray_cluster import start_test_cluster, stop_test_cluster  # the test suite's cluster

    from podium.config.spec import TeacherSpec
    from podium.teacher.compute.group import TeacherWorkerGroup

    cluster, procs = start_test_cluster(int(os.environ.get("PODIUM_BENCH_RAY_CPUS", "2")), log_dir)
    ray.init(address=cluster.address, _node_ip_address=cluster.head_ip, log_to_driver=False)
    spec = TeacherSpec(key="bench0000000", name="bench", aliases=("bench",), model_name=str(ckpt), num_nodes=1,
                       gpus_per_node=1, precision="fp32", micro_batch_size=1)
    group = TeacherWorkerGroup(spec)

    def teardown() -> None:
        try:
            group.shutdown()
            ray.shutdown()
        finally:
            stop_test_cluster(cluster, procs)

    return group, teardown


# ----------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def serve(group: Any, layout: Any, key: str, name: str, token: str, generation: int, **settings: Any) -> Any:
    """``group`` behind an endpoint (``settings``: more ``podium.server`` settings), published ready."""
    from podium.config.launcher import ServerSettings
    from podium.rendezvous import Generation, RecordWriter, Status
    from podium.teacher.endpoint import EndpointConfig, ServerThread

    writer = RecordWriter(layout.endpoint_path(name, key), teacher_key=key, teacher_name=name, aliases=(name,),
                          generation=Generation(generation, 0))
    server = ServerThread(group, EndpointConfig(served_name=name, token=token,
                                                server=ServerSettings(port_range=PORTS, **settings), teacher_key=key,
                                                aliases=(name,), generation=Generation(generation, 0)))
    url = server.start()
    server.set_ready(True)
    writer.publish(Status.READY, url=url, model=server.server.model_info())
    return server


def reexec_with_allocator() -> None:
    """Run this script again under the fixed allocator (and Ray/gloo settings) unless it already is."""
    _reexec({"RAY_USAGE_STATS_ENABLED": "0", "GLOO_SOCKET_IFNAME": "lo"})


def bench_run(prefix: str, teachers: dict[str, str]) -> tuple[Path, Any, str]:
    """A temporary run: ``(dir, RunLayout, token)`` with a rendezvous of ``teachers`` (key -> name)."""
    from podium.rendezvous import RunLayout, build_rendezvous, create_token, write_rendezvous

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    layout = RunLayout(tmp / "run")
    entries = [{"key": key, "name": name, "aliases": [name]} for key, name in teachers.items()]
    write_rendezvous(layout, build_rendezvous("bench", entries, layout=layout))
    return tmp, layout, create_token(layout.auth_token_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--group", choices=("megatron", "hf"), default="megatron")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--shapes", default="8x512,64x512")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-model", action="store_true", help="transport parts only")
    add_common_args(parser)
    args = parser.parse_args()
    if args.client:
        client_main(args.client)
        return
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()  # what was given explicitly still wins
    reexec_with_allocator()
    # repetitions of the transport parts: (warmup, reps)
    quick_reps, full_reps = ((5, 20), (1, 5), (1, 3), (1, 2)), ((30, 300), (5, 50), (3, 20), (1, 5))
    n_tiny, n_transport, n_bulk, n_pair = quick_reps if args.quick else full_reps
    delays = (0.02, 0.03) if args.quick else (0.25, 0.35)
    shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes.split(",")]
    bulk_b, bulk_s = (4, 256) if args.quick else (64, 4096)

    import torch

    torch.set_num_threads(args.threads)
    tmp, layout, token = bench_run("podium-bench-", {"model0000000": "model", "instant00000": "instant",
                                                      "slowa0000000": "slow_a", "slowb0000000": "slow_b"})
    result: dict[str, Any] = {
        "benchmark": "endpoint",
        "quick": args.quick,
        "group": args.group,
        "model": {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab, "dtype": "fp32"},
        "allocator": dict(ALLOCATOR_ENV),
        "torch_threads": args.threads,
        "machine": {"cpus": os.cpu_count()},
    }
    servers: list[Any] = []
    teardown = None
    client = ClientProcess(layout.rendezvous_path)
    try:
        # transport only: instant group
        servers.append(serve(InstantGroup(args.vocab), layout, "instant00000", "instant", token, 1))
        tiny = client.run(op="time", alias="instant", batch=[1, 16], vocab=args.vocab, warmup=n_tiny[0], reps=n_tiny[1])
        result["request_overhead"] = {"batch": [1, 16], "median_ms": round(median(tiny) * 1e3, 3),
                                      "p90_ms": round(sorted(tiny)[int(0.9 * len(tiny))] * 1e3, 3), "goal_ms": 1.5}
        transport = {}
        for b, s in shapes:
            t = client.run(op="time", alias="instant", batch=[b, s], vocab=args.vocab, warmup=n_transport[0],
                           reps=n_transport[1])
            transport[f"{b}x{s}"] = round(median(t) * 1e3, 3)
        result["transport_ms"] = transport
        bulk = client.run(op="time", alias="instant", batch=[bulk_b, bulk_s], vocab=args.vocab, warmup=n_bulk[0],
                          reps=n_bulk[1])
        nbytes = bulk_b * bulk_s * 8 + bulk_b * 8 + bulk_b * bulk_s * 4
        result["bulk"] = {"batch": [bulk_b, bulk_s], "bytes": nbytes, "median_ms": round(median(bulk) * 1e3, 3),
                          "MB_per_s": round(nbytes / median(bulk) / 1e6, 1), "goal_MB_per_s": 500}

        # two teachers at once (each a fixed-time call, 0.25 s / 0.35 s, that uses no CPU here)
        servers.append(serve(InstantGroup(args.vocab, delays[0]), layout, "slowa0000000", "slow_a", token, 2))
        servers.append(serve(InstantGroup(args.vocab, delays[1]), layout, "slowb0000000", "slow_b", token, 3))
        pair_reps = {"warmup": n_pair[0], "reps": n_pair[1]}
        alone_a = client.run(op="time", alias="slow_a", batch=[32, 512], vocab=args.vocab, **pair_reps)
        alone_b = client.run(op="time", alias="slow_b", batch=[32, 512], vocab=args.vocab, **pair_reps)
        pair = client.run(op="pair", aliases=["slow_a", "slow_b"], batch=[64, 512], vocab=args.vocab, warmup=n_pair[0],
                          reps=n_pair[1])
        slower = max(median(alone_a), median(alone_b))
        result["two_teachers"] = {"alone_ms": [round(median(alone_a) * 1e3, 1), round(median(alone_b) * 1e3, 1)],
                                  "pair_ms": round(median(pair) * 1e3, 1),
                                  "pair_over_slower": round(median(pair) / slower, 3), "goal": 1.1,
                                  "batch": "64x512 split 32/32 by agent name"}

        if not args.skip_model:
            from fixtures.checkpoints import make_tiny_checkpoint

            ckpt = make_tiny_checkpoint("llama", tmp / "ckpt", hidden_size=args.hidden,
                                        intermediate_size=args.hidden * 3, num_hidden_layers=args.layers,
                                        num_attention_heads=8, num_key_value_heads=4, vocab_size=args.vocab,
                                        max_position_embeddings=4096)
            t0 = time.perf_counter()
            if args.group == "megatron":
                group, teardown = build_megatron_group(ckpt, tmp)
            else:
                group = HFInProcessGroup(ckpt, args.threads)
            result["group_build_s"] = round(time.perf_counter() - t0, 1)
            servers.append(serve(group, layout, "model0000000", "model", token, 4))
            rows = {}
            for b, s in shapes:
                shape = f"{b}x{s}"
                data = {"input_ids": torch.randint(0, args.vocab, (b, s)), "input_lengths": torch.full((b,), s)}
                group.get_logprobs(data)  # warm up both paths
                client.run(op="time", alias="model", batch=[b, s], vocab=args.vocab, warmup=0, reps=1)
                local: list[float] = []
                remote: list[float] = []
                for _ in range(args.reps):  # alternate, so drift hits both alike
                    t0 = time.perf_counter()
                    group.get_logprobs(data)
                    local.append(time.perf_counter() - t0)
                    remote += client.run(op="time", alias="model", batch=[b, s], vocab=args.vocab, warmup=0, reps=1)
                tokens = b * s
                rows[shape] = {
                    "in_process_s": round(median(local), 4),
                    "endpoint_s": round(median(remote), 4),
                    "in_process_tok_per_s": round(tokens / median(local), 1),
                    "endpoint_tok_per_s": round(tokens / median(remote), 1),
                    "ratio": round(median(local) / median(remote), 4),
                    # contention from other processes only adds time: the fastest of each path is the
                    # least disturbed estimate on a shared machine
                    "ratio_of_fastest": round(min(local) / min(remote), 4),
                    # what the endpoint adds is the transport measured above with the instant group
                    # at this shape; against the fastest compute that bounds the ratio from below
                    "ratio_bound_from_transport": (round(min(local) / (min(local) + transport[shape] / 1e3), 5)
                                                   if shape in transport else None),
                    "in_process_all_s": [round(x, 3) for x in local],
                    "endpoint_all_s": [round(x, 3) for x in remote],
                    "reps": args.reps,
                }
            result["throughput"] = {"rows": rows, "goal_ratio": 0.99}
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
