"""Run a scenario script's cases in forked children of one process that imported torch and megatron-core once.

The shim scenarios run one case per process (a case applies shims, which must not leak into the
next). Importing torch and megatron-core costs ~6 s of CPU per process, most of a case's cost; with
ten cases and their ranks that was over a minute of a 2-core CI machine. Here a parent imports them
once, as podium's worker has before it applies its shims, and forks a child per case (at most
``parallel`` at a time); each child's stdout and stderr go to a file of its own. The parent prints
one JSON line, ``{case: {"returncode": int, "output": str}}``, which :func:`results` reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence

MARK = "forked-cases:"


def import_shared() -> None:
    """What every case imports anyway, and podium's worker before ``apply_cuda_shims``."""
    sys.modules["transformer_engine"] = None  # type: ignore[assignment]  # hidden, as on a CPU-only build
    import torch  # noqa: F401
    from megatron.core import parallel_state  # noqa: F401


def run_each(case: Callable[[str], int], keys: Sequence[str], *, parallel: int = 2,
             timeout_s: float = 300.0) -> None:
    """Fork ``case(key)`` for each key (its exit status: what it returns; 3 if it raises); print the results."""
    import_shared()
    logs = tempfile.mkdtemp(prefix="forked-cases-")
    pending = list(enumerate(keys))
    running: dict[int, str] = {}  # pid: key
    codes: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while pending or running:
        while pending and len(running) < parallel:
            index, key = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(case, key, os.path.join(logs, f"{index}.log"))
            running[pid] = key
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid in running:
            codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)
        elif time.monotonic() > deadline:
            for child in running:
                os.kill(child, signal.SIGKILL)
            for child, key in running.items():
                os.waitpid(child, 0)
                codes[key] = -9
            running.clear()
            for _, key in pending:
                codes[key] = -9
            pending.clear()
        else:
            time.sleep(0.05)
    outputs = {key: _read(os.path.join(logs, f"{i}.log")) for i, key in enumerate(keys)}
    print(MARK + json.dumps({key: {"returncode": codes[key], "output": outputs[key]} for key in keys}))


def _child(case: Callable[[str], int], key: str, path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 3
    try:
        code = case(key)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def results(proc: subprocess.CompletedProcess) -> Mapping[str, subprocess.CompletedProcess]:
    """The cases' results from a finished ``run_each`` script (its stdout); fails with its output if it printed none."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert proc.returncode == 0 and lines, f"the scenario script failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
    data = json.loads(lines[-1][len(MARK):])
    return {key: subprocess.CompletedProcess(proc.args, r["returncode"], r["output"], "") for key, r in data.items()}
