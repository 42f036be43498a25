"""Slurm inside the job: where a node task runs, how its job is requeued, what a stop signal means.

Every answer comes from Slurm itself: the task's variables (``SLURM_JOB_ID``, ``SLURM_NODEID``,
``SLURM_JOB_NUM_NODES``, those submitit's ``SlurmJobEnvironment`` reads: the node task needs no
submitit), ``SLURM_RESTART_COUNT`` (the generation), ``SLURM_CPUS_PER_TASK`` (the task's CPUs),
``scontrol requeue``/``update`` (the next generation) and ``scontrol show job`` (what a stop is:
:meth:`SlurmEnvironment.stop_intent`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Sequence

from podium.config.spec import TeacherSpec
from podium.launcher.backends.base import REQUEUED_BY_SCHEDULER, JobEnvironment, NodeContext, StopIntent, host_name
from podium.launcher.common.slurm_state import show_job, slurm_time

logger = logging.getLogger(__name__)

REQUEUE_TIMEOUT_S = 30.0
SIGNALING_WAIT_S = 5.0  # how long a stop waits for Slurm to deliver the signal it is sending
STOP_MARGIN_S = 8.0  # a drain ends this long before Slurm's end time: teardown and requeue fit
TIME_LIMIT_SLACK_S = 30.0  # a TERM this close to (lead before) the end time is the time limit's


class SlurmEnvironment(JobEnvironment):
    name = "slurm"
    requeues = True
    exit_fast_after_signal = True

    def node_context(self) -> NodeContext:
        env = os.environ
        return NodeContext(job_id=env["SLURM_JOB_ID"], rank=int(env.get("SLURM_NODEID") or 0),
                           num_nodes=int(env.get("SLURM_JOB_NUM_NODES") or 1),
                           restart=int(env.get("SLURM_RESTART_COUNT") or 0), host=host_name())

    def node_cpus(self, spec: TeacherSpec) -> int:
        """The CPUs Slurm gave the task (``SLURM_CPUS_PER_TASK``), else the recipe's count."""
        return int(os.environ.get("SLURM_CPUS_PER_TASK") or spec.cpus_per_task)

    def requeue(self, ctx: NodeContext, *, exclude: Sequence[str] = (), delay_s: float = 0.0) -> str | None:
        """``scontrol requeue``, then (best effort: a site may refuse it) the nodes to avoid and the
        earliest start of the next generation, which Slurm accepts once the job is requeued."""
        refused = _scontrol(["requeue", ctx.job_id])
        if refused is not None:
            return refused
        update = []
        if exclude:
            update.append(f"ExcNodeList={','.join(exclude)}")
        if delay_s > 0:
            update.append(f"StartTime=now+{round(delay_s)}")
        if update:
            problem = _scontrol(["update", f"JobId={ctx.job_id}", *update])
            if problem is not None:
                logger.warning("job %s requeued, but %s was refused: %s", ctx.job_id, " ".join(update), problem)
        return None

    def stop_intent(self, ctx: NodeContext, signal_name: str, spec: TeacherSpec) -> StopIntent:
        """Classify a stop by asking Slurm what it is doing to the job (measured on Slurm 22.05):

        - ``Restarts`` above this generation's: Slurm requeues it itself (``scontrol requeue``);
        - ``PreemptTime`` set: preempted; ``EndTime`` is the end of the grace time;
        - SIGTERM within ``signal_lead_s`` of ``EndTime``: the time limit (``--signal=TERM@lead``),
          which requeues only with ``restart.at_time_limit: requeue``;
        - a user signal: ``--signal`` at the time limit or a preemption with ``preempt_send_user_signal``;
        - any other SIGTERM/SIGINT: a cancel (``scancel``; KillWait's SIGKILL follows).

        The job is read once Slurm has delivered the signal (:func:`_settled_job`): while it is
        sending one, its state reads SIGNALING, and a time limit looked like a cancel.
        """
        info = _settled_job(ctx.job_id)
        now = time.time()
        end = slurm_time(info.get("EndTime"))
        # what the decision is made of, for the job's log: a stop read wrongly ends a teacher for good
        logger.info("%s: JobState=%s Restarts=%s (this generation's %d) PreemptTime=%s EndTime=%s (%s)", signal_name,
                    info.get("JobState"), info.get("Restarts"), ctx.restart, info.get("PreemptTime"),
                    info.get("EndTime"), "unknown" if end is None else f"in {end - now:.0f}s")
        until = (end - STOP_MARGIN_S) if end is not None else now
        if int(info.get("Restarts") or 0) > ctx.restart:
            return StopIntent(REQUEUED_BY_SCHEDULER, False, now, "requeued by Slurm")
        if slurm_time(info.get("PreemptTime")) is not None:
            return StopIntent("preempt", True, until, "preempted")
        near_end = end is not None and end - now <= spec.launcher.slurm.signal_lead_s + TIME_LIMIT_SLACK_S
        # A time limit requeues only when the recipe asks (restart.at_time_limit: requeue)
        at_limit = spec.launcher.restart.at_time_limit == "requeue"
        if signal_name in ("SIGUSR1", "SIGUSR2"):
            drain_until = min(until, now + spec.launcher.server.drain_s)
            if near_end:
                return StopIntent("time_limit", at_limit, drain_until, "near its time limit")
            return StopIntent("signal", True, drain_until, "asked to stop by --signal")
        if signal_name == "SIGTERM" and near_end and info.get("JobState") == "RUNNING":
            return StopIntent("time_limit", at_limit, until, "near its time limit")
        return StopIntent("cancel", False, now, "stopped by Slurm")


def _settled_job(job_id: str, wait_s: float | None = None, poll_s: float = 0.25) -> dict[str, str]:
    """``scontrol show job`` once Slurm has delivered the signal it is sending.

    While an outgoing signal is pending, Slurm shows ``JobState=SIGNALING`` in place of the job's
    state (its state string prefers that flag to the base state), so a stop read at that moment
    cannot tell a time limit's TERM (the job is RUNNING) from a cancel. It clears once the signal is
    delivered: ask again, up to ``wait_s``; after that, SIGNALING counts as RUNNING."""
    wait_s = SIGNALING_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    info = show_job(job_id)
    while info.get("JobState") == "SIGNALING" and time.monotonic() < deadline:
        time.sleep(poll_s)
        info = show_job(job_id)
    if info.get("JobState") == "SIGNALING":
        logger.warning("job %s still SIGNALING after %.0fs: read as RUNNING", job_id, wait_s)
        info = {**info, "JobState": "RUNNING"}
    return info


def _scontrol(args: list[str]) -> str | None:
    """Run ``scontrol ARGS``; None on success, else what it said."""
    try:
        proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=REQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode == 0:
        return None
    return proc.stderr.strip() or f"scontrol {args[0]} exited {proc.returncode}"
