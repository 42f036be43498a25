"""What the fault tests on the Slurm test cluster (and ``benchmarks/bench_faults.py``) share: a
poller of a teacher's endpoint record, a preempting job, a teacher served with a checked client loop
(:mod:`harness.client_loop`) and its comeback after a fault.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fixtures.checkpoints import hf_oracle_logprobs, random_batch

from harness.cli import podium
from harness.client_loop import COMEBACK_S, ClientLoop
from harness.poll import SLOW_POLL_S, wait_for
from harness.recipes import TOL
from harness.slurm_run import job_ids
from podium.launcher.common.files import TeacherFiles
from podium.launcher.login.run_dir import known_teachers


class RecordWatcher:
    """Polls a teacher's endpoint record; keeps every (status, generation) change with the record."""

    def __init__(self, path: Path, poll_s: float = 0.02) -> None:
        self.path = path
        self.poll_s = poll_s
        self.changes: list[tuple[float, str, str, dict]] = []  # (time, status, generation, record)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="record-watcher", daemon=True)

    def start(self) -> RecordWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last: tuple[str, str] | None = None
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

    def ready_after(self, generation: str) -> tuple[float, dict] | None:
        """The first ``ready`` of a generation of the same job after ``generation``."""
        job, restart = generation.split(":")
        for t, st, gen, data in self.changes:
            j, r = gen.split(":")
            if j == job and int(r) > int(restart) and st == "ready":
                return t, data
        return None

    def sequence(self, generation: str) -> list[str]:
        return [status for _, status, gen, _ in self.changes if gen == generation]

    def find(self, generation: str, status: str) -> tuple[float, dict] | None:
        for t, st, gen, data in self.changes:
            if gen == generation and st == status:
                return t, data
        return None

    def wait_for(self, generation: str, status: str, timeout_s: float) -> tuple[float, dict]:
        return wait_for(lambda: self.find(generation, status),
                        f"record {status} of generation {generation} (seen: {self.summary()})",
                        timeout_s=timeout_s, interval_s=0.05)

    def summary(self) -> list[tuple[str, str]]:
        return [(gen, st) for _, st, gen, _ in self.changes]


def preempt(node: str, folder: Path) -> str:
    """A 1-CPU job in ``high`` on ``node``, whose CPUs the teacher holds: Slurm must preempt it."""
    proc = subprocess.run(["sbatch", "--parsable", "-p", "high", "-w", node, "-c", "1", "-J", "podium-test-preemptor",
                           f"--output={folder}/preemptor-%j.out", "--wrap", "sleep 2"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


@dataclass
class Served:
    run_dir: Path
    files: TeacherFiles
    job: str
    watcher: RecordWatcher
    client: ClientLoop

    def generation(self) -> str:
        """The generation that serves now: each fault test starts from a ready teacher, whatever the
        test before it left (a test that failed mid-comeback must not fail the next one too)."""
        def ready() -> str | None:
            data = json.loads(self.files.endpoint.read_text())
            gen = data["generation"]
            return f"{gen['job_id']}:{gen['restart']}" if data.get("status") == "ready" else None
        return wait_for(ready, "a ready generation before the fault", timeout_s=COMEBACK_S, interval_s=SLOW_POLL_S)

    def next_generation(self, gen: str) -> str:
        job, restart = gen.split(":")
        return f"{job}:{int(restart) + 1}"

    def assert_client_clean(self, since: float) -> int:
        calls = [c for c in self.client.calls if c.start >= since]
        failed = [c.exception for c in calls if c.exception]
        assert not failed, f"{len(failed)} of {len(calls)} calls failed: {failed[:3]}"
        worst = max((c.error for c in calls if c.error is not None), default=0.0)
        assert worst < TOL, f"max |error| {worst} vs the HF oracle"
        return len(calls)


def serve_with_client(recipe: Path, run_dir: Path, alias: str, checkpoint: Path, *, up: bool = True,
                      first_answers: bool = True, patience_s: float | None = None) -> Served:
    """Bring ``alias`` up (unless ``up`` is false) and start a checked client loop on it (its calls
    waiting up to ``patience_s`` for a ready generation: the loop's default when None); with
    ``first_answers``, wait for its first two answers."""
    if up:
        podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S))
    [(_, files)] = [(s, f) for s, f in known_teachers(run_dir) if alias in s.aliases and s.replica == 0]
    data = random_batch(256, [6, 11, 3], seed=7)
    expected = hf_oracle_logprobs(checkpoint, data["input_ids"], data["input_lengths"]).numpy()
    served = Served(run_dir, files, job_ids(run_dir)[alias], RecordWatcher(files.endpoint).start(),
                    ClientLoop(run_dir, alias, data, expected,
                               **({} if patience_s is None else {"patience_s": patience_s})).start())
    if first_answers:
        wait_for(lambda: served.client.answered_after(0) >= 2,
                 f"the first answers of {alias} (records seen: {served.watcher.summary()})",
                 timeout_s=COMEBACK_S, interval_s=SLOW_POLL_S)
    return served


def comes_back(served: Served, gen: str) -> dict:
    """Wait for the generation after ``gen`` to be ready and answer; the measured phases."""
    nxt = served.next_generation(gen)
    t_ready, ready = served.watcher.wait_for(nxt, "ready", COMEBACK_S)
    wait_for(lambda: served.client.answered_after(t_ready) >= 2, f"answers from generation {nxt}",
             timeout_s=60, interval_s=SLOW_POLL_S)
    t = ready["timings"]
    return {"generation": nxt, "task_start_to_ready_s": round(t["ready"] - t["task_start"], 1)}
