"""What the fault tests (and ``benchmarks/bench_faults.py``) share: a trainer's client loop that
checks every answer, a poller of a teacher's endpoint record, a preempting job, condition waits.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

COMEBACK_S = 180.0  # requeue + cred_expire + Ray + model load, on a loaded 2-core machine


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(poll_s)


class RecordWatcher:
    """Polls a teacher's endpoint record; keeps every (status, generation) change with the record."""

    def __init__(self, path: Path, poll_s: float = 0.02) -> None:
        self.path = path
        self.poll_s = poll_s
        self.changes: list[tuple[float, str, str, dict]] = []  # (time, status, generation, record)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="record-watcher", daemon=True)

    def start(self) -> "RecordWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last: Optional[tuple[str, str]] = None
        while not self._stop.is_set():
            try:
                data = json.loads(self.path.read_text())
                cur = (data["status"], f"{data['generation']['job_id']}:{data['generation']['restart']}")
            except (OSError, ValueError, KeyError):
                data, cur = None, None
            if data is not None and cur != last:
                self.changes.append((time.time(), cur[0], cur[1], data))
                last = cur
            elif data is not None and self.changes and cur == last:
                self.changes[-1] = (*self.changes[-1][:3], data)  # keep the newest record of a state
            time.sleep(self.poll_s)

    def sequence(self, generation: str) -> list[str]:
        return [status for _, status, gen, _ in self.changes if gen == generation]

    def find(self, generation: str, status: str) -> Optional[tuple[float, dict]]:
        for t, st, gen, data in self.changes:
            if gen == generation and st == status:
                return t, data
        return None

    def wait_for(self, generation: str, status: str, timeout_s: float) -> tuple[float, dict]:
        return wait_until(lambda: self.find(generation, status), timeout_s,
                          f"record {status} of generation {generation} (seen: {self.summary()})", poll_s=0.05)

    def summary(self) -> list[tuple[str, str]]:
        return [(gen, st) for _, st, gen, _ in self.changes]


@dataclass
class Call:
    start: float
    end: float
    error: Optional[float] = None  # max |logprob - oracle|
    exception: Optional[str] = None


class ClientLoop:
    """A trainer's view: one client, ``get_logprobs`` in a loop, every answer checked."""

    def __init__(self, run_dir: Path, alias: str, data: dict, expected: np.ndarray) -> None:
        self.run_dir, self.alias, self.data, self.expected = run_dir, alias, data, expected
        self.calls: list[Call] = []
        self.retries = 0  # requests the client sent again (the teacher was restarting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="client-loop", daemon=True)

    def start(self) -> "ClientLoop":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the client loop did not end"

    def _run(self) -> None:
        import podium.client as pc

        with pc.connect(self.run_dir / "rendezvous.json", ready_timeout_s=COMEBACK_S + 60) as client:
            while not self._stop.is_set():
                t0 = time.time()
                try:
                    got = np.asarray(client.get_logprobs(self.alias, self.data)["logprobs"])
                    self.calls.append(Call(t0, time.time(), error=float(np.abs(got - self.expected).max())))
                except Exception as exc:  # recorded, asserted on by the test
                    self.calls.append(Call(t0, time.time(), exception=f"{type(exc).__name__}: {exc}"))
                self.retries = client.teacher(self.alias).retries

    def answered_after(self, t: float) -> int:
        return sum(1 for c in self.calls if c.start > t and c.exception is None)

    def waited(self, t0: float, t1: float, threshold_s: float = 1.0) -> list[Call]:
        """Calls that started in [t0, t1) and took longer than ``threshold_s``."""
        return [c for c in self.calls if t0 <= c.start < t1 and c.end - c.start > threshold_s]


def preempt(node: str, folder: Path) -> str:
    """A 1-CPU job in ``high`` on ``node``, whose CPUs the teacher holds: Slurm must preempt it."""
    proc = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", node, "-c", "1", "-J", "podium-test-preemptor",
                           f"--output={folder}/preemptor-%j.out", "--wrap", "sleep 2"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


