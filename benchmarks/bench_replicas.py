"""Benchmark: one teacher served by R replicas behind one client: scaling, and a replica's failover (prints JSON).

Every replica is an in-process ``EndpointServer`` (``ServerThread``) with its endpoint record and
heartbeat, served by the teacher's real lifecycle (``tests/harness/lifecycle.Teacher``), in front of a
stand-in group that *sleeps* instead of computing: each replica stands for its own allocation,
and on a shared 2-core box two CPU-bound models would measure the cores, not the client.

The stand-in is a GPU in its compute-bound regime: a call takes ``call_ms`` (the per-call cost: a
Ray round trip, kernel launches) plus ``token_ms`` for every token position it computes (each row
at its bucket length, :func:`podium.teacher.compute.microbatch.bucket_length`, padding included); by
default 10 ms and 0.2 ms (5000 computed tokens/s a replica: a GPU slowed down so that what this
machine's CPUs do per request, client, HTTP and checks, stays small beside it). Its cost is
proportional to the tokens it computes, so the endpoint batching several callers' requests into
one call changes only how often the per-call cost is paid, not a replica's token throughput: what
differs between replica counts is how the client spreads the calls. Answers are
``fake_logprobs`` of ``tests/harness/fake_group.py`` (deterministic, the same on every replica), and
every answer is checked: a wrong answer or an exception is a failed call.

- ``scaling``: for R in ``--replicas`` (1, 2, 4): R replicas, a rendezvous listing them, and K = 4R
  caller threads of one ``podium.connect`` client, each sending ragged prompt groups back to back
  (bench_shared's workload: 2-8 rows, lengths ``8 * (1 + Pareto(1.1))`` clipped to 8..1024). K
  grows with R so that every replica gets the same offered load at every R (4 requests
  outstanding: while a call computes, the callers answered by the previous one have sent their
  next requests, so it seldom waits for a caller; ``busy_share_per_replica`` says how seldom) and
  tokens/s per replica compares like with like. Measured over a window after a warm-up: tokens/s
  (real tokens answered / window), p50/p99 latency, calls, requests and tokens per replica (from
  each group and server), each replica's busy share of the window, failed calls, the process's CPU
  (cores) as a check that the machine was not the limit. Scaling efficiency = tokens/s(R) / (R *
  tokens/s(1)); goal >= 0.9.
- ``failover``: R = 2 with K = 8 callers running; replica 0 drains and stops mid-run (a preemption:
  ``Teacher.stop()``, 503 to new requests, queued ones finish, then ``stopped``), and after
  ``away_s`` comes back as its next generation (a new job; its port the first free one of the
  range, so the old one when free). Reported: failed calls (goal 0),
  the client's retries, tokens/s before / while away / after it takes calls again, how long until
  it takes calls (bounded by the client's ``refresh_s``), and a timeline of tokens/s per replica.

    python benchmarks/bench_replicas.py [--quick] [--json PATH] [--replicas 1,2,4] [--seconds 20]

``--quick``: 1.5 s windows, a 1 s absence, the client's ``refresh_s`` 0.5 s (seconds in all).
Timings are only meaningful relative to each other within one run on a shared machine.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_common import add_common_args, emit  # noqa: E402
from bench_shared import percentile, rollout_requests  # noqa: E402
from harness.fake_group import fake_logprobs  # noqa: E402
from harness.lifecycle import Teacher  # noqa: E402
from harness.run import TeacherDef, make_run  # noqa: E402

import podium  # noqa: E402
from podium.rendezvous import Generation  # noqa: E402
from podium.teacher.compute.microbatch import bucket_length  # noqa: E402
from podium.teacher.endpoint.batching import BATCH_MICROBATCHES  # noqa: E402
from podium.teacher.seam import GroupFacts, Liveness  # noqa: E402

logger = logging.getLogger("bench_replicas")

PORTS = (23500, 23999)  # the endpoint tests start at 23000: this run's servers look higher first
VOCAB = 32000
POOL = 32  # prepared requests per caller, sent in turn
QUICK = {"seconds": 1.5, "warmup": 0.5, "before": 1.5, "away": 1.0, "after": 2.5, "refresh_s": 0.5,
         "max_len": 256, "bin_s": 0.25}


# ----------------------------------------------------------------------------------------------
# the stand-in group
# ----------------------------------------------------------------------------------------------


@dataclass
class Span:
    """One group call: when it ran, and the real and computed tokens it held."""

    start: float
    end: float
    tokens: int
    computed: int


class SleepingGroup:
    """The worker-group interface with a fixed cost per call and per computed token (see the module
    doc); answers ``fake_logprobs``. The endpoint runs one call at a time (its executor)."""

    broken = None
    last_batch = None
    liveness = Liveness()

    def __init__(self, call_s: float, token_s: float, max_tokens_per_microbatch: int) -> None:
        # the endpoint's batches: BATCH_MICROBATCHES of this budget
        self.facts = GroupFacts(vocab_size=VOCAB, max_sequence_length=4096,
                                max_tokens_per_microbatch=max_tokens_per_microbatch)
        self.call_s = call_s
        self.token_s = token_s
        self.spans: list[Span] = []

    def compute(self, data: Any, query: Any) -> dict[str, Any]:
        start = time.monotonic()
        lengths = data.input_lengths.tolist()
        computed = sum(bucket_length(n, self.facts.sequence_length_multiple) for n in lengths)
        answer = data.pad(fake_logprobs(data.input_ids, data.input_lengths))
        time.sleep(max(0.0, start + self.call_s + self.token_s * computed - time.monotonic()))
        self.spans.append(Span(start, time.monotonic(), int(sum(lengths)), computed))
        return {"logprobs": answer}

    def totals(self, t0: float = float("-inf"), t1: float = float("inf")) -> dict[str, float]:
        """Calls ending in ``[t0, t1)``: their number, real and computed tokens, and busy seconds."""
        spans = [s for s in list(self.spans) if t0 <= s.end < t1]
        return {"calls": len(spans), "tokens": sum(s.tokens for s in spans),
                "computed": sum(s.computed for s in spans), "busy_s": sum(s.end - s.start for s in spans)}

    def shutdown(self) -> bool:
        return True


# ----------------------------------------------------------------------------------------------
# replicas and callers
# ----------------------------------------------------------------------------------------------


@dataclass
class Settings:
    """The stand-in's costs (seconds), the workload's longest row, and the client's options."""

    call_s: float
    token_s: float
    microbatch_tokens: int
    max_len: int
    refresh_s: float
    call_timeout_s: float = 120.0

    def group(self) -> SleepingGroup:
        return SleepingGroup(self.call_s, self.token_s, self.microbatch_tokens)


class Deployment:
    """R replicas of one teacher in a temporary run dir (a context manager: everything stops)."""

    def __init__(self, replicas: int, settings: Settings) -> None:
        self.settings = settings
        self.tmp = Path(tempfile.mkdtemp(prefix=f"podium-bench-replicas-{replicas}-"))
        self.definition = TeacherDef(f"replicas{replicas:04d}", "stand-in", ("stand-in",), replicas=replicas)
        try:
            self.layout, self.token = make_run(self.tmp, [self.definition], run_name="bench-replicas")
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        self.teachers: list[Teacher] = []  # the serving generation of each replica
        self._stopped: set[int] = set()  # id() of the teachers stopped already

    def start_replica(self, index: int, restart: int = 0) -> Teacher:
        """Replica ``index`` (job 7000 + index, generation ``restart``) serving and published ready."""
        teacher = Teacher(self.settings.group(), self.layout, self.definition, self.token,
                          generation=Generation(7000 + index, restart), port_range=PORTS, replica=index).start()
        if index < len(self.teachers):
            self.teachers[index] = teacher
        else:
            self.teachers.append(teacher)
        return teacher

    def stop_replica(self, index: int) -> None:
        """Replica ``index`` drains (503 to new requests, queued ones finish), then says stopped."""
        teacher = self.teachers[index]
        self._stopped.add(id(teacher))
        teacher.stop()

    def connect(self) -> podium.PodiumClient:
        return podium.connect(self.layout.rendezvous_path, return_type="numpy", refresh_s=self.settings.refresh_s,
                              call_timeout_s=self.settings.call_timeout_s, ready_timeout_s=60.0)

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for index, teacher in enumerate(self.teachers):
                if id(teacher) not in self._stopped:
                    self.stop_replica(index)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


@dataclass
class Done:
    """One finished request: when it ended, how long it took, its real tokens, whether its answer was right."""

    end: float
    latency: float
    tokens: int
    ok: bool


@dataclass
class Callers:
    """K threads of one client, each sending its prepared requests in turn until stopped; every
    answer checked against ``fake_logprobs``."""

    client: podium.PodiumClient
    alias: str
    k: int
    max_len: int
    seed: int = 0
    done: list[list[Done]] = field(init=False)  # per caller, in the order they finished
    errors: list[str] = field(init=False)  # what went wrong (failed calls), as text

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self.errors = []
        self._work: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = []  # (ids, lengths, expected)
        for c in range(self.k):
            requests = rollout_requests(1000 * self.seed + c, POOL, VOCAB, self.max_len)
            self._work.append([(ids, lengths, fake_logprobs(ids, lengths)) for ids, lengths in requests])
        self.done = [[] for _ in range(self.k)]
        self._threads = [threading.Thread(target=self._run, args=(c,), name=f"caller-{c}", daemon=True)
                         for c in range(self.k)]

    def _run(self, c: int) -> None:
        mine, n = self.done[c], 0
        while not self._stop.is_set():
            ids, lengths, expected = self._work[c][n % POOL]
            n += 1
            t0 = time.monotonic()
            ok = False
            try:
                out = self.client.get_logprobs(self.alias, {"input_ids": ids, "input_lengths": lengths})
                ok = bool(np.array_equal(out["logprobs"], expected))
                if not ok:
                    self.errors.append(f"caller {c}: wrong answer for a {list(ids.shape)} request")
            except Exception as exc:  # counted as a failed call, reported
                self.errors.append(f"caller {c}: {type(exc).__name__}: {exc}"[:500])
            end = time.monotonic()
            mine.append(Done(end, end - t0, int(lengths.sum()), ok))

    def start(self) -> Callers:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.client.options.call_timeout_s + 30)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"callers still running after their stop: {alive}")

    def all(self) -> list[Done]:
        return sorted((d for mine in self.done for d in list(mine)), key=lambda d: d.end)


def window(done: list[Done], t0: float, t1: float) -> dict[str, Any]:
    """Requests finished in ``[t0, t1)``: tokens/s of the right answers, latency, failures."""
    inside = [d for d in done if t0 <= d.end < t1]
    good = [d for d in inside if d.ok]
    seconds = max(t1 - t0, 1e-9)
    lat = [d.latency for d in good] or [float("nan")]
    return {"seconds": round(seconds, 3), "requests": len(inside), "failed": len(inside) - len(good),
            "tokens": sum(d.tokens for d in good), "tokens_per_s": round(sum(d.tokens for d in good) / seconds, 1),
            "p50_ms": round(percentile(lat, 0.5) * 1e3, 1), "p99_ms": round(percentile(lat, 0.99) * 1e3, 1)}


# ----------------------------------------------------------------------------------------------
# the two measurements
# ----------------------------------------------------------------------------------------------


def padding_share(groups: list[dict[str, float]]) -> float:
    """Padded share of the token positions the groups computed."""
    return round(1 - sum(g["tokens"] for g in groups) / max(1, sum(g["computed"] for g in groups)), 4)


def measure_scaling(replicas: int, callers_per_replica: int, settings: Settings, warmup_s: float,
                    seconds: float) -> dict[str, Any]:
    """R replicas, K = callers_per_replica * R callers: one window of ``seconds`` after ``warmup_s``."""
    k = callers_per_replica * replicas
    with Deployment(replicas, settings) as run:
        for i in range(replicas):
            run.start_replica(i)
        with run.connect() as client:
            callers = Callers(client, "stand-in", k, settings.max_len, seed=replicas).start()
            try:
                time.sleep(warmup_s)
                served0 = [t.server.server.served for t in run.teachers]
                cpu0, t0, load0 = time.process_time(), time.monotonic(), os.getloadavg()[0]
                time.sleep(seconds)
                cpu1, t1, load1 = time.process_time(), time.monotonic(), os.getloadavg()[0]
                served = [t.server.server.served - n for t, n in zip(run.teachers, served0, strict=True)]
            finally:
                callers.stop()
            done = callers.all()
            groups = [t.group.totals(t0, t1) for t in run.teachers]
            row = {"replicas": replicas, "callers": k, **window(done, t0, t1),
                   "failed_all": sum(not d.ok for d in done), "errors": callers.errors[:10],
                   "calls_per_replica": [g["calls"] for g in groups],
                   "requests_per_replica": served,
                   "tokens_per_replica": [g["tokens"] for g in groups],
                   "busy_share_per_replica": [round(g["busy_s"] / (t1 - t0), 3) for g in groups],
                   "padding_share": padding_share(groups),
                   "retries": client.teacher("stand-in").retries,
                   "process_cpu_cores": round((cpu1 - cpu0) / (t1 - t0), 3),
                   "load_avg_1m": [round(load0, 2), round(load1, 2)]}
    logger.info("R=%d K=%d: %.0f tokens/s, p50 %.0f ms, p99 %.0f ms, calls per replica %s, failed %d",
                replicas, k, row["tokens_per_s"], row["p50_ms"], row["p99_ms"], row["calls_per_replica"],
                row["failed_all"])
    return row


def spread(spans: list[Span], t0: float, bins: int, bin_s: float) -> list[float]:
    """Tokens/s per bin of ``bin_s`` from ``t0``, each call's tokens spread evenly over its span."""
    out = [0.0] * bins
    for s in spans:
        length = max(s.end - s.start, 1e-9)
        first, last = int((s.start - t0) // bin_s), int((s.end - t0) // bin_s)
        for b in range(max(first, 0), min(last, bins - 1) + 1):
            lo, hi = max(s.start, t0 + b * bin_s), min(s.end, t0 + (b + 1) * bin_s)
            if hi > lo:
                out[b] += s.tokens * (hi - lo) / length / bin_s
    return [round(x, 1) for x in out]


def measure_failover(callers_per_replica: int, settings: Settings, warmup_s: float, before_s: float, away_s: float,
                     after_s: float, bin_s: float) -> dict[str, Any]:
    """R = 2 serving K callers; replica 0 drains and stops, and comes back as its next generation."""
    k = 2 * callers_per_replica
    with Deployment(2, settings) as run:
        for i in range(2):
            run.start_replica(i)
        old_group, old_url = run.teachers[0].group, run.teachers[0].url
        with run.connect() as client:
            callers = Callers(client, "stand-in", k, settings.max_len, seed=99).start()
            try:
                time.sleep(warmup_s)
                t_start = time.monotonic()
                time.sleep(before_s)
                t_drain = time.monotonic()
                logger.info("failover: replica 0 drains and stops")
                run.stop_replica(0)
                t_stopped = time.monotonic()
                time.sleep(away_s)
                back = run.start_replica(0, restart=1)
                t_back = time.monotonic()
                logger.info("failover: replica 0 back as generation %s at %s", back.generation, back.url)
                deadline = t_back + max(after_s, 4 * settings.refresh_s + 5)
                while not back.group.spans and time.monotonic() < deadline:
                    time.sleep(0.01)
                t_first = back.group.spans[0].start if back.group.spans else None
                time.sleep(max(0.0, (t_first or t_back) + after_s - time.monotonic()))
                t_end = time.monotonic()
            finally:
                callers.stop()
            done = callers.all()
            retries = client.teacher("stand-in").retries
        replica0 = [*old_group.spans, *run.teachers[0].group.spans]
        replica1 = run.teachers[1].group.spans
    bins = int((t_end - t_start) / bin_s) + 1

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t_start, 3)

    return {
        "replicas": 2, "callers": k, "away_s": away_s, "urls": {"before": old_url, "back": back.url},
        "failed": sum(not d.ok for d in done), "requests": len(done), "retries": retries, "errors": callers.errors[:10],
        "events_s": {"drain": rel(t_drain), "stopped": rel(t_stopped), "back_ready": rel(t_back),
                     "first_call_back": rel(t_first), "end": rel(t_end)},
        "drain_took_s": round(t_stopped - t_drain, 3),
        "takes_calls_after_s": None if t_first is None else round(t_first - t_back, 3),
        "phases": {"before": window(done, t_start, t_drain),
                   "away": window(done, t_drain, t_back),
                   "after": window(done, t_first or t_end, t_end)},
        "calls_on_returned_replica": len(run.teachers[0].group.spans),
        "timeline": {"bin_s": bin_s, "t_s": [round(b * bin_s, 3) for b in range(bins)],
                     "replica_tokens_per_s": [spread(replica0, t_start, bins, bin_s),
                                              spread(replica1, t_start, bins, bin_s)]},
        "goal_failed": 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser)
    parser.add_argument("--replicas", default="1,2,4", help="replica counts of the scaling part")
    parser.add_argument("--callers-per-replica", type=int, default=4, help="K = this x R caller threads")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window per replica count")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of calls before a window")
    parser.add_argument("--call-ms", type=float, default=10.0, help="the stand-in's cost per group call")
    parser.add_argument("--token-ms", type=float, default=0.2, help="the stand-in's cost per computed token")
    parser.add_argument("--microbatch-tokens", type=int, default=4096, help="the stand-in's micro-batch budget")
    parser.add_argument("--max-len", type=int, default=1024, help="longest row of the workload")
    parser.add_argument("--before", type=float, default=10.0, help="failover: seconds before the replica stops")
    parser.add_argument("--away", type=float, default=5.0, help="failover: seconds it stays away")
    parser.add_argument("--after", type=float, default=10.0, help="failover: seconds after it takes calls again")
    parser.add_argument("--bin-s", type=float, default=0.5, help="failover timeline's bin")
    parser.add_argument("--refresh-s", type=float, default=2.0, help="the client's refresh_s (ClientOptions' default)")
    parser.add_argument("--skip-failover", action="store_true")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()  # what was given explicitly still wins
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("podium").setLevel(logging.WARNING)
    settings = Settings(args.call_ms / 1e3, args.token_ms / 1e3, args.microbatch_tokens, args.max_len, args.refresh_s)
    counts = [int(x) for x in args.replicas.split(",")]
    result: dict[str, Any] = {
        "stand_in": {"call_ms": args.call_ms, "token_ms": args.token_ms, "microbatch_tokens": args.microbatch_tokens,
                     "batch_tokens": BATCH_MICROBATCHES * args.microbatch_tokens,
                     "cost": "call_ms + token_ms x computed tokens (rows x bucket length), slept"},
        "workload": {"rows_per_request": "2-8", "lengths": f"8 * (1 + Pareto(1.1)), clipped to 8..{args.max_len}",
                     "callers_per_replica": args.callers_per_replica, "window_s": args.seconds,
                     "warmup_s": args.warmup},
        "client": {"refresh_s": args.refresh_s, "call_timeout_s": settings.call_timeout_s},
        "machine": {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "scaling": [],
    }
    for r in counts:
        result["scaling"].append(measure_scaling(r, args.callers_per_replica, settings, args.warmup, args.seconds))
    by = {row["replicas"]: row for row in result["scaling"]}
    if 1 in by and by[1]["tokens_per_s"] > 0:
        base = by[1]["tokens_per_s"]
        for row in result["scaling"]:
            row["ideal_tokens_per_s"] = round(row["replicas"] * base, 1)
            row["efficiency"] = round(row["tokens_per_s"] / (row["replicas"] * base), 3)
        result["scaling_efficiency"] = {"by_replicas": {str(r): by[r]["efficiency"] for r in by},
                                        "min": min(row["efficiency"] for row in result["scaling"]), "goal": 0.9}
    if not args.skip_failover:
        result["failover"] = measure_failover(args.callers_per_replica, settings, args.warmup, args.before,
                                              args.away, args.after, args.bin_s)
        f = result["failover"]
        logger.info("failover: %d failed of %d, %d retries; tokens/s before %.0f, away %.0f, after %.0f; "
                    "takes calls %.2fs after it is back", f["failed"], f["requests"], f["retries"],
                    f["phases"]["before"]["tokens_per_s"], f["phases"]["away"]["tokens_per_s"],
                    f["phases"]["after"]["tokens_per_s"], f["takes_calls_after_s"] or float("nan"))
    result["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    emit(result, args.json)


if __name__ == "__main__":
    main()
