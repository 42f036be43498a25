"""Every benchmark ends what it started: ``benchmarks/run_all.py --quick`` runs each benchmark in its
quick mode as a subprocess tagged with a mark of this test's (``PODIUM_BENCH_MARK``, inherited by
every process a benchmark starts: Ray's daemons and workers, the client process, whatever session
or parent they end up with), and no process carrying the mark may outlive it. The same run writes
run_all's JSON and charts.

Not run here: ``bench_faults`` (Slurm's faults, minutes even in its quick mode; the fault tests
cover its teacher's lifecycle) and ``gpu_check`` (without CUDA it starts nothing: its dry run is
``tests/benchmarks/test_gpu_check.py``'s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

ROOT = Path(__file__).resolve().parents[2]
# One of each way a benchmark starts processes: Ray as podium starts it (launcher's floor), a client
# process and servers (topk's transport), a Megatron group on the test Ray cluster (shared; endpoint
# and teacher_group start theirs the same way, with the same teardown, and are left to keep CI short),
# in-process replicas behind one client (replicas: its failover must cost no call).
RUN = ["launcher", "topk", "shared", "replicas"]
LEFT_WAIT_S = 60.0


def _common():
    spec = importlib.util.spec_from_file_location("bench_common", ROOT / "benchmarks" / "bench_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_mark_finds_an_orphan_in_a_session_of_its_own():
    """What the quick test relies on: a marked process that left its parent's session and was
    re-parented is still found."""
    common = _common()
    mark = f"probe-{uuid.uuid4().hex[:12]}"
    # the orphan must hold none of our pipes: they are read to their end
    out = subprocess.run([sys.executable, "-c", "import subprocess; p = subprocess.Popen(['sleep', '600'], "
                          "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
                          "stderr=subprocess.DEVNULL); print(p.pid)"],
                         env={**os.environ, common.MARK_ENV: mark}, capture_output=True, text=True, check=True)
    orphan = int(out.stdout)
    try:
        assert [pid for pid, _ in common.marked(mark)] == [orphan]
    finally:
        os.kill(orphan, 9)
    assert common.wait_unmarked(mark, LEFT_WAIT_S) == []


def test_every_quick_benchmark_ends_what_it_started(tmp_path):
    common = _common()
    mark = f"quick-{uuid.uuid4().hex[:12]}"
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--out", str(out),
                           "--only", ",".join(RUN)], env={**os.environ, common.MARK_ENV: mark},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=840)  # < pytest's 900 s
    left = common.wait_unmarked(mark, LEFT_WAIT_S)
    if left:
        common.kill_marked(mark)
    assert not left, f"processes started by the quick benchmarks outlive them: {left}"
    report = json.loads((out / "run_all.json").read_text())
    rows = report["benchmarks"]
    for name in RUN:
        row = rows[name]
        assert row["status"] == "ok", f"{name}: {row.get('reason')}\n{row.get('log_tail', '')}"
        assert row["survivors"] == [], f"{name} left {row['survivors']} running"
        assert "--quick" in row["command"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    floor = rows["launcher"]["result"]["ray_floor"]
    assert len(floor["alone"]) == 1 and len(floor["two_at_once"][0]) == 2
    replicas = rows["replicas"]["result"]
    assert [r["replicas"] for r in replicas["scaling"]] == [1, 2, 4]
    assert all(r["failed_all"] == 0 and min(r["calls_per_replica"]) > 0 for r in replicas["scaling"]), replicas
    assert replicas["failover"]["failed"] == 0 and replicas["failover"]["calls_on_returned_replica"] > 0, replicas
    topk = rows["topk"]["result"]
    assert set(topk["wire"]) and set(topk["callers"]["rows"]) == {"1", "2"} and topk["request"]["ratio"] > 0, topk
    for chart in ("launcher_phases.png", "topk_wire.png", "shared_throughput.png", "replica_scaling.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
