"""Faults on the real Slurm test cluster, each with a client loop calling all the while: the teacher
heals itself or fails loudly.

One 2-node teacher (whole nodes: 4 CPU slots each, partition ``low``) serves a client loop (every
answer compared with the HF oracle) through, in order:

1. its Ray refusing a driver without the job's token (and the files naming addresses being 0600);
2. a worker node's processes killed (its task and its Ray session, by recorded PID): the record
   says ``failed`` naming the node, the job requeues without that node and serves again;
3. a preemption by plain SIGTERM + GraceTime (the cluster switched to Slurm's default preemption
   mode for the test): the teacher drains, requeues itself and serves again;
4. the teacher worker on its second node frozen (SIGSTOP: alive, silent, its node and Ray well):
   the group's watch finds the stuck call, the record says ``failed`` naming the frozen rank, the
   job requeues and serves again.

Time limits and a broken checkpoint, each with teachers of their own, are in
``test_faults_restarts.py`` (a module of its own, so this one's teacher is down before they start).

The client loop sees no failed call and no wrong answer. Each test prints what it measured.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.cli import podium
from harness.faults import Served, comes_back, preempt, serve_with_client
from harness.recipes import write_recipe

from podium.launcher.common.procs import ProcRef, session_alive
from podium.launcher.common.restarts import RestartLedger
from podium.launcher.job.watchdog import CAUSE_WAIT_S
from podium.rendezvous.atomic import file_mode

pytestmark = pytest.mark.slurm

STUCK_AFTER_S = 30.0  # the teacher's server.stuck_after_s: well above a tiny forward at CI's load


@pytest.fixture(scope="module")
def two_node(slurm_cluster, tiny_llama_checkpoint: Path, tmp_path_factory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("faults")
    recipe = write_recipe(root / "recipe.yaml", {"math": (tiny_llama_checkpoint, 2)},
                          slurm={"cpus_per_task": slurm_cluster.cpus_per_node}, restart={"backoff_s": 1},
                          server={"stuck_after_s": STUCK_AFTER_S})
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
    # The node task first: a crash leaves it no moment to report its Ray's death as its own failure
    # (killed last, it once did, and the head reported "task failed", not "lost").
    victims = [worker["pid"], *session_alive(ProcRef.from_dict(worker["ray"]))]
    t_kill = time.time()
    for pid in victims:  # what a node crash does to the processes podium started there
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    t_failed, failed = two_node.watcher.wait_for(gen, "failed", 60)
    host = worker["host"]
    assert f"node {host} (rank 1" in failed["reason"] and "lost" in failed["reason"], failed["reason"]
    assert failed["final"] is False and failed["will_retry"] is True, failed
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
    assert "preempted" in stopped["reason"] and stopped["will_retry"] is True, stopped
    assert "SIGTERM" in stopped["reason"], stopped["reason"]  # no user signal in this mode
    measured = comes_back(two_node, gen)
    assert RestartLedger.read(two_node.files).outcomes[-1].outcome == "preempted"
    calls = two_node.assert_client_clean(t0)
    print(json.dumps({"sigterm_preemption": {"preempt_to_stopped_s": round(t_stopped - t_preempt, 2),
                                             **measured, "calls": calls}}))


def test_a_frozen_worker_is_found_by_the_watch_and_the_teacher_serves_again(two_node: Served) -> None:
    """The teacher worker on the second node stops (SIGSTOP: the process, its node task and its Ray
    all alive, as a rank stuck in a collective or on a lost GPU looks): the call in flight makes no
    progress, the watch fails it within about twice ``server.stuck_after_s`` (its 503 is retried by
    the client), the record says ``failed`` naming the frozen rank, and the next generation serves.
    The client loop sees no failed call and no wrong answer."""
    import psutil

    t0 = time.time()
    gen = two_node.generation()
    job, restart = gen.split(":")
    node = json.loads(two_node.files.node(job, int(restart), 1).read_text())
    workers = [pid for pid in session_alive(ProcRef.from_dict(node["ray"]))
               if "TeacherWorker" in " ".join(psutil.Process(pid).cmdline())]
    assert workers, f"no teacher worker in the Ray session of {node['host']}"
    t_stop = time.time()
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    # found once the call in flight went STUCK_AFTER_S without progress, and the watchdog's wait for
    # a lost node's cause (CAUSE_WAIT_S) passed: the stop-to-failed time is printed, not asserted
    t_failed, failed = two_node.watcher.wait_for(gen, "failed", 2 * STUCK_AFTER_S + CAUSE_WAIT_S + 60)
    reason = failed["reason"]
    print(reason)
    assert "stuck call: no progress for" in reason and "(frozen?)" in reason, reason
    assert any(f"pid {pid}) has not finished micro-batch" in reason for pid in workers), reason
    assert failed["final"] is False and failed["will_retry"] is True, failed
    measured = comes_back(two_node, gen)
    for pid in workers:  # the frozen process was ended with its generation (SIGKILL reaches a stopped one)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    calls = two_node.assert_client_clean(t0)
    print(json.dumps({"frozen_worker": {"stop_to_failed_s": round(t_failed - t_stop, 2), **measured,
                                        "calls": calls}}))
