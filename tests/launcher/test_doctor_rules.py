"""The doctor's pure rules, on the kinds of clusters the test cluster is not: sinfo rows with GPU
gres, drained nodes, a time limit; a test job whose file this machine cannot read back (a run dir
off the shared filesystem), and a node without podium. The Slurm checks themselves run on the
real cluster (tests/integration/test_doctor.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from podium.launcher.login.doctor.base import FAIL, PASS
from podium.launcher.login.doctor.partitions import (
    PartitionNeed,
    gres_gpus,
    judge_partition,
    parse_sinfo_nodes,
)
from podium.launcher.login.doctor.probe import PROBE_MARK
from podium.launcher.login.doctor.probe_job import _judge_probe
from podium.launcher.login.sbatch_errors import REFUSALS

# sinfo -h -N -o '%N|%P|%a|%t|%G|%l' of a GPU cluster (the forms Slurm 22.05 prints)
GPU_SINFO = """\
gpu001|batch*|up|idle|gpu:a100:8(S:0-1)|4:00:00
gpu002|batch*|up|mix|gpu:a100:8(S:0-1)|4:00:00
gpu003|batch*|up|drain*|gpu:a100:8(S:0-1)|4:00:00
cpu001|cpu|up|idle|(null)|1-00:00:00
"""
FIX = {r.kind: r.fix for r in REFUSALS}


def need(partition, nodes=1, gpus=0, time="01:00:00", minutes=60) -> PartitionNeed:
    return PartitionNeed(partition, nodes, gpus, minutes, time, ("math",))


def test_sinfo_rows_and_gres() -> None:
    rows = parse_sinfo_nodes(GPU_SINFO)
    assert [(r.node, r.partition, r.default, r.state, r.usable) for r in rows[:3]] == [
        ("gpu001", "batch", True, "idle", True), ("gpu002", "batch", True, "mix", True),
        ("gpu003", "batch", True, "drain", False)]
    assert [gres_gpus(g) for g in ("gpu:a100:8(S:0-1)", "gpu:2,nic:1", "(null)", "gpu")] == [8, 2, 0, 1]


def test_partition_rules() -> None:
    rows = parse_sinfo_nodes(GPU_SINFO)
    assert judge_partition(need(None, nodes=2, gpus=8), rows).state == PASS  # the default: batch
    drained = judge_partition(need("batch", nodes=3), rows)  # gpu003 is drained
    assert drained.state == FAIL and "2 usable node(s) of 3" in drained.detail and drained.fix == FIX["node_count"]
    no_gpus = judge_partition(need("cpu", gpus=4), rows)
    assert no_gpus.state == FAIL and "gres gpu:4" in no_gpus.detail and no_gpus.fix == FIX["gres"]
    too_long = judge_partition(need("batch", time="08:00:00", minutes=480), rows)
    assert too_long.state == FAIL and "above the partition's limit 4:00:00" in too_long.detail
    assert too_long.fix == FIX["time"]
    missing = judge_partition(need("gpu"), rows)
    assert missing.state == FAIL and "partitions: batch, cpu" in missing.detail and missing.fix == FIX["partition"]


def _report(tmp_path: Path, **changes) -> tuple[str, Path]:
    import podium

    out = tmp_path / "probe.json"
    report = {"token": "t0k", "host": "n7", "python": sys.executable, "version": list(sys.version_info[:3]),
              "podium": {"file": podium.__file__, "version": podium.__version__}, "checks": [], **changes}
    return PROBE_MARK + json.dumps(report) + "\n", out


def test_a_run_dir_the_login_node_cannot_read_back_fails(tmp_path: Path) -> None:
    stdout, out = _report(tmp_path)  # the node wrote its file where this machine does not see it
    rows = {r.name: r for r in _judge_probe(0, stdout, "", out, "in partition 'low'", ())}
    assert rows["run dir"].state == FAIL and "this machine cannot read it" in rows["run dir"].detail
    assert "filesystem that every compute node mounts" in rows["run dir"].fix
    out.write_text(json.dumps({"token": "t0k"}))
    assert _judge_probe(0, stdout, "", out, "here", ())[1].state == PASS


def test_a_node_without_podium_fails_and_names_the_settings(tmp_path: Path) -> None:
    stdout, out = _report(tmp_path, import_error="ModuleNotFoundError: No module named 'podium'")
    out.write_text(json.dumps({"token": "t0k"}))
    rows = {r.name: r for r in _judge_probe(0, stdout, "", out, "here", ())}
    assert rows["podium"].state == FAIL and "No module named 'podium'" in rows["podium"].detail
    assert "podium.slurm.python" in rows["podium"].fix
    assert rows["ports"].state == "skip"
