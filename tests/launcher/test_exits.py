"""The one line a dead process's log is reduced to: on ``ray start`` logs captured on this machine
(Ray 2.60), and on the shapes those logs take."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from podium.launcher.job.exits import describe_death, exit_status, first_cause

DATA = Path(__file__).parent / "data" / "ray_start"


@pytest.mark.parametrize(("log", "cause"), [
    # `ray start --num-gpus=x`: click's refusal, after its usage lines
    ("bad_argument.log", "Error: Invalid value for '--num-gpus': 'x' is not a valid integer."),
    # `ray start --object-store-memory=1048576`: INFO lines, then a traceback
    ("object_store_too_small.log", "ValueError: Attempting to cap object store memory usage at 1048576 bytes, "
                                   "but the minimum allowed is 78643200 bytes."),
    # `CUDA_VISIBLE_DEVICES= ray start --num-gpus=2` (a first run on a machine without GPUs)
    ("gpus_not_visible.log",
     "ValueError: Attempting to start raylet with 2 GPU, but CUDA_VISIBLE_DEVICES contains []."),
    # `ray start --head` on 2 cores at load 40: its raylet gave up on the dashboard agent
    ("node_start_timed_out.log",
     "Exception: The current node timed out during startup. This could happen because some of the raylet "
     "failed to startup or the GCS has become overloaded."),
])
def test_first_cause_of_captured_ray_start_logs(log: str, cause: str) -> None:
    assert first_cause((DATA / log).read_text()) == cause


def test_first_cause_shapes() -> None:
    record = "2026-12-02 01:30:48,003\tERROR services.py:1 -- raylet died: port taken\nlater: noise"
    assert first_cause(record) == "2026-12-02 01:30:48,003\tERROR services.py:1 -- raylet died: port taken"
    chained = ("Traceback (most recent call last):\n  File \"a\", line 1\nOSError: the cause\n\nDuring handling"
               " of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n"
               "  File \"b\", line 2\nRuntimeError: what handling it raised\n")
    assert first_cause(chained) == "OSError: the cause"
    assert first_cause("INFO starting\n\x1b[31msegfault somewhere\x1b[0m\n\n") == "segfault somewhere"
    assert first_cause("INFO the word error in a message is not a cause\nlast line") == "last line"
    assert first_cause("") is None
    assert len(first_cause("Error: " + "x" * 1000) or "") == 300


def test_describe_death_of_a_real_process(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    with open(log, "wb") as out:
        code = subprocess.call([sys.executable, "-c", "print('starting'); raise SystemExit('Error: no such file: /x')"],
                               stdout=out, stderr=subprocess.STDOUT)
    line = describe_death("`child`", 42, code, log)
    assert line == f"`child` (pid 42) exited with 1: Error: no such file: /x; log {log}"
    assert exit_status(-9) == "was killed by SIGKILL" and exit_status(None) == "is still running"
    missing = tmp_path / "missing.log"
    assert describe_death("x", 1, 1, missing).endswith(f"its log is empty; log {missing}")
