"""Faults on the real Slurm test cluster, each with a client loop calling all the while: the teacher
heals itself or fails loudly.

One 2-node teacher (whole nodes: 4 CPU slots each, partition ``low``) serves a client loop (every
answer compared with the HF oracle) through, in order:

1. its Ray refusing a driver without the job's token (and the files naming addresses being 0600);
2. a worker node's processes killed (its task and its Ray session, by recorded PID): the record
   says ``failed`` naming the node, the job requeues without that node and serves again;
3. a preemption by plain SIGTERM + GraceTime (the cluster switched to Slurm's default preemption
   mode for the test): the teacher drains, requeues itself and serves again.

Then two 1-node teachers reach a short time limit, one warned by ``--signal=USR2``, one by
``--signal=TERM``: both requeue and serve again. Last, a checkpoint broken under a running teacher
makes exactly ``restart.max_consecutive_failures`` generations fail, then ``failed`` for good with
the error in ``podium status``; fixed, ``podium up`` brings it back.

The client loops see no failed call and no wrong answer. Each test prints what it measured.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from fault_helpers import COMEBACK_S, ClientLoop, RecordWatcher, preempt, wait_until
from fixtures.checkpoints import hf_oracle_logprobs, random_batch
from launcher_helpers import TOL, job_ids, podium, write_recipe
from podium.launcher.files import TeacherFiles
from podium.launcher.procs import ProcRef, session_alive
from podium.launcher.restarts import RestartLedger
from podium.launcher.run_dir import known_teachers
from podium.rendezvous.atomic import file_mode

pytestmark = pytest.mark.slurm


@dataclass
class Served:
    run_dir: Path
    files: TeacherFiles
    job: str
    watcher: RecordWatcher
    client: ClientLoop

    def generation(self) -> str:
        """The generation the record names now."""
        data = json.loads(self.files.endpoint.read_text())
        return f"{data['generation']['job_id']}:{data['generation']['restart']}"

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


def serve_with_client(recipe: Path, run_dir: Path, alias: str, checkpoint: Path, *, up: bool = True) -> Served:
    if up:
        podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S))
    [(_, files)] = [(s, f) for s, f in known_teachers(run_dir) if alias in s.aliases]
    data = random_batch(256, [6, 11, 3], seed=7)
    expected = hf_oracle_logprobs(checkpoint, data["input_ids"], data["input_lengths"]).numpy()
    served = Served(run_dir, files, job_ids(run_dir)[alias], RecordWatcher(files.endpoint).start(),
                    ClientLoop(run_dir, alias, data, expected).start())
    wait_until(lambda: served.client.answered_after(0) >= 2, COMEBACK_S, f"the first answers of {alias}")
    return served


def comes_back(served: Served, gen: str) -> dict:
    """Wait for the generation after ``gen`` to be ready and answer; the measured phases."""
    nxt = served.next_generation(gen)
    t_ready, ready = served.watcher.wait_for(nxt, "ready", COMEBACK_S)
    wait_until(lambda: served.client.answered_after(t_ready) >= 2, 60, f"answers from generation {nxt}")
    t = ready["extra"]["timings"]
    return {"generation": nxt, "task_start_to_ready_s": round(t["ready"] - t["task_start"], 1)}


@pytest.fixture(scope="module")
def two_node(slurm_cluster, tiny_llama_checkpoint: Path, tmp_path_factory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("faults")
    recipe = write_recipe(root / "recipe.yaml", {"math": (tiny_llama_checkpoint, 2)},
                          slurm={"cpus_per_task": slurm_cluster.cpus_per_node}, restart={"backoff_s": 1})
    served = serve_with_client(recipe, root / "run", "math", tiny_llama_checkpoint)
    try:
        yield served
    finally:
        served.client.stop()
        served.watcher.stop()
        podium("down", str(served.run_dir), check=False)


def test_ray_refuses_a_driver_without_the_token(two_node: Served) -> None:
    gen = two_node.generation()
    job, restart = gen.split(":")
    head = json.loads(two_node.files.head(job, int(restart)).read_text())
    token = Path(head["token_path"])
    for path in (token, two_node.files.head(job, int(restart)), two_node.files.node(job, int(restart), 0),
                 two_node.files.node(job, int(restart), 1), two_node.files.endpoint,
                 two_node.files.task_log(job, 0)):
        assert file_mode(path) == 0o600, f"{path} names an address or holds a secret: mode {file_mode(path):o}"
    assert file_mode(two_node.run_dir / "rendezvous.json") == 0o644
    probe = ("import ray, sys\n"
             "try:\n"
             f"    ray.init(address={head['address']!r}, _node_ip_address={head['address'].split(':')[0]!r})\n"
             "except Exception as exc:\n"
             "    print('REFUSED', type(exc).__name__); sys.exit(3)\n"
             "print('JOINED')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    for extra in ({}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}):  # no token, a wrong one
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180,
                             env={**env, "RAY_USAGE_STATS_ENABLED": "0", **extra})
        assert out.returncode == 3 and "REFUSED" in out.stdout, out.stdout + out.stderr[-2000:]
        assert "Authentication token is missing or incorrect" in out.stderr, out.stderr[-2000:]


def test_a_lost_worker_node_is_reported_and_the_teacher_serves_again(two_node: Served, slurm_cluster) -> None:
    t0 = time.time()
    gen = two_node.generation()
    job, restart = gen.split(":")
    worker = json.loads(two_node.files.node(job, int(restart), 1).read_text())
    victims = session_alive(ProcRef.from_dict(worker["ray"])) + [worker["pid"]]
    t_kill = time.time()
    for pid in victims:  # what a node crash does to the processes podium started there
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    t_failed, failed = two_node.watcher.wait_for(gen, "failed", 60)
    host = worker["host"]
    assert f"node {host} (rank 1" in failed["reason"] and "lost" in failed["reason"], failed["reason"]
    assert failed["extra"]["final"] is False and failed["extra"]["will_retry"] is True, failed["extra"]
    measured = comes_back(two_node, gen)
    nodes = slurm_cluster.scontrol_job(job)
    assert host in nodes["ExcNodeList"] and host not in nodes["NodeList"], nodes  # the lost node is avoided
    ledger = RestartLedger.read(two_node.files)
    assert ledger.outcomes[-1].generation == gen and ledger.outcomes[-1].node == host
    calls = two_node.assert_client_clean(t0)
    print(json.dumps({"lost_node": {"kill_to_failed_s": round(t_failed - t_kill, 2), **measured, "calls": calls}}))


def test_sigterm_preemption_requeues_and_serves_again(two_node: Served, slurm_cluster, sigterm_preemption,
                                                      slurm_jobs: list, tmp_path: Path) -> None:
    t0 = time.time()
    gen = two_node.generation()
    node = slurm_cluster.scontrol_job(two_node.job)["NodeList"]
    first = subprocess.run(["scontrol", "show", "hostnames", node], capture_output=True, text=True,
                           check=True).stdout.split()[0]
    t_preempt = time.time()
    slurm_jobs.append(preempt(first, tmp_path))
    t_stopped, stopped = two_node.watcher.wait_for(gen, "stopped", 90)
    assert "preempted" in stopped["reason"] and stopped["extra"]["will_retry"] is True, stopped
    assert "SIGTERM" in stopped["reason"], stopped["reason"]  # no user signal in this mode
    measured = comes_back(two_node, gen)
    assert RestartLedger.read(two_node.files).outcomes[-1].outcome == "preempted"
    calls = two_node.assert_client_clean(t0)
    print(json.dumps({"sigterm_preemption": {"preempt_to_stopped_s": round(t_stopped - t_preempt, 2),
                                             **measured, "calls": calls}}))


def test_time_limit_requeues_with_user_signal_and_with_term(slurm_cluster, tiny_llama_checkpoint: Path,
                                                             tiny_qwen2_checkpoint: Path, tmp_path: Path) -> None:
    """``time: 7 min`` with the signal 280 s ahead: each teacher is warned ~140 s after it starts
    (two teachers starting at once on 2 cores took up to ~150 s to be ready in CI, a first start
    failing under that load and being retried), requeues and serves again as a next generation."""
    recipe = write_recipe(tmp_path / "recipe.yaml", {"usr2": (tiny_llama_checkpoint, 1), "term": (tiny_qwen2_checkpoint, 1)},
                          slurm={"time": "00:07:00", "signal_lead_s": 280},
                          teachers={"usr2": {"slurm": {"signal": "USR2"}}, "term": {"slurm": {"signal": "TERM"}}})
    run_dir = tmp_path / "run"
    served = {}
    try:
        podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S * 2),
               timeout=COMEBACK_S * 2 + 60)
        served["usr2"] = serve_with_client(recipe, run_dir, "usr2", tiny_llama_checkpoint, up=False)
        served["term"] = serve_with_client(recipe, run_dir, "term", tiny_qwen2_checkpoint, up=False)
        measured = {}
        for alias, s in served.items():
            # A generation that served is warned, requeues and the next one serves. Which generation
            # that is depends on the load (a first start may fail and be retried): the ledger says
            # how each ended, the watcher that the next one served.
            def warned() -> object:
                return next((o for o in RestartLedger.read(s.files).outcomes if o.outcome == "time_limit"), None)

            limit = wait_until(warned, COMEBACK_S * 3, f"{alias} reaching its time limit")
            assert "near its time limit" in limit.reason, limit.reason
            t_ready, ready = s.watcher.wait_for(s.next_generation(limit.generation), "ready", COMEBACK_S * 2)
            wait_until(lambda: s.client.answered_after(t_ready) >= 2, COMEBACK_S, f"answers after {limit.generation}")
            measured[alias] = {"generation": s.next_generation(limit.generation), "first_reason": limit.reason,
                               "task_start_to_ready_s": round(ready["extra"]["timings"]["ready"]
                                                              - ready["extra"]["timings"]["task_start"], 1)}
        assert "SIGUSR2" in measured["usr2"]["first_reason"] and "SIGTERM" in measured["term"]["first_reason"]
        for alias, s in served.items():
            measured[alias]["calls"] = s.assert_client_clean(0)
        print(json.dumps({"time_limit": measured}))
    finally:
        for s in served.values():
            s.client.stop()
            s.watcher.stop()
        podium("down", str(run_dir), check=False)


def test_a_broken_checkpoint_fails_for_good_after_max_consecutive_failures(slurm_cluster, slurm_jobs: list,
                                                                          tiny_llama_checkpoint: Path,
                                                                          tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_llama_checkpoint, checkpoint)
    recipe = write_recipe(tmp_path / "recipe.yaml", {"solo": (checkpoint, 1)},
                          restart={"max_consecutive_failures": 2, "backoff_s": 1})
    run_dir = tmp_path / "run"
    podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S))
    job = job_ids(run_dir)["solo"]
    slurm_jobs.append(job)
    weights = checkpoint / "model.safetensors"
    weights.rename(checkpoint / "model.safetensors.moved")  # broken under the running teacher
    try:
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)  # a restart

        def final_failure() -> dict | None:
            (row,) = json.loads(podium("status", str(run_dir), "--json", check=False).stdout)
            return row if row["status"] == "failed" and row["final"] else None

        row = wait_until(final_failure, COMEBACK_S * 2, "the teacher failing for good")
        assert row["restart"]["consecutive_failures"] == 2 and "neither an HF directory" in row["reason"], row
        slurm_cluster.wait_for_state(job, "FAILED", timeout_s=60)
        ledger = RestartLedger.read(TeacherFiles.of(run_dir, "solo", row["key"]))
        failed = [o for o in ledger.outcomes if o.outcome == "failed"]
        assert [o.generation for o in failed] == [f"{job}:1", f"{job}:2"], ledger.outcomes  # exactly 2
        table = podium("status", str(run_dir), check=False, env={"COLUMNS": "400"}).stdout
        assert "final after 2/2 failures" in table, table
    finally:
        (checkpoint / "model.safetensors.moved").rename(weights)
    again = podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S))
    assert "solo: resubmitted job" in again.stdout, again.stdout
    new_job = job_ids(run_dir)["solo"]
    slurm_jobs.append(new_job)
    assert new_job != job
    podium("down", str(run_dir))
