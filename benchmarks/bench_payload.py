"""Benchmark: a full-vocabulary payload through the endpoint and the client (prints JSON).

NeMo RL's full-vocabulary distillation moves the teacher's hidden states, ``B x S x H`` bf16 per
call (64 x 2048 x 4096: 1 GiB). What it measures, in one run, alternating:

- ``podium``: ``TeacherClient.infer(ids, lengths, ask(outputs=["hidden_states"],
  payload_datatype="BF16"))`` from a client in another process, through the real endpoint, to a
  stand-in group that answers at once from a buffer made once (no model forward is timed): the
  call's time, its MB/s;
- ``raw``: the same bytes over a plain loopback socket between the same two processes (one
  ``sendall`` of a buffer made once, ``recv_into`` one allocated once);
- ``raw_fresh``: the same, received into fresh memory each time (its page faults paid, as a
  receiver that hands each answer over in memory of its own pays them unless it recycles);
- ``ratio`` = raw time / podium time (goal >= 0.9), medians of ``--reps``; ``ratio_fresh`` against
  ``raw_fresh``. The bench drops each answer before the next call, as NeMo RL's facade does once it
  has written it to TransferQueue, so the client receives into the memory of the one before
  (:mod:`podium.client.buffers`): ``ratio`` is the one that counts; a caller that keeps every
  answer is at ``ratio_fresh``;
- ``server_peak_mb_per_answer``: the serving process's peak RSS during a call over its RSS
  before it (sampled every 5 ms; the largest of the calls), beside the payload's own size.

``--quick``: 4 x 256 x 512 (seconds, for tests).

    python benchmarks/bench_payload.py [--shape 64x2048x4096] [--reps 5] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from bench_endpoint import ClientProcess, bench_run, serve  # noqa: E402
from bench_topk import RawSender, _raw_receive  # noqa: E402

from podium.protocol.batch import Batch  # noqa: E402
from podium.protocol.query import Query  # noqa: E402
from podium.teacher.seam import BatchStats, GroupFacts, Liveness  # noqa: E402

QUICK = {"shape": "4x256x512", "reps": 2}
VOCAB = 1024


class PayloadGroup:
    """Answers ``hidden_states`` at once: rows of a bf16 buffer made once (nothing computed)."""

    def __init__(self, rows: int, width: int, hidden: int) -> None:
        import torch

        self.facts = GroupFacts(vocab_size=VOCAB, max_tokens_per_microbatch=rows * width, hidden_size=hidden)
        self.broken: str | None = None
        self.last_batch: BatchStats | None = None
        self.liveness = Liveness()
        self.buffer = torch.randn(rows, width, hidden).to(torch.bfloat16)

    def compute(self, batch: Batch, query: Query) -> dict[str, Any]:
        assert query.payload == "hidden_states" and batch.width <= self.buffer.shape[1]
        self.last_batch = BatchStats(rows=batch.rows, tokens=batch.tokens, microbatches=1,
                                     computed_tokens=batch.tokens, seconds=0.0)
        return {"hidden_states": self.buffer[:batch.rows, :batch.width]}


def client_main(rendezvous: str) -> None:
    """Commands as JSON lines on stdin (``payload``: timed infer calls; ``raw``: loopback transfers)."""
    import numpy as np

    import podium
    from podium.client import ask

    client = podium.connect(rendezvous, ready_timeout_s=600)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "raw":
            times = _raw_receive(cmd)
        elif cmd["op"] == "raw_fresh":
            times = _raw_receive(cmd, fresh=True)
        else:
            b, s, h = cmd["shape"]
            ids = np.ones((b, s), dtype=np.int64)
            lengths = np.full((b,), s, dtype=np.int64)
            teacher = client.teacher(cmd["alias"])
            query = ask(outputs=["hidden_states"], payload_datatype="BF16")
            times = []
            for i in range(cmd["warmup"] + cmd["reps"]):
                t0 = time.perf_counter()
                out = teacher.infer(ids, lengths, query)["hidden_states"]
                elapsed = time.perf_counter() - t0
                assert tuple(out.shape) == (b, s, h) and str(out.dtype) == "torch.bfloat16", (out.shape, out.dtype)
                del out
                if i >= cmd["warmup"]:
                    times.append(elapsed)
        sys.stdout.write(json.dumps({"times": times}) + "\n")
        sys.stdout.flush()


class PeakRss:
    """This process's RSS sampled every 5 ms while running: the peak over the start."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def finish(self) -> float:
        self.stop.set()
        self.thread.join()
        return (self.peak - self.base) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="64x2048x4096", help="rows x positions x hidden size")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    add_common_args(parser)
    args = parser.parse_args()
    if args.client:
        client_main(args.client)
        return
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    b, s, h = (int(x) for x in args.shape.split("x"))
    nbytes = b * s * h * 2
    tmp, layout, token = bench_run("podium-bench-payload-", {"k1": "teacher"})
    group = PayloadGroup(b, s, h)
    server = serve(group, layout, "k1", "teacher", token, 1, max_response_mb=max(64, 2 * nbytes // 2**20),
                   max_request_tokens=max(b * s, 1024))
    raw = RawSender()
    client = ClientProcess(layout.rendezvous_path, script=__file__)
    podium_times: list[float] = []
    raw_times: list[float] = []
    fresh_times: list[float] = []
    load_before = os.getloadavg()
    try:
        client.run(op="payload", alias="teacher", shape=[b, s, h], warmup=1, reps=0)  # connection, first pages
        client.run(op="raw", port=raw.port, nbytes=nbytes, warmup=1, reps=0)
        peaks = []
        for _ in range(args.reps):  # alternating: the machine's load falls on both alike
            peak = PeakRss()  # the answer's own: the raw sender (in this process too) allocates its buffer
            podium_times += client.run(op="payload", alias="teacher", shape=[b, s, h], warmup=0, reps=1)
            peaks.append(peak.finish())
            # a connection of its own each time, whose first transfer (untimed) pays for the buffers
            raw_times += client.run(op="raw", port=raw.port, nbytes=nbytes, warmup=1, reps=1)
            fresh_times += client.run(op="raw_fresh", port=raw.port, nbytes=nbytes, warmup=0, reps=1)
        peak_mb = max(peaks)
    finally:
        client.close()
        raw.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    podium_s, raw_s = statistics.median(podium_times), statistics.median(raw_times)
    fresh_s = statistics.median(fresh_times)
    result = {
        "shape": [b, s, h], "payload_mb": nbytes / 2**20, "reps": args.reps,
        "podium_s": podium_s, "raw_s": raw_s,
        "podium_mb_per_s": nbytes / 2**20 / podium_s, "raw_mb_per_s": nbytes / 2**20 / raw_s,
        "raw_fresh_s": fresh_s,
        "ratio": raw_s / podium_s, "goal_ratio": 0.9, "ratio_fresh": fresh_s / podium_s,
        "podium_all_s": podium_times, "raw_all_s": raw_times, "raw_fresh_all_s": fresh_times,
        "load_average": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "server_peak_mb_per_answer": peak_mb,
        "note": "the stand-in answers from one buffer (views): the peak is what serving adds",
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
