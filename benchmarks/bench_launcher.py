"""Launcher benchmark on the Slurm test cluster (prints JSON).

For the 2-teacher recipe (a 2-node and a 1-node teacher over tiny checkpoints): time from ``up``
to all ready, split per teacher into slurm (submit -> node task running), ray (task start -> all
Ray nodes joined, driver connected), model (group built) and endpoint (group -> ready published),
from the timings each teacher's head writes into its endpoint record. In the same run, the floor:
a bare ``ray start --head`` then one ``ray start --address`` on two emulated nodes (127.0.0.11 and
.12), one after the other; those daemons are ended by PID (found by their private temp dir).

    SLURM_CONF=/tmp/podium-slurm/etc/slurm.conf python benchmarks/bench_launcher.py [--repeat N]
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
sys.path.insert(0, str(REPO / "tests"))


def ray_floor(port: int = 35000) -> dict[str, float]:
    from podium.launcher.ray_bootstrap import ray_env, ray_executable

    tmp = Path(tempfile.mkdtemp(prefix="pbf", dir="/tmp"))
    common = ["--disable-usage-stats", f"--temp-dir={tmp}", "--num-cpus=1",
              "--object-store-memory=104857600"]
    env = ray_env()
    t0 = time.monotonic()
    subprocess.run([*ray_executable(), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.11",
                    f"--node-manager-port={port + 1}", f"--object-manager-port={port + 2}",
                    f"--metrics-export-port={port + 3}", f"--dashboard-agent-grpc-port={port + 4}",
                    f"--dashboard-agent-listen-port={port + 5}", f"--runtime-env-agent-port={port + 6}",
                    f"--ray-client-server-port={port + 7}", "--include-dashboard=false",
                    f"--min-worker-port={port + 20}", f"--max-worker-port={port + 40}", *common],
                   check=True, capture_output=True, env=env)
    t_head = time.monotonic() - t0
    q = port + 50
    subprocess.run([*ray_executable(), "start", f"--address=127.0.0.11:{port}", "--node-ip-address=127.0.0.12",
                    f"--node-manager-port={q + 1}", f"--object-manager-port={q + 2}",
                    f"--metrics-export-port={q + 3}", f"--dashboard-agent-grpc-port={q + 4}",
                    f"--dashboard-agent-listen-port={q + 5}", f"--runtime-env-agent-port={q + 6}",
                    f"--min-worker-port={q + 20}", f"--max-worker-port={q + 40}", *common],
                   check=True, capture_output=True, env=env)
    total = time.monotonic() - t0
    # End exactly the daemons these two commands started: they all carry our private temp dir.
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(tmp).encode() in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGTERM)
            except (OSError, ProcessLookupError):
                pass
    return {"head_s": round(t_head, 2), "head_plus_worker_s": round(total, 2)}


def podium_run(root: Path) -> dict:
    from fixtures.checkpoints import make_tiny_checkpoint

    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from test_launcher_slurm import write_recipe  # the integration tests' recipe

    llama = make_tiny_checkpoint("llama", root / "llama")
    qwen = make_tiny_checkpoint("qwen2", root / "qwen2")
    recipe = write_recipe(root / "recipe.yaml", {"math": (llama, 2), "code": (llama, 2), "chat": (qwen, 1)})
    run_dir = root / "run"
    env = {**os.environ}
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "podium.cli", "up", str(recipe), "--run-dir", str(run_dir),
                    "--wait", "--timeout", "300"], check=True, capture_output=True, env=env)
    total = time.time() - t0
    out = subprocess.run([sys.executable, "-m", "podium.cli", "status", str(run_dir), "--json"],
                         capture_output=True, text=True, env=env)
    teachers = {}
    for row in json.loads(out.stdout):
        t = row["timings"]
        teachers[row["name"]] = {
            "slurm_s": round(t["task_start"] - row["submitted_at"], 2),
            "ray_s": round(t["ray_ready"] - t["task_start"], 2),
            "ray_gcs_up_s": round(t["gcs_up"] - t["task_start"], 2),
            "model_s": round(t["model_loaded"] - t["ray_ready"], 2),
            "endpoint_s": round(t["endpoint_ready"] - t["model_loaded"], 2),
        }
    subprocess.run([sys.executable, "-m", "podium.cli", "down", str(run_dir)], capture_output=True, env=env)
    return {"up_to_all_ready_s": round(total, 2), "teachers": teachers,
            "group": "podium.teacher.group:TeacherWorkerGroup"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    runs = []
    floors = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="podium-bench-") as tmp:
            runs.append(podium_run(Path(tmp)))
        floors.append(ray_floor())
    print(json.dumps({"benchmark": "launcher", "podium": runs, "ray_floor": floors}, indent=2))


if __name__ == "__main__":
    main()
