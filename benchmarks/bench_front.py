"""Benchmark: calls through ``podium front`` against the same calls straight to the teacher, side by
side in one run (prints JSON).

One stand-in teacher that answers at once (``bench_fronts.FixedAnswerGroup``: what is timed is the
wire and the relays, not a model) serves a run; a front serves the run's alias. ``--callers``
threads (one keep-alive connection each) send the same work for ``--seconds`` first to the teacher's
URL, then to the front's: ``openai``, ``POST /v1/completions`` with ``prompt_logprobs`` (rows of
``--rows`` prompts x ``--tokens`` tokens, top-``--k``), tokens/s; ``topk``, the binary Open
Inference Protocol route asking logprobs and top-``--payload-k`` logprobs and ids for
``--payload-rows`` x ``--tokens`` (an answer of several MB), MB/s of answers. Printed: each route's
rate direct and through the front, their ratio, p50/p99 of a call.

    python benchmarks/bench_front.py [--callers 16] [--rows 4] [--tokens 512] [--k 8] [--payload-rows 8]
                                     [--payload-k 64] [--seconds 10] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_common import add_common_args, emit  # noqa: E402
from bench_fronts import TOKEN, VOCAB, FixedAnswerGroup, drive, oip_call, openai_call  # noqa: E402
from harness.lifecycle import Teacher  # noqa: E402
from harness.run import TeacherDef, make_run  # noqa: E402

from podium.front.serve import FrontThread  # noqa: E402
from podium.rendezvous import Generation  # noqa: E402
from podium.rendezvous.token import write_token  # noqa: E402

PORTS = (24500, 24999)
TEACHER = TeacherDef("f0f0f0f0f0f0", "m", ("m",))


def side_by_side(call: Any, urls: dict[str, str], callers: int, seconds: float) -> dict[str, Any]:
    """``call(session, url)`` driven against each of ``urls`` in turn (after one warm-up call)."""
    out = {}
    for name, url in urls.items():
        with requests.Session() as session:
            session.headers["Authorization"] = f"Bearer {TOKEN}"
            call(session, url)
        out[name] = drive(lambda s, u=url: call(s, u), callers, seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--payload-rows", type=int, default=8)
    parser.add_argument("--payload-k", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    add_common_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.callers, args.rows, args.tokens, args.payload_rows, args.seconds = 4, 2, 64, 2, 1.0
    rng = np.random.default_rng(1)
    prompts = rng.integers(0, VOCAB, (args.rows, args.tokens), dtype=np.int64).tolist()
    payload_ids = rng.integers(0, VOCAB, (args.payload_rows, args.tokens), dtype=np.int64)
    tmp = Path(tempfile.mkdtemp(prefix="podium-bench-front-"))
    try:
        layout, _ = make_run(tmp, [TEACHER], run_name="bench-front")
        write_token(layout.auth_token_path, TOKEN)
        teacher = Teacher(FixedAnswerGroup(), layout, TEACHER, TOKEN, generation=Generation(9000, 0), port_range=PORTS,
                          server_settings={"max_top_k": 128, "max_request_tokens": 1 << 22}).start()
        try:
            with FrontThread(layout.rendezvous_path) as front:
                urls = {"direct": teacher.url, "front": f"{front.url}/m"}
                result: dict[str, Any] = {"callers": args.callers, "rows": args.rows, "tokens": args.tokens,
                                          "k": args.k, "payload_rows": args.payload_rows, "payload_k": args.payload_k}
                chat = side_by_side(lambda s, u: openai_call(s, u, prompts, args.k), urls, args.callers, args.seconds)
                for run in chat.values():
                    run["tokens_per_s"] = run["calls"] * args.rows * args.tokens / run["seconds"]
                topk = side_by_side(lambda s, u: oip_call(s, u, payload_ids, args.payload_k), urls, args.callers,
                                    args.seconds)
                for run in topk.values():
                    run["mb_per_s"] = run["calls"] * run["bytes_per_call"] / run["seconds"] / 1e6
                result["openai"], result["topk"] = chat, topk
                result["openai_front_over_direct"] = chat["front"]["tokens_per_s"] / chat["direct"]["tokens_per_s"]
                result["topk_front_over_direct"] = topk["front"]["mb_per_s"] / topk["direct"]["mb_per_s"]
        finally:
            teacher.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    emit(result, args.json)


if __name__ == "__main__":
    main()
