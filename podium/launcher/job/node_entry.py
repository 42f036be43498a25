"""The job entry that runs on every node of a teacher job (one task per node).

``python -m podium.launcher.job.node_entry TEACHER_DIR`` is what every task of a teacher job runs (the
sbatch script's ``srun``, or submitit's local controller). The cluster kind's job environment
(:class:`~podium.launcher.backends.base.JobEnvironment`) says where the task is (rank, node count,
generation) and requeues the job; this module installs the signal handlers, reads the task's settings and
dispatches on the rank (:mod:`podium.launcher.job.node_run` is every node's part, and a worker rank's
role; :mod:`podium.launcher.job.head_run` rank 0's):

- rank 0 starts the Ray head, writes the head address file of this generation (atomic, once its
  ``ray start`` says the node runs: a try that missed one of Ray's fixed start limits is ended and
  started again first, on any rank, :meth:`~podium.launcher.job.node_run.NodeRun.start_ray`), waits
  until Ray counts all nodes (by condition, within ``ray.nodes_timeout_s``; a node task that reports
  a failed start, or a head that dies, ends the wait at once with the node's name and log), then
  builds the teacher group and serves it; its :class:`~podium.launcher.job.lifecycle.TeacherLifecycle`
  is the one publisher of the endpoint record;
- the other ranks wait for that head file and start a Ray worker node that joins it.

Generation = (Slurm job id, ``SLURM_RESTART_COUNT``). Every task records itself in
``nodes/<job>-<restart>/<rank>.json`` (host, PID and start time, its ``ray start`` session, its
Ray temp dir), and sweeps the temp dirs ended generations of this teacher left on its node
(:mod:`podium.launcher.common.cleanup`).

Stopping. Slurm signals every process of the step; only this task reacts (the Ray tree runs with
the stop signals blocked, :mod:`podium.launcher.common.procs`), and a signal that arrives before the
handlers are installed waits, blocked, until they are (the shim in front of the interpreter and
this module block them before anything is imported). What a stop means (a preemption, a time
limit, a cancel, Slurm's own requeue) is asked of the job environment once (:mod:`podium.launcher.job.signals`):
a preemption or a time limit drains (the record goes ``draining``, new requests get 503, queued
ones finish) for as long as Slurm's end time allows, then rank 0 requeues the job itself, with
plain SIGTERM as with a user signal (a job that ends inside its grace time is not requeued by
Slurm); a cancel or Slurm's own requeue tears down at once. If a requeue is refused, the task
stays until Slurm ends it.

Failing. While serving, the head's :class:`~podium.launcher.job.watchdog.Watchdog` watches every node
and the group; a fault, or a failed start on any node, ends the generation as ``failed`` with the
node and the cause, and the restart policy (:mod:`podium.launcher.common.restarts`) requeues it after a
backoff, avoiding a lost node, or gives up after ``restart.max_consecutive_failures`` failures in
a row (the task then exits non-zero and the job ends FAILED).

A task Slurm signalled (or whose head requeued the job) leaves with ``os._exit`` once torn down:
interpreter finalizers (torch, Ray) can outlast ``KillWait``, and a job is requeued only once its
tasks have ended. Worker ranks end their Ray only once the head has finished draining (or after a
bound), so queued requests keep their workers. Never ``ray stop``, never pkill: only the processes
this task started, by recorded ID.

Fault injection for tests: ``PODIUM_FAULTS`` (:mod:`podium.faults`).
"""

from __future__ import annotations

import signal

if __name__ == "__main__":  # before any other import: a stop signal now must wait for our handlers
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2))

import logging
import os
import sys
import time
from pathlib import Path

from podium.config.spec import TeacherSpec
from podium.faults import faults
from podium.fds import raise_nofile_limit
from podium.launcher.backends import environment_for
from podium.launcher.common import procs
from podium.launcher.common.files import TeacherFiles
from podium.launcher.job.head_run import request_next, run_head
from podium.launcher.job.node_run import NodeRun
from podium.launcher.job.signals import Signals

logger = logging.getLogger(__name__)


def _log_setup() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_node(teacher_dir: str) -> None:
    """The entry on every node (see the module docstring)."""
    _log_setup()
    injected = faults()
    if injected.delay_start_s > 0:  # fault injection: a stop signal now finds no handler of ours yet
        logger.warning("%s: waiting before installing the signal handlers", injected.injected("delay_start_s"))
        time.sleep(injected.delay_start_s)
    signals = Signals()
    signals.install()
    procs.unblock_stop_signals()  # a signal that came before now is delivered to the handler here
    procs.set_child_subreaper()
    raise_nofile_limit()  # before Ray starts: its processes and the endpoint inherit the limit
    files = TeacherFiles(Path(teacher_dir))
    spec = TeacherSpec.read(files.spec)
    environment = environment_for(spec.launcher.cluster)
    ctx = environment.node_context()
    signals.set_classifier(lambda name: environment.stop_intent(ctx, name, spec), spec.launcher.server.drain_s)
    node = NodeRun(spec, files, environment, ctx, signals, injected)
    logger.info("teacher %r (%s) node %s rank %d/%d generation %s", spec.display, spec.key, ctx.host,
                ctx.rank, ctx.num_nodes, ctx.generation)
    requeued = False
    if ctx.rank == 0:
        ending = run_head(node)
        requeued = ending.decision.requeue
        code = request_next(node, ending)
    else:
        node.run_worker()  # raises what made it fail: the head decides what comes next
        code = 0
    if environment.exit_fast_after_signal and (signals.received or requeued):
        # Slurm is ending this task (a requeue, a cancel, a preemption) and SIGKILLs it KillWait
        # seconds after its SIGTERM: the teardown is done, so leave now rather than through the
        # interpreter's exit (torch's and Ray's finalizers sometimes outlast KillWait, and the job
        # stays COMPLETING, so not requeued, until they end).
        _exit_now(code)
    if code:
        raise SystemExit(code)


def _exit_now(code: int) -> None:
    logger.info("exiting (%d)", code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """``python -m podium.launcher.job.node_entry TEACHER_DIR`` (what a rendered sbatch script runs)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m podium.launcher.job.node_entry TEACHER_DIR")
    run_node(args[0])


if __name__ == "__main__":
    main()
