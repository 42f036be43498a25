"""Every benchmark of the repo in one run: one JSON file and PNG charts (matplotlib, Agg).

Each benchmark runs as its own subprocess (``--json`` into the output dir, its output in
``logs/``), tagged by its own ``PODIUM_BENCH_MARK``; after it exits, whatever process still carries
that mark is a leak: recorded under ``survivors`` in the JSON (and then ended by PID, so the next
benchmark runs on a clean machine). Charts:

- ``launcher_phases.png``: time to ready per teacher by phase (bench_launcher), beside Ray's floor
  alone and two at once;
- ``remote_ratio.png``: in-process / endpoint time (= endpoint over in-process throughput) by batch
  shape, for ``get_logprobs`` (bench_endpoint) and ``get_topk_logits`` (bench_topk);
- ``topk_wire.png``: top-k answers' MB/s beside the raw loopback's per shape and dtype pair, the
  GPU-speed stand-in's remote / in-process ratio, and callers' aggregate MB/s (bench_topk);
- ``shared_throughput.png``: tokens/s and p99 by number of callers, FIFO vs batched (bench_shared);
- ``failover.png``: from a fault to the first good answer, by phase (bench_faults).
- ``replica_scaling.png``: tokens/s by replica count beside R x tokens/s of one, with the scaling
  efficiency, and tokens/s per replica over time while one drains, stops and comes back (bench_replicas).

With no chart of their own (their numbers in the JSON): bench_payload (a full-vocabulary payload
against a raw loopback receiver) and bench_fronts (the scoring fronts' JSON against binary OIP).

What cannot run here is skipped with a printed notice, not an error: bench_faults without a
reachable Slurm (``--faults-json`` charts a saved run instead), gpu_check's measurement without
CUDA (its ``--dry-run`` runs), bench_shared where the script is absent.

    python benchmarks/run_all.py [--quick] [--out DIR] [--charts DIR] [--cluster slurm|local|none]
        [--only launcher,endpoint,...] [--faults-json PATH] [--topk-wire-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import MARK_ENV, kill_marked, wait_unmarked  # noqa: E402

SURVIVOR_WAIT_S = 30.0  # a process being reaped takes a moment; one that outlives this is a leak


def cuda_available() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def slurm_reachable() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    # (args) -> the arguments for this run, or a string: why it is skipped here
    plan: Callable[[argparse.Namespace], list[str] | str]


def _launcher(args: argparse.Namespace) -> list[str]:
    cluster = args.cluster or ("none" if args.quick else ("slurm" if slurm_reachable() else "local"))
    return ["--cluster", cluster, "--repeat", str(args.repeat)] + (["--quick"] if args.quick else [])


def _endpoint(args: argparse.Namespace) -> list[str]:
    return ["--quick"] if args.quick else []


def _topk(args: argparse.Namespace) -> list[str]:
    # quick: the transport part only; the endpoint benchmark builds the same model group
    if args.quick:
        return ["--quick", "--skip-model"]
    return ["--skip-model"] if args.topk_wire_only else []


def _teacher_group(args: argparse.Namespace) -> list[str]:
    return ["--quick", "--tp1-only"] if args.quick else []


def _gpu_check(args: argparse.Namespace) -> list[str]:
    if not cuda_available():
        print("run_all: no CUDA device: gpu_check runs its --dry-run (configs and the report, no measurement)")
        return ["--dry-run"]
    return ["--quick"] if args.quick else []


def _faults(args: argparse.Namespace) -> list[str] | str:
    if args.faults_json:
        return f"charted from {args.faults_json}"
    if not slurm_reachable():
        return "needs the Slurm test cluster (sinfo does not answer); --faults-json PATH charts a saved run"
    return ["--quick"] if args.quick else []


def _shared(args: argparse.Namespace) -> list[str] | str:
    if not (HERE / "bench_shared.py").exists():
        return "benchmarks/bench_shared.py is not in this checkout"
    return ["--quick"] if args.quick else []


def _quick_or_full(args: argparse.Namespace) -> list[str]:
    return ["--quick"] if args.quick else []


BENCHMARKS = (
    Bench("launcher", "bench_launcher.py", _launcher),
    Bench("endpoint", "bench_endpoint.py", _endpoint),
    Bench("topk", "bench_topk.py", _topk),
    Bench("teacher_group", "bench_teacher_group.py", _teacher_group),
    Bench("gpu_check", "gpu_check.py", _gpu_check),
    Bench("faults", "bench_faults.py", _faults),
    Bench("shared", "bench_shared.py", _shared),
    Bench("replicas", "bench_replicas.py", _quick_or_full),
    Bench("payload", "bench_payload.py", _quick_or_full),
    Bench("fronts", "bench_fronts.py", _quick_or_full),
)


def run_one(bench: Bench, argv: list[str], out: Path, mark: str, timeout_s: float) -> dict[str, Any]:
    json_path = out / f"{bench.name}.json"
    json_path.unlink(missing_ok=True)
    log = out / "logs" / f"{bench.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    own_mark = f"{mark}/{bench.name}"
    cmd = [sys.executable, str(HERE / bench.script), *argv, "--json", str(json_path)]
    print(f"run_all: {bench.name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    with open(log, "wb") as f:
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                  env={**os.environ, MARK_ENV: own_mark}, timeout=timeout_s)
            rc: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None  # subprocess.run killed the benchmark itself; what it started is swept below
    seconds = round(time.monotonic() - t0, 1)
    survivors = wait_unmarked(own_mark, SURVIVOR_WAIT_S)
    if survivors:
        kill_marked(own_mark)
    row: dict[str, Any] = {"status": "ok" if rc == 0 else "failed", "command": cmd[1:], "seconds": seconds,
                           "log": str(log), "survivors": [{"pid": p, "cmdline": c} for p, c in survivors]}
    if rc != 0:
        row["reason"] = f"timed out after {timeout_s:.0f}s" if rc is None else f"exit code {rc}"
        row["log_tail"] = log.read_text(errors="replace")[-2000:]
    if json_path.exists():
        row["result"] = json.loads(json_path.read_text())
    print(f"run_all: {bench.name}: {row['status']} in {seconds}s"
          + (f"; {len(survivors)} process(es) survived it: {survivors}" if survivors else ""), flush=True)
    return row


# ----------------------------------------------------------------------------------------------
# charts
# ----------------------------------------------------------------------------------------------

PHASE_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")


def _stacked(ax: Any, labels: list[str], rows: list[dict[str, float]], phases: list[str]) -> None:
    left = [0.0] * len(labels)
    for color, phase in zip(PHASE_COLORS, phases, strict=False):  # the palette outnumbers any chart's phases
        widths = [row.get(phase, 0.0) for row in rows]
        ax.barh(labels, widths, left=left, color=color, label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.1f}s", va="center", fontsize=8)
    ax.set_xlim(0, max(ax.get_xlim()[1], max(left, default=1.0) * 1.35))  # room for the totals and the legend
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(fontsize=7, loc="lower right")


def chart_launcher(result: dict[str, Any], path: Path, plt: Any) -> bool:
    runs, floor = result.get("podium", []), result.get("ray_floor", {})
    # one time axis: the teachers' ray phase reads against the floor below it
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 4.6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    if runs:
        run = runs[0]
        labels = [f"{name} ({t['nodes']} node{'s' if t['nodes'] > 1 else ''})" for name, t in run["teachers"].items()]
        rows = [{"submit": t["submit_s"], "ray": t["ray_s"], "model": t["model_s"], "endpoint": t["endpoint_s"]}
                for t in run["teachers"].values()]
        _stacked(ax1, labels, rows, ["submit", "ray", "model", "endpoint"])
        ax1.set_title(f"podium up -> all ready: {run['up_to_all_ready_s']:.0f}s (cluster: {run['cluster']})",
                      fontsize=10)
        ax1.set_xlabel("")
    else:
        ax1.text(0.5, 0.5, "podium's part not run (--cluster none)", ha="center", va="center")
        ax1.set_axis_off()
    alone = floor.get("alone", [])
    pairs = [f for pair in floor.get("two_at_once", []) for f in pair]
    labels, rows = [], []
    for label, floors in (("Ray floor alone", alone), ("Ray floor, two at once", pairs)):
        if floors:
            head = sum(f["head_s"] for f in floors) / len(floors)
            total = sum(f["head_plus_worker_s"] for f in floors) / len(floors)
            labels.append(label)
            rows.append({"head": head, "worker joins": total - head})
    _stacked(ax2, labels, rows, ["head", "worker joins"])
    ax2.set_title("ray start --block: head, then a worker joining (mean)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def chart_ratio(endpoint: dict[str, Any] | None, topk: dict[str, Any] | None, path: Path, plt: Any) -> bool:
    series = []
    if endpoint and "throughput" in endpoint:
        throughput = endpoint["throughput"]
        series.append(("get_logprobs (bench_endpoint)", throughput["rows"], throughput["goal_ratio"]))
    if topk and "model" in topk:
        model = topk["model"]
        series.append((f"get_topk_logits k={topk['k']} (bench_topk)", model["rows"], model["goal_ratio"]))
    if not series:
        return False
    fig, axes = plt.subplots(1, len(series), figsize=(3.6 * len(series) + 0.6, 3.2), squeeze=False)
    for ax, (title, rows, goal) in zip(axes[0], series, strict=True):
        shapes = list(rows)
        x = range(len(shapes))
        ax.bar([i - 0.2 for i in x], [rows[s]["ratio"] for s in shapes], 0.4, label="median", color=PHASE_COLORS[0])
        ax.bar([i + 0.2 for i in x], [rows[s]["ratio_of_fastest"] for s in shapes], 0.4, label="fastest",
               color=PHASE_COLORS[2])
        ax.axhline(goal, color="k", lw=0.8, ls="--", label=f"goal {goal}")
        ax.set_xticks(list(x), [f"{s}\ntokens" for s in shapes], fontsize=8)
        ax.set_ylim(0, max(1.2, *(rows[s]["ratio"] for s in shapes)) * 1.05)
        ax.set_ylabel("in-process time / endpoint time")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def chart_topk_wire(result: dict[str, Any], path: Path, plt: Any) -> bool:
    """bench_topk's transport: podium's MB/s beside the raw loopback's per shape and dtype pair
    (ratio over the bars), the GPU-speed stand-in's remote / in-process ratio, callers' aggregate."""
    wire, overlap, callers = result.get("wire"), result.get("overlap"), result.get("callers")
    if not wire:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), gridspec_kw={"width_ratios": [2.4, 1, 1.1]})
    ax = axes[0]
    bars = [(n.replace(" ", "\n"), w["raw_MB_per_s"], w["MB_per_s"], w["one_request_MB_per_s"], w["ratio"])
            for n, w in wire.items()]
    request = result.get("request")
    if request:  # the request side: large ids up, logprobs down (no pipelining there)
        bars.append((f"request\n{request['shape']}", request["raw_MB_per_s"], request["MB_per_s"], None,
                     request["ratio"]))
    x = range(len(bars))
    for j, (offset, label, color) in enumerate(((-0.27, "raw loopback", PHASE_COLORS[5]),
                                                (0.0, "podium", PHASE_COLORS[0]),
                                                (0.27, "podium, one request", PHASE_COLORS[2]))):
        ax.bar([i + offset for i, b in enumerate(bars) if b[1 + j] is not None],
               [b[1 + j] for b in bars if b[1 + j] is not None], 0.27, label=label, color=color)
    for i, (_, raw, mine, _, ratio) in enumerate(bars):
        ax.text(i, max(raw, mine) * 1.02, f"{ratio:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [b[0] for b in bars], fontsize=7)
    ax.set_ylim(0, max(max(b[1], b[2]) for b in bars) * 1.4)
    ax.set_ylabel("MB/s (answer; request: both ways)")
    ax.set_title(f"top-k answer (k={result.get('k')}): podium / raw loopback over the bars "
                 f"(goal {result.get('wire_goal_ratio', 0.7)})", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=3)
    ax = axes[1]
    if overlap:
        rows = overlap["rows"]
        shapes = list(rows)
        for j, (how, color) in enumerate((("pipelined", PHASE_COLORS[0]), ("one_request", PHASE_COLORS[2]))):
            ax.bar([i + (j - 0.5) * 0.35 for i in range(len(shapes))], [rows[s][how]["ratio"] for s in shapes], 0.35,
                   color=color, label=how.replace("_", " "))
        ax.axhline(overlap["goal_ratio"], color="k", lw=0.8, ls="--", label=f"goal {overlap['goal_ratio']}")
        ax.set_xticks(list(range(len(shapes))), shapes, fontsize=8)
        ax.set_ylim(0.5, 1.05)
        ax.set_ylabel("in-process time / endpoint time")
        ax.set_title(f"a group computing at {overlap['tokens_per_s']:.0e} tokens/s", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    ax = axes[2]
    if callers:
        rows = callers["rows"]
        ks = sorted(rows, key=int)
        ax.bar(range(len(ks)), [rows[k]["aggregate_MB_per_s"] for k in ks], 0.6, color=PHASE_COLORS[0])
        for i, k in enumerate(ks):
            probe = rows[k]["health_probe_ms"]
            ax.text(i, rows[k]["aggregate_MB_per_s"] / 2, f"health\n{probe['median']:.0f}/{probe['max']:.0f} ms",
                    ha="center", va="center", fontsize=7, color="white")
        raw = wire.get(f"{callers['shape']} {callers['values/indices']}", {}).get("raw_MB_per_s")
        if raw:
            ax.axhline(raw, color="k", lw=0.8, ls="--", label="raw loopback, one transfer")
            ax.legend(fontsize=7, loc="upper left")
        ax.set_xticks(list(range(len(ks))), ks)
        ax.set_xlabel("callers at once")
        ax.set_ylabel("aggregate answer MB/s")
        ax.set_title(f"{callers['shape']} {callers['values/indices']}: callers' total\n"
                     "(health probe median/max meanwhile)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def chart_shared(result: dict[str, Any], path: Path, plt: Any) -> bool:
    rows = result.get("callers", [])
    if not rows:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
    for color, mode in zip(PHASE_COLORS, sorted({r["mode"] for r in rows}), strict=False):  # fewer modes than colours
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["callers"])
        ks = [r["callers"] for r in mine]
        ax1.plot(ks, [r["tokens_per_s"] for r in mine], "o-", color=color, label=mode)
        ax2.plot(ks, [r["p50_ms"] for r in mine], "o-", color=color, label=f"{mode} p50")
        ax2.plot(ks, [r["p99_ms"] for r in mine], "o--", color=color, label=f"{mode} p99")
    ax1.set_xlabel("callers")
    ax1.set_ylabel("tokens/s")
    ax1.set_title("throughput by number of callers", fontsize=9)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("callers")
    ax2.set_ylabel("latency (ms)")
    ax2.set_title("latency per call", fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


FAULT_PHASES = ["detection", "slurm_requeue", "ray", "model_load", "endpoint", "first_answer"]


def chart_faults(result: dict[str, Any], path: Path, plt: Any) -> bool:
    faults = {k: v for k, v in result.get("results", {}).items() if isinstance(v, dict) and "phases_s" in v}
    if not faults:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(faults) + 1.6))
    labels = [f"{name}\n(calls {v['calls']}, failed {v['failed']}, wrong {v['wrong']})" for name, v in faults.items()]
    _stacked(ax, labels, [{p: max(0.0, v["phases_s"].get(p, 0.0)) for p in FAULT_PHASES} for v in faults.values()],
             FAULT_PHASES)
    ax.set_title("fault -> first good answer of the new generation", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _scaling_panel(ax: Any, rows: list[dict[str, Any]]) -> None:
    rows = sorted(rows, key=lambda r: r["replicas"])
    x = range(len(rows))
    ax.bar(list(x), [r["tokens_per_s"] for r in rows], 0.6, color=PHASE_COLORS[0], label="measured")
    if all("ideal_tokens_per_s" in r for r in rows):
        ax.plot(list(x), [r["ideal_tokens_per_s"] for r in rows], "k--o", lw=0.8, ms=4, label="R x tokens/s of one")
        for i, r in enumerate(rows):
            ax.text(i, r["tokens_per_s"] / 2, f"{r['efficiency']:.2f}", ha="center", va="center", fontsize=8,
                    color="white")
    ax.set_xticks(list(x), [f"{r['replicas']}\n(K={r['callers']})" for r in rows], fontsize=8)
    ax.set_ylim(0, max(max(r.get("ideal_tokens_per_s", r["tokens_per_s"]) for r in rows) * 1.15, 1.0))
    ax.set_xlabel("replicas (callers)")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput by replica count (scaling efficiency in the bars)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")


def _failover_panel(ax: Any, failover: dict[str, Any]) -> None:
    line = failover["timeline"]
    series = line["replica_tokens_per_s"]
    ax.stackplot(line["t_s"], *series, step="post", colors=PHASE_COLORS[:len(series)],
                 labels=[f"replica {i}" for i in range(len(series))])
    for name, style in (("drain", ":"), ("back_ready", "--"), ("first_call_back", "-")):
        t = failover["events_s"].get(name)
        if t is not None:
            ax.axvline(t, color="k", lw=0.8, ls=style, label=name.replace("_", " "))
    phases = failover["phases"]
    ax.set_title(f"replica 0 drains, stops, comes back: {failover['failed']} failed of {failover['requests']} calls\n"
                 f"tokens/s before {phases['before']['tokens_per_s']:.0f}, away {phases['away']['tokens_per_s']:.0f}, "
                 f"after {phases['after']['tokens_per_s']:.0f}", fontsize=9)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the data
    ax.set_xlabel("seconds")
    ax.set_ylabel("tokens/s (stacked by replica)")
    ax.legend(fontsize=7, loc="upper center", ncol=3)


def chart_replicas(result: dict[str, Any], path: Path, plt: Any) -> bool:
    rows, failover = result.get("scaling", []), result.get("failover")
    if not rows:
        return False
    fig, axes = plt.subplots(1, 2 if failover else 1, figsize=(9.5 if failover else 4.5, 3.6), squeeze=False)
    _scaling_panel(axes[0][0], rows)
    if failover:
        _failover_panel(axes[0][1], failover)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def make_charts(report: dict[str, Any], charts: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    charts.mkdir(parents=True, exist_ok=True)
    results = {name: row.get("result") for name, row in report["benchmarks"].items()}
    made = []
    todo = [("launcher_phases.png", lambda p: results.get("launcher") and chart_launcher(results["launcher"], p, plt)),
            ("remote_ratio.png", lambda p: chart_ratio(results.get("endpoint"), results.get("topk"), p, plt)),
            ("topk_wire.png", lambda p: results.get("topk") and chart_topk_wire(results["topk"], p, plt)),
            ("shared_throughput.png", lambda p: results.get("shared") and chart_shared(results["shared"], p, plt)),
            ("failover.png", lambda p: results.get("faults") and chart_faults(results["faults"], p, plt)),
            ("replica_scaling.png", lambda p: results.get("replicas") and chart_replicas(results["replicas"], p, plt))]
    for name, draw in todo:
        if draw(charts / name):
            made.append(str(charts / name))
        else:
            print(f"run_all: no data for {name}; not drawn")
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="every benchmark in its quick mode (seconds each)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="JSON, per-benchmark JSON and logs")
    parser.add_argument("--charts", type=Path, help="where the PNGs go (default: --out)")
    parser.add_argument("--cluster", choices=("slurm", "local", "none"),
                        help="bench_launcher's podium part (default: slurm when reachable, else local; quick: none)")
    parser.add_argument("--repeat", type=int, default=1, help="bench_launcher's repetitions")
    parser.add_argument("--only", help=f"comma-separated, of {', '.join(b.name for b in BENCHMARKS)}")
    parser.add_argument("--faults-json", type=Path, help="a saved bench_faults JSON to chart instead of running it")
    parser.add_argument("--topk-wire-only", action="store_true",
                        help="bench_topk without its model part (the wire chart alone, in minutes)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark may take")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else {b.name for b in BENCHMARKS}
    unknown = only - {b.name for b in BENCHMARKS}
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    mark = os.environ.get(MARK_ENV) or f"run_all-{uuid.uuid4().hex[:12]}"
    report: dict[str, Any] = {
        "quick": args.quick, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "benchmarks": {},
    }
    t0 = time.monotonic()
    for bench in BENCHMARKS:
        if bench.name not in only:
            continue
        plan = bench.plan(args)
        if isinstance(plan, str):
            print(f"run_all: {bench.name}: skipped: {plan}", flush=True)
            row: dict[str, Any] = {"status": "skipped", "reason": plan}
            if bench.name == "faults" and args.faults_json:
                row["result"] = json.loads(args.faults_json.read_text())
            report["benchmarks"][bench.name] = row
            continue
        report["benchmarks"][bench.name] = run_one(bench, plan, out, mark, args.timeout)
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["charts"] = make_charts(report, args.charts or out)
    (out / "run_all.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"run_all: wrote {out / 'run_all.json'} and {len(report['charts'])} chart(s) in {report['seconds']}s")
    bad = [n for n, r in report["benchmarks"].items() if r["status"] == "failed" or r.get("survivors")]
    if bad:
        print(f"run_all: failed or left processes behind: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
