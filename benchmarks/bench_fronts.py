"""Benchmark: the scoring fronts' JSON against podium's binary OIP route, on the same teacher (prints JSON).

16 callers (threads, one keep-alive connection each) send the same work for ``--seconds`` through
each route in turn: rows of ``--rows`` prompts x ``--tokens`` tokens, top-``--k`` logprobs at every
position. ``openai``: ``POST /v1/completions`` with ``prompt_logprobs: k`` (vLLM's shape, the rank of
each prompt token included), the answer parsed by ``json.loads``; ``oip``: ``POST /v2/models/m/infer``
asking ``logprobs``, ``topk_logprobs`` and ``topk_indices`` as binary tensors, decoded by
podium's codec.

Support scoring (the teacher's logprobs of ``--k`` ids the caller names at every position, e.g. the
student's top-k), side by side: ``vllm_support``: vLLM's teacher scoring on ``POST
/inference/v1/generate`` (``sampling_params.prompt_logprob_token_ids``, one sequence a request as
vLLM's route takes, every scored row; the answer's base64 ``.npy`` decoded by ``np.load``);
``oip_support``: ``candidate_ids [B, S, k]`` in, ``candidate_logprobs`` out, binary. ``openai`` is
the JSON a caller without either sends for the same signal (top-k, not its own support).

The teacher is a stand-in that answers at once (fixed arrays), so what is timed is
the fronts' own cost: parsing, the JSON answer built on the endpoint's codec threads, the bytes on
the wire and the caller's parsing. Printed: tokens/s of each route, the ratio, the bytes per token,
and p50/p99 of a call.

    python benchmarks/bench_fronts.py [--callers 16] [--rows 4] [--tokens 512] [--k 8] [--seconds 10] [--quick]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_common import add_common_args, emit  # noqa: E402

from podium.config.launcher import ServerSettings  # noqa: E402
from podium.protocol import oip  # noqa: E402
from podium.protocol.names import (  # noqa: E402
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    OPENAI_COMPLETIONS,
    TARGET_RANK,
    TOPK_INDICES,
    TOPK_LOGPROBS,
    VLLM_TOKEN_GENERATE,
)
from podium.teacher.endpoint import EndpointConfig, ServerThread  # noqa: E402
from podium.teacher.seam import GroupFacts, Liveness  # noqa: E402

TOKEN = "bench-token"
VOCAB = 32000


class FixedAnswerGroup:
    """Answers at once with arrays made once per shape: only the route's own cost is timed."""

    broken = None
    last_batch = None
    liveness = Liveness()

    def __init__(self) -> None:
        self.facts = GroupFacts(vocab_size=VOCAB)
        self._cache: dict[tuple[Any, ...], dict[str, np.ndarray]] = {}

    def compute(self, batch: Any, query: Any) -> dict[str, np.ndarray]:
        rows, width, k = batch.rows, batch.width, query.top_k or 1
        key = (rows, width, k, query.outputs, batch.candidates)
        if key not in self._cache:
            rng = np.random.default_rng(0)
            out = {"logprobs": -rng.random((rows, width), dtype=np.float32) * 5}
            out[TOPK_LOGPROBS] = -np.sort(rng.random((rows, width, k), dtype=np.float32) * 5, axis=-1)
            out[TOPK_INDICES] = rng.integers(0, VOCAB, (rows, width, k), dtype=np.int64)
            if TARGET_RANK in query.outputs:
                out[TARGET_RANK] = rng.integers(1, VOCAB, (rows, width), dtype=np.int64)
            if CANDIDATE_LOGPROBS in query.outputs:
                out[CANDIDATE_LOGPROBS] = -rng.random((rows, width, batch.candidates), dtype=np.float32) * 5
            self._cache[key] = {name: out[name] for name in query.outputs}
        return self._cache[key]

    def shutdown(self) -> bool:
        return True


def openai_call(session: requests.Session, url: str, prompts: list[list[int]], k: int) -> int:
    body = {"model": "m", "prompt": prompts, "max_tokens": 0, "prompt_logprobs": k}
    resp = session.post(url + OPENAI_COMPLETIONS, json=body, timeout=120)
    resp.raise_for_status()
    choices = json.loads(resp.content)["choices"]
    assert len(choices) == len(prompts)
    return len(resp.content)


def oip_call(session: requests.Session, url: str, ids: np.ndarray, k: int) -> int:
    lengths = np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
    chunks, header = oip.encode_request([("input_ids", ids), ("input_lengths", lengths)],
                                        outputs=["logprobs", TOPK_LOGPROBS, TOPK_INDICES], parameters={"top_k": k})
    body = b"".join(bytes(c) for c in chunks)
    resp = session.post(url + "/v2/models/m/infer", data=body, timeout=120,
                        headers={oip.HEADER_LENGTH: str(header), "Content-Type": oip.BINARY_CONTENT_TYPE})
    resp.raise_for_status()
    answer = oip.decode_response(resp.content, int(resp.headers[oip.HEADER_LENGTH]))
    assert answer.outputs[TOPK_INDICES].shape == (*ids.shape, k)
    return len(resp.content)


def vllm_support_call(session: requests.Session, url: str, row: list[int], support: list[list[int]]) -> int:
    body = {"model": "m", "token_ids": row, "sampling_params": {"max_tokens": 1, "prompt_logprob_token_ids": support}}
    resp = session.post(url + VLLM_TOKEN_GENERATE, json=body, timeout=120)
    resp.raise_for_status()
    scores = np.load(io.BytesIO(base64.b64decode(json.loads(resp.content)["prompt_token_id_logprobs"])))
    assert scores.shape == (len(row) - 1, len(support[0]))
    return len(resp.content)


def oip_support_call(session: requests.Session, url: str, ids: np.ndarray, support: np.ndarray) -> int:
    lengths = np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
    chunks, header = oip.encode_request([("input_ids", ids), ("input_lengths", lengths), (CANDIDATE_IDS, support)],
                                        outputs=[CANDIDATE_LOGPROBS])
    body = b"".join(bytes(c) for c in chunks)
    resp = session.post(url + "/v2/models/m/infer", data=body, timeout=120,
                        headers={oip.HEADER_LENGTH: str(header), "Content-Type": oip.BINARY_CONTENT_TYPE})
    resp.raise_for_status()
    answer = oip.decode_response(resp.content, int(resp.headers[oip.HEADER_LENGTH]))
    assert answer.outputs[CANDIDATE_LOGPROBS].shape == support.shape
    return len(resp.content)


def drive(call: Any, callers: int, seconds: float) -> dict[str, Any]:
    """``callers`` threads calling ``call(session)`` for ``seconds``: calls, bytes, latencies."""
    stop = time.monotonic() + seconds
    latencies: list[float] = []
    sizes: list[int] = []
    lock = threading.Lock()

    def loop() -> None:
        with requests.Session() as session:
            session.headers["Authorization"] = f"Bearer {TOKEN}"
            while time.monotonic() < stop:
                started = time.perf_counter()
                size = call(session)
                with lock:
                    latencies.append(time.perf_counter() - started)
                    sizes.append(size)

    threads = [threading.Thread(target=loop) for _ in range(callers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"calls": len(latencies), "seconds": elapsed, "bytes_per_call": statistics.mean(sizes),
            "p50_ms": 1000 * q[49], "p99_ms": 1000 * q[98]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    add_common_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.callers, args.rows, args.tokens, args.seconds = 4, 2, 64, 1.0
    ids = np.random.default_rng(1).integers(0, VOCAB, (args.rows, args.tokens), dtype=np.int64)
    prompts = ids.tolist()
    support = np.random.default_rng(2).integers(0, VOCAB, (*ids.shape, args.k), dtype=np.int64)  # [B, S, k]
    row_support = support[0, :-1].tolist()  # vLLM's form: one list per scored row of one sequence
    server = ServerThread(FixedAnswerGroup(), EndpointConfig(
        served_name="m", token=TOKEN, server=ServerSettings(port_range=(24000, 24999), max_top_k=64,
                                                            max_request_tokens=1 << 22)))
    server.start()
    server.set_ready(True)
    try:
        whole = args.rows * args.tokens
        routes = {"openai": (lambda s: openai_call(s, server.url, prompts, args.k), whole),
                  "oip": (lambda s: oip_call(s, server.url, ids, args.k), whole),
                  "vllm_support": (lambda s: vllm_support_call(s, server.url, prompts[0], row_support), args.tokens),
                  "oip_support": (lambda s: oip_support_call(s, server.url, ids, support), whole)}
        result: dict[str, Any] = {"callers": args.callers, "rows": args.rows, "tokens": args.tokens, "k": args.k}
        for name, (call, tokens) in routes.items():
            call_once = call  # warm up: the connection, the group's cached arrays
            with requests.Session() as s:
                s.headers["Authorization"] = f"Bearer {TOKEN}"
                call_once(s)
            run = drive(call, args.callers, args.seconds)
            run["tokens_per_s"] = run["calls"] * tokens / run["seconds"]
            run["bytes_per_token"] = run["bytes_per_call"] / tokens
            result[name] = run
        result["oip_over_openai"] = result["oip"]["tokens_per_s"] / result["openai"]["tokens_per_s"]
        result["vllm_support_over_openai"] = result["vllm_support"]["tokens_per_s"] / result["openai"]["tokens_per_s"]
        result["oip_support_over_vllm_support"] = (result["oip_support"]["tokens_per_s"]
                                                   / result["vllm_support"]["tokens_per_s"])
    finally:
        server.stop()
    emit(result, args.json)


if __name__ == "__main__":
    main()
