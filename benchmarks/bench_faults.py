"""Benchmark: from a fault to the first good answer of the new generation, by phase (prints JSON).

On the real Slurm test cluster (``bash tests/cluster/slurm.sh start`` first), one 2-node teacher
(tiny Llama, the real Megatron group, whole nodes) serves a client loop that checks every answer
against the HF oracle while it suffers, one after the other:

- ``lost_node``: a worker node's processes (its task and its Ray session) SIGKILLed;
- ``preempt_user_signal``: a preemption with the job's ``--signal`` (the cluster's default mode);
- ``preempt_sigterm``: a preemption by plain SIGTERM + GraceTime (the cluster switched for it);
- ``requeue``: ``scontrol requeue`` (Slurm requeues the job itself).

For each: seconds from the fault to the old generation's record saying so (``detection``), to
the new generation's task starting (``slurm_requeue``), its Ray up (``ray``), its model loaded
(``model_load``), its endpoint ready (``endpoint``) and the client's first good answer from it
(``first_answer``); and the client's calls made, retried, failed (goal 0) and wrong (goal 0).

``--quick``: the lost node alone (still a minute or two: a requeue is Slurm's and Ray's time, not
a size). Needs the Slurm test cluster: every fault is Slurm's (a job's node, its preemption, its
requeue), so it has no run without one.

    SLURM_CONF=/tmp/podium-slurm/etc/slurm.conf python benchmarks/bench_faults.py \
        [--faults lost_node,requeue] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "benchmarks")]

from bench_common import add_common_args, emit  # noqa: E402

FAULTS = ("lost_node", "preempt_user_signal", "preempt_sigterm", "requeue")


def _generation(files) -> str:
    data = json.loads(files.endpoint.read_text())
    return f"{data['generation']['job_id']}:{data['generation']['restart']}"


def _next(gen: str) -> str:
    job, restart = gen.split(":")
    return f"{job}:{int(restart) + 1}"


def _first_node(job: str) -> str:
    nodes = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True).stdout.strip()
    return subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True).stdout.split()[0]


def _cause(fault: str, files, job: str, gen: str, scratch: Path) -> float:
    from harness.faults import preempt

    from podium.launcher.common.procs import ProcRef, session_alive

    if fault == "lost_node":
        job_id, restart = gen.split(":")
        worker = json.loads(files.node(job_id, int(restart), 1).read_text())
        victims = [*session_alive(ProcRef.from_dict(worker["ray"])), worker["pid"]]
        t = time.time()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return t
    if fault in ("preempt_user_signal", "preempt_sigterm"):
        t = time.time()
        preempt(_first_node(job), scratch)
        return t
    t = time.time()
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    return t


def measure(fault: str, files, job: str, watcher, client, scratch: Path, timeout_s: float) -> dict:
    from harness.poll import SLOW_POLL_S, wait_for

    gen = _generation(files)
    calls_before, retries_before = len(client.calls), client.retries
    slurm_sh = REPO / "tests" / "cluster" / "slurm.sh"
    if fault == "preempt_sigterm":
        subprocess.run(["bash", str(slurm_sh), "preempt-mode", "sigterm"], check=True, capture_output=True)
    try:
        t_fault = _cause(fault, files, job, gen, scratch)
        nxt = _next(gen)
        t_ready, ready = watcher.wait_for(nxt, "ready", timeout_s)
        wait_for(lambda: client.answered_after(t_ready) >= 1, "a first answer from the new generation",
                 timeout_s=120, interval_s=SLOW_POLL_S)
    finally:
        if fault == "preempt_sigterm":
            subprocess.run(["bash", str(slurm_sh), "preempt-mode", "user-signal"], check=True, capture_output=True)
    old = [data for _, status, g, data in watcher.changes if g == gen and status in ("failed", "draining", "stopped")]
    seen_at = min(t for t, status, g, _ in watcher.changes if g == gen and status in ("failed", "draining", "stopped"))
    old_timings = old[-1]["timings"]
    t = ready["timings"]
    first = min(c.end for c in client.calls[calls_before:] if c.start >= t_ready and c.exception is None)
    ended = old_timings.get("failed") or old_timings.get("stopped") or seen_at
    marks = [old_timings[k] for k in ("fault", "stop_signal") if k in old_timings]  # the head's own stamps
    detected = min(marks) if marks else seen_at
    calls = client.calls[calls_before:]
    return {
        "generation": nxt,
        "outcome": old[-1]["status"],
        "reason": (old[-1].get("reason") or "")[:160],
        "phases_s": {
            "detection": round(detected - t_fault, 2),
            "slurm_requeue": round(t["task_start"] - ended, 2),
            "ray": round(t["ray_ready"] - t["task_start"], 2),
            "model_load": round(t["model_loaded"] - t["ray_ready"], 2),
            "endpoint": round(t["ready"] - t["model_loaded"], 2),
            "first_answer": round(first - t["ready"], 2),
        },
        "fault_to_first_answer_s": round(first - t_fault, 2),
        "calls": len(calls),
        "retried": client.retries - retries_before,
        "failed": sum(1 for c in calls if c.exception),
        "wrong": sum(1 for c in calls if c.error is not None and c.error >= 2e-3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", default=None, help=f"comma-separated, of {', '.join(FAULTS)} (default: all; "
                        "with --quick: lost_node)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a fault may take to heal")
    add_common_args(parser)
    args = parser.parse_args()
    if args.faults is None:
        args.faults = "lost_node" if args.quick else ",".join(FAULTS)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")

    from harness.cli import podium
    from harness.client_loop import ClientLoop
    from harness.faults import RecordWatcher
    from harness.recipes import write_recipe
    from harness.slurm_run import job_ids

    from podium.apps.tiny_models import hf_oracle_logprobs, make_tiny_checkpoint
    from podium.launcher.login.run_dir import known_teachers

    with tempfile.TemporaryDirectory(prefix="podium-bench-faults-") as tmp:
        root = Path(tmp)
        ckpt = make_tiny_checkpoint("llama", root / "ckpt", num_hidden_layers=2)
        recipe = write_recipe(root / "recipe.yaml", {"math": (ckpt, 2)}, slurm={"cpus_per_task": 4},
                              restart={"backoff_s": 1})
        run_dir = root / "run"
        t0 = time.monotonic()
        podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(args.timeout))
        up_s = time.monotonic() - t0
        [(_, files)] = known_teachers(run_dir)
        job = job_ids(run_dir)["math"]
        import numpy as np

        rng = np.random.default_rng(7)
        lengths = np.array([6, 11, 3])
        ids = rng.integers(1, 256, (3, 11))
        data = {"input_ids": ids, "input_lengths": lengths}
        expected = hf_oracle_logprobs(ckpt, ids, lengths).numpy()
        watcher = RecordWatcher(files.endpoint).start()
        client = ClientLoop(run_dir, "math", data, expected).start()
        results: dict = {"up_to_ready_s": round(up_s, 1)}
        try:
            for fault in faults:
                results[fault] = measure(fault, files, job, watcher, client, root, args.timeout)
        finally:
            client.stop()
            watcher.stop()
            podium("down", str(run_dir), check=False)
        emit({"benchmark": "faults", "quick": args.quick, "results": results}, args.json)


if __name__ == "__main__":
    main()
