"""The submit claim (``podium.launcher.login.claims``): exactly one process takes over a stale claim,
and a live claimant's claim is never stale.

Races real processes (``multiprocessing``, fork) on a real filesystem (the test's tmp dir): all
start together at a barrier and stay alive until all have tried, so none of them is mistaken for a
dead claimant.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podium.config.spec import TeacherSpec
from podium.launcher.backends import registered
from podium.launcher.backends.slurm.environment import SlurmEnvironment
from podium.launcher.backends.slurm.scheduler import SlurmScheduler
from podium.launcher.common.files import CLAIM_STALE_S, TeacherFiles
from podium.launcher.common.procs import ProcRef
from podium.launcher.common.slurm_state import JobState
from podium.launcher.login import submission
from podium.launcher.login.claims import claim_state, try_claim

RACERS = 24
ROUNDS = 4
FORK = multiprocessing.get_context("fork")


def stale_claim(files: TeacherFiles, number: int) -> None:
    files.claim(number).write_text(json.dumps({"pid": 999999999, "host": "elsewhere", "time": 0}))
    old = time.time() - 10 * CLAIM_STALE_S
    os.utime(files.claim(number), (old, old))


def _try_claim(folder: str, start, done, out) -> None:
    start.wait()
    won = try_claim(TeacherFiles(Path(folder))) is not None
    out.put(won)
    done.wait()  # stay alive (holding, when won) until every racer has tried


def race(target, *args) -> list:
    start, done, out = FORK.Barrier(RACERS), FORK.Barrier(RACERS), FORK.Queue()
    procs = [FORK.Process(target=target, args=(*args, start, done, out)) for _ in range(RACERS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_exactly_one_process_takes_over_a_stale_claim(tmp_path: Path, round_: int) -> None:
    files = TeacherFiles(tmp_path / "t")
    files.folder.mkdir()
    stale_claim(files, round_)
    results = race(_try_claim, str(files.folder))
    assert results.count(True) == 1, results
    assert files.claim_numbers() == [round_ + 1]
    assert claim_state(files, round_ + 1) == "stale"  # its winner has ended by now (same host)


def _ensure(folder: str, log: str, start, done, out) -> None:
    """One `up`: ensure_submitted with a backend whose submissions are lines of ``log``."""
    def submit(spec, files):
        time.sleep(0.2)  # a slow sbatch widens the window
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        return str(os.getpid())

    class FakeSlurm(SlurmScheduler):
        def states(self, records):
            lines = Path(log).read_text().split() if Path(log).exists() else []
            return {r.job_id: JobState(r.job_id, "RUNNING" if r.job_id in lines else "COMPLETED") for r in records}

        def find_live(self, spec, files):
            return []

    submission.submit = submit
    spec = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                       num_nodes=1, gpus_per_node=1)
    start.wait()
    with registered("slurm", FakeSlurm, SlurmEnvironment):
        _, action = submission.ensure_submitted(spec, TeacherFiles(Path(folder)), timeout_s=60)
    out.put(action)
    done.wait()


def test_racing_ups_over_a_stale_claim_submit_once(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path / "t")
    files.folder.mkdir()
    stale_claim(files, 0)
    log = tmp_path / "submissions.log"
    actions = race(_ensure, str(files.folder), str(log))
    assert len(log.read_text().split()) == 1
    assert sorted(actions) == ["reattached"] * (RACERS - 1) + ["submitted"]


def test_a_claim_just_created_has_no_payload_and_is_held(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path)
    files.claim(0).touch()
    assert claim_state(files, 0) == "held" and try_claim(files) is None
    old = time.time() - 10 * CLAIM_STALE_S
    os.utime(files.claim(0), (old, old))
    assert claim_state(files, 0) == "stale"


def test_same_host_claimant_counts_by_pid_and_start_time(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path)
    me = ProcRef.of(os.getpid())
    host = socket.gethostname()
    files.claim(0).write_text(json.dumps({"pid": me.pid, "start": me.start, "host": host, "time": time.time()}))
    assert claim_state(files, 0) == "held"
    # The same PID with another start time: a reused PID, not the claimant.
    files.claim(0).write_text(json.dumps({"pid": me.pid, "start": me.start + 1, "host": host, "time": time.time()}))
    assert claim_state(files, 0) == "stale"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    files.claim(0).write_text(json.dumps({"pid": dead.pid, "start": None, "host": host, "time": time.time()}))
    assert claim_state(files, 0) == "stale"
    # Elsewhere: only age tells.
    files.claim(0).write_text(json.dumps({"pid": dead.pid, "start": None, "host": "other-host", "time": 0}))
    assert claim_state(files, 0) == "held"


def test_a_superseded_number_recreated_late_gives_way(tmp_path: Path) -> None:
    """A process that listed long ago re-creates claim 1 after 1 was superseded by 2 and removed:
    it must see 2 and give way."""
    files = TeacherFiles(tmp_path)
    files.claim(2).write_text(json.dumps({"pid": os.getpid(), "start": ProcRef.of(os.getpid()).start,
                                          "host": socket.gethostname(), "time": time.time()}))
    real = files.claim_numbers
    calls = []

    def listed_long_ago():  # the first listing is from before claim 2 existed
        calls.append(1)
        return [0] if len(calls) == 1 else real()

    object.__setattr__(files, "claim_numbers", listed_long_ago)
    files.claim(0).write_text('{"released": true}')
    assert try_claim(files) is None
    assert sorted(real()) == [0, 2]  # its claim 1 is removed again


def test_release_keeps_the_name_and_the_next_claim_takes_the_next_number(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path)
    first = try_claim(files)
    assert first is not None and first.number == 0 and try_claim(files) is None
    first.release()
    second = try_claim(files)
    assert second is not None and second.number == 1 and files.claim_numbers() == [1]


def test_a_live_same_host_claim_is_never_stale(tmp_path: Path) -> None:
    """A live ``up`` on this host keeps its submit claim however long sbatch takes."""
    files = TeacherFiles(tmp_path)
    me = ProcRef.of(os.getpid())
    files.claim(0).write_text(json.dumps({"pid": me.pid, "start": me.start, "host": socket.gethostname(),
                                          "time": time.time()}))
    old = time.time() - 10 * CLAIM_STALE_S
    os.utime(files.claim(0), (old, old))
    assert claim_state(files, 0) == "held"
