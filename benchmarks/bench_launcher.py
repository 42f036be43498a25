"""Launcher benchmark: time from ``up`` to all ready, by phase per teacher, and Ray's floor (prints JSON).

For the 2-teacher recipe (aliases math and code share a tiny Llama, chat has a tiny Qwen2): time
from ``podium up`` to all ready, split per teacher into ``submit`` (submit -> node task running:
Slurm's queue, or submitit's local controller), ``ray`` (task start -> all Ray nodes joined,
driver connected), ``model`` (group built) and ``endpoint`` (group -> ready published), from the
timings each teacher's head writes into its endpoint record. On Slurm (the test cluster) the Llama
teacher has 2 nodes and the Qwen2 one 1; ``cluster: local`` runs one node per teacher.

The floor, in the same run: what ``ray start`` alone costs, started as podium starts it
(:class:`podium.launcher.job.ray_bootstrap.RayNodeProcess`: ``ray start --block`` in a session of
its own, ports by bind test, a per-node temp dir, token auth) and ended as podium ends it (every
member of that session, by PID): a head, then a worker joining it, on two loopback addresses.
Measured twice: ``alone``, and ``two_at_once`` (two floors started together), since the teachers'
Ray phase is two teachers starting at once on the same cores: that is the floor to compare it with.
The floor stops at "Ray runtime started." on both nodes; the teachers' Ray phase also imports
podium and connects the driver.

    python benchmarks/bench_launcher.py [--cluster slurm|local|none] [--repeat N] [--quick] [--json PATH]

``--cluster slurm`` (the default without ``--quick``) needs the Slurm test cluster
(``SLURM_CONF=/tmp/podium-slurm/etc/slurm.conf``); ``--quick`` measures the floor only (one
repetition) unless ``--cluster`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

from bench_common import add_common_args, emit  # noqa: E402

# Two floors at once need two pairs of "nodes"; podium's own test recipes take the same port range
# (below the kernel's ephemeral range; every port is checked free by binding it first).
FLOOR_NODES = (("127.0.0.11", "127.0.0.12"), ("127.0.0.13", "127.0.0.14"))
FLOOR_PORTS = (24000, 32767)
START_TIMEOUT_S = 180.0


def ray_floor(ips: tuple[str, str], tag: str) -> dict[str, float]:
    """Seconds to a running Ray head, then to a worker node joined to it (podium's start and stop)."""
    from podium.launcher.common.ray_ports import choose_ports
    from podium.launcher.job.ray_bootstrap import RayNodeProcess, start_command, write_auth_token

    tmp = Path(tempfile.mkdtemp(prefix="pbf", dir="/tmp"))  # short: Ray's socket paths
    token = write_auth_token(tmp / "token")
    nodes: list[RayNodeProcess] = []
    try:
        t0 = time.monotonic()
        ports = choose_ports(FLOOR_PORTS, tag, 0, 0)
        nodes.append(RayNodeProcess(start_command(head=True, ip=ips[0], ports=ports, temp=tmp / "0", num_cpus=1,
                                                  object_store_memory_mb=100), tmp / "head.log", token))
        nodes[0].wait_started(START_TIMEOUT_S)
        t_head = time.monotonic() - t0
        worker_ports = choose_ports(FLOOR_PORTS, tag, 0, 1)
        nodes.append(RayNodeProcess(start_command(head=False, ip=ips[1], ports=worker_ports, temp=tmp / "1",
                                                  num_cpus=1, head_address=f"{ips[0]}:{ports.gcs}",
                                                  object_store_memory_mb=100), tmp / "worker.log", token))
        nodes[1].wait_started(START_TIMEOUT_S)
        total = time.monotonic() - t0
    finally:
        survivors = [pid for node in reversed(nodes) for pid in node.stop()]
        shutil.rmtree(tmp, ignore_errors=True)
    if survivors:
        raise RuntimeError(f"Ray floor {tag}: processes {survivors} survive their session's SIGKILL")
    return {"head_s": round(t_head, 2), "head_plus_worker_s": round(total, 2)}


def floors_at_once(count: int, tag: str) -> list[dict[str, float]]:
    """``count`` floors started together (threads: each waits on its own ``ray start``)."""
    results: list[Any] = [None] * count

    def one(i: int) -> None:
        try:
            results[i] = ray_floor(FLOOR_NODES[i], f"{tag}-{i}")
        except BaseException as exc:  # re-raised below, after every floor has ended its Ray
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def _podium(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "podium.cli", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def podium_run(root: Path, cluster: str, timeout_s: float) -> dict[str, Any]:
    import yaml
    from harness.recipes import write_recipe  # the integration tests' recipe

    from podium.apps.tiny_models import make_tiny_checkpoint

    llama = make_tiny_checkpoint("llama", root / "llama")
    qwen = make_tiny_checkpoint("qwen2", root / "qwen2")
    llama_nodes = 2 if cluster == "slurm" else 1  # the local executor runs one node
    recipe = write_recipe(root / "recipe.yaml", {"math": (llama, llama_nodes), "code": (llama, llama_nodes),
                                                 "chat": (qwen, 1)})
    if cluster != "slurm":
        data = yaml.safe_load(recipe.read_text())
        data["podium"]["cluster"] = cluster
        recipe.write_text(yaml.safe_dump(data))
    run_dir = root / "run"
    t0 = time.time()
    try:
        up = _podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(int(timeout_s)),
                     timeout=timeout_s + 120)
        total = time.time() - t0
        if up.returncode != 0:
            raise RuntimeError(f"podium up exited {up.returncode}: {up.stderr[-2000:]}")
        status = _podium("status", str(run_dir), "--json", timeout=120)
        rows = json.loads(status.stdout)
    finally:
        down = _podium("down", str(run_dir), timeout=300)
        if down.returncode != 0:
            print(f"bench_launcher: podium down exited {down.returncode}: {down.stderr[-1000:]}", file=sys.stderr)
    teachers = {}
    for row in rows:
        t = row["timings"]
        teachers[row["name"]] = {
            "nodes": llama_nodes if row["name"] != "chat" else 1,
            "submit_s": round(t["task_start"] - row["submitted_at"], 2),
            "ray_s": round(t["ray_ready"] - t["task_start"], 2),
            "ray_started_s": round(t["ray_started"] - t["task_start"], 2),
            "model_s": round(t["model_loaded"] - t["ray_ready"], 2),
            "endpoint_s": round(t["ready"] - t["model_loaded"], 2),
        }
    return {"cluster": cluster, "up_to_all_ready_s": round(total, 2), "teachers": teachers}


def slurm_reachable() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", choices=("slurm", "local", "none"),
                        help="where podium's part runs (default: slurm; with --quick: none, the floor only)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions (default 3; 1 with --quick)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds `up --wait` may take")
    add_common_args(parser)
    args = parser.parse_args(argv)
    cluster = args.cluster or ("none" if args.quick else "slurm")
    repeat = args.repeat or (1 if args.quick else 3)
    if cluster == "slurm" and not slurm_reachable():
        parser.error("--cluster slurm: Slurm does not answer (`sinfo` failed); start the test cluster and set "
                     "SLURM_CONF, or use --cluster local")
    tag = f"floor-{os.getpid()}"
    runs, alone, together = [], [], []
    for i in range(repeat):
        if cluster != "none":
            with tempfile.TemporaryDirectory(prefix="podium-bench-") as tmp:
                runs.append(podium_run(Path(tmp), cluster, args.timeout))
        alone.append(ray_floor(FLOOR_NODES[0], f"{tag}-{i}"))
        together.append(floors_at_once(2, f"{tag}-{i}-pair"))
    emit({"benchmark": "launcher", "quick": args.quick, "cpus": os.cpu_count(), "podium": runs,
          "ray_floor": {"alone": alone, "two_at_once": together}}, args.json)


if __name__ == "__main__":
    main()
