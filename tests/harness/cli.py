"""The ``podium`` CLI run by a test as a user runs it: a subprocess, its output captured.

- :func:`podium`: fails with the command's output when it exits non-zero (unless ``check=False``);
- :func:`podium_cli`: stdin closed and stdout/stderr through pipes, as ``out=$(podium ...)`` does.
"""

from __future__ import annotations

import os
import subprocess
import sys


def podium(*args: str, env: dict | None = None, timeout: float = 240,
           check: bool = True) -> subprocess.CompletedProcess:
    """``podium *args`` as a user runs it; with ``check``, a non-zero exit fails with its output."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "podium.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"podium {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


def podium_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI with its stdout/stderr captured through pipes, as `out=$(podium ...)` does: it must
    return (and its pipes close) although the teachers it started keep running."""
    return subprocess.run([sys.executable, "-m", "podium.cli", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
