"""submitit on the real Slurm test cluster: multi-node jobs, accounting, and preemption.

These are the Slurm behaviours the launcher is built on: a job spans several emulated nodes with
distinct hostnames, ``sacct`` reports its end, and a multi-node job in ``low`` is requeued under
the same job id (``SLURM_RESTART_COUNT`` + 1) when a job in ``high`` needs one of its nodes.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import submitit
from fixtures.slurm_cluster import SlurmCluster, base_state

# pytest imports this file under a name the jobs cannot import; ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slurm


def rank_and_host() -> tuple[int, str]:
    """Runs in the job: which task am I, on which node."""
    return submitit.JobEnvironment().global_rank, socket.gethostname()


def test_two_node_job_sees_two_hosts(slurm_cluster: SlurmCluster, slurm_scratch: Path, slurm_jobs: list[Any]) -> None:
    ex = slurm_cluster.executor(slurm_scratch / "submitit" / "%j", nodes=2, tasks_per_node=1)
    job = ex.submit(rank_and_host)
    slurm_jobs.append(job)

    slurm_cluster.wait_submitit(job, timeout_s=60)
    results = job.results()

    ranks = sorted(rank for rank, _ in results)
    hosts = {host for _, host in results}
    assert ranks == [0, 1], results
    assert len(hosts) == 2, f"both tasks ran on one host: {results}"
    assert hosts <= set(slurm_cluster.nodes), results
    row = slurm_cluster.wait_for_state(job.job_id, "COMPLETED", timeout_s=30)
    assert row["Partition"] == "low"
    assert row["ExitCode"] == "0:0"


def hold_nodes_until_preempted(marks: Path) -> tuple[str, int, int, str]:
    """Runs in every task of the ``low`` job.

    First run: say "started" and sleep until Slurm preempts the job (submitit's USR2 handler on
    rank 0 requeues it). After the requeue: return at once.
    """
    env = submitit.JobEnvironment()
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    # Written after submitit installed its signal handlers: a signal now is handled, not fatal.
    (marks / f"{env.job_id}-run{restarts}-rank{env.global_rank}").write_text(socket.gethostname())
    if restarts == 0:
        time.sleep(600)
    return env.job_id, restarts, env.global_rank, socket.gethostname()


def test_high_job_preempts_and_requeues_low_job(
    slurm_cluster: SlurmCluster, slurm_scratch: Path, slurm_jobs: list[Any]
) -> None:
    """A 2-node ``low`` job holding every CPU of its nodes; a 1-CPU ``high`` job on one of them.

    Two whole nodes, not the whole cluster: the test then also runs while other jobs use the
    other nodes, and the requeue still spans several nodes, as a teacher allocation does.
    """
    marks = slurm_scratch / "marks"
    marks.mkdir()
    n_nodes = 2
    low = slurm_cluster.executor(
        slurm_scratch / "low" / "%j",
        slurm_partition=slurm_cluster.preemptable_partition,
        nodes=n_nodes,
        tasks_per_node=1,
        cpus_per_task=slurm_cluster.cpus_per_node,  # every CPU slot of its nodes
    )
    low_job = low.submit(hold_nodes_until_preempted, marks)
    slurm_jobs.append(low_job)

    # Preempt only once every task runs under submitit's handlers (USR2 would otherwise kill it).
    deadline = time.monotonic() + 45
    while len(list(marks.glob(f"{low_job.job_id}-run0-rank*"))) < n_nodes:
        assert time.monotonic() < deadline, (
            f"low job {low_job.job_id} did not start on {n_nodes} nodes within 45 s: "
            f"{slurm_cluster.sacct(low_job.job_id)}; queue: {slurm_cluster.squeue()}"
        )
        time.sleep(0.1)
    low_host = (marks / f"{low_job.job_id}-run0-rank0").read_text()

    high = slurm_cluster.executor(
        slurm_scratch / "high" / "%j",
        slurm_partition=slurm_cluster.preempting_partition,
        slurm_nodelist=low_host,  # no free CPU there: only preempting the low job makes room
        nodes=1,
    )
    high_job = high.submit(socket.gethostname)
    slurm_jobs.append(high_job)

    slurm_cluster.wait_submitit(high_job, timeout_s=60)
    assert high_job.result() == low_host
    slurm_cluster.wait_submitit(low_job, timeout_s=60)
    results = low_job.results()

    assert {r[0] for r in results} == {low_job.job_id}, f"requeued under another job id: {results}"
    assert [r[1] for r in results] == [1] * n_nodes, f"expected SLURM_RESTART_COUNT=1 everywhere: {results}"
    assert sorted(r[2] for r in results) == list(range(n_nodes))
    assert slurm_cluster.scontrol_job(low_job.job_id)["Restarts"] == "1"
    assert "this job is preempted" in low_job.stderr(), "rank 0 did not see the preemption signal"

    slurm_cluster.wait_for_state(high_job.job_id, "COMPLETED", timeout_s=30)
    slurm_cluster.wait_for_state(low_job.job_id, "COMPLETED", timeout_s=30)
    runs = [base_state(r["State"]) for r in slurm_cluster.sacct(low_job.job_id, duplicates=True) if r["Partition"]]
    assert runs[0] in {"REQUEUED", "PREEMPTED"} and runs[-1] == "COMPLETED", runs
