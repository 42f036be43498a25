"""What every benchmark shares: ``--quick`` / ``--json PATH``, the fixed allocator, and finding the
processes a run left behind.

A benchmark run is tagged by :data:`MARK_ENV` in its environment (``run_all.py`` and the quick
test set it to a value of their own). Every process it starts inherits the variable (Ray's
daemons and workers, submitit's controller, a Slurm job's tasks with ``--export=ALL``), wherever it
is re-parented or whatever session it makes, so :func:`marked` finds them all by reading
``/proc/<pid>/environ``, by PID, never by name.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# glibc never returns memory to the OS between calls (no mmap'd chunks, no trim): timings measure
# compute, not page faults. One place: every benchmark that times a model re-executes under it.
ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
MARK_ENV = "PODIUM_BENCH_MARK"


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition: seconds, for tests")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the result to PATH")


def emit(result: dict[str, Any], json_path: Path | None) -> None:
    """Print the result as JSON on stdout and, with ``--json PATH``, write it there too."""
    text = json.dumps(result, indent=2) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text)


def reexec_with_allocator(extra: dict[str, str] | None = None) -> None:
    """Run this script again under :data:`ALLOCATOR_ENV` (and ``extra``) unless it already is."""
    wanted = {**ALLOCATOR_ENV, **(extra or {})}
    if any(os.environ.get(k) != v for k, v in wanted.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **wanted})


def marked(mark: str, exclude: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """``(pid, command line)`` of every live process (zombies excluded) whose environment has
    ``MARK_ENV=mark`` or ``MARK_ENV=mark/...`` (``run_all.py`` tags each benchmark below its own
    mark), except this process and ``exclude``."""
    needle = f"{MARK_ENV}={mark}".encode()
    skip = {os.getpid(), *exclude}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if not any(e == needle or e.startswith(needle + b"/") for e in f.read().split(b"\0")):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # ended meanwhile, or not ours to read
        found.append((int(name), cmd[:300]))
    return found


def wait_unmarked(mark: str, timeout_s: float, exclude: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """Wait until no process carries ``mark`` (processes being reaped take a moment); returns
    those still alive after ``timeout_s`` (empty: none survived)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = marked(mark, exclude)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def kill_marked(mark: str) -> None:
    """SIGKILL what a failed benchmark left behind (they carry our mark: ours, by PID)."""
    for pid, _ in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
