"""Rank 0's run of one generation: Ray head, driver, group and endpoint; how it ended; what comes next.

:func:`run_head` is rank 0's whole task around its :class:`~podium.launcher.job.node_run.NodeRun`:

- :class:`HeadRun` starts the Ray head, writes ``head.json`` (once the GCS port answers), waits
  until Ray counts every node (a node task that reports a failed start, or a head ``ray start``
  that dies, ends the wait at once naming the node and its log), builds the teacher group and
  serves it, watched by the :class:`~podium.launcher.job.watchdog.Watchdog`;
- :func:`end_generation` says how the generation ended (a stop, a fault, a failure) and what comes
  next per the restart policy (:mod:`podium.launcher.common.restarts`), and publishes it through the
  :class:`~podium.launcher.job.lifecycle.TeacherLifecycle` (the endpoint record's one publisher)
  before the group and the driver go down, so trainers learn of a fault at once;
- :func:`request_next` asks the job environment for the next generation when the decision says so.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.launcher.backends.base import REQUEUED_BY_SCHEDULER
from podium.launcher.common import procs
from podium.launcher.common.node_files import HeadFile, NodeStatus, try_read_node_state, write_head
from podium.launcher.common.ray_ports import RayStartError, node_ip
from podium.launcher.common.restarts import Decision, Outcome, RestartLedger, decide, excluded_after
from podium.launcher.job.lifecycle import TeacherLifecycle
from podium.launcher.job.node_run import MissingPackagesError, NodeRun, NodeStartError, RayLaunch
from podium.launcher.job.ray_bootstrap import RayNodeProcess, use_ray_env, write_auth_token
from podium.launcher.job.watchdog import Watchdog, WatchedNode, watched_nodes
from podium.poll import PollTimeout, poll_until
from podium.rendezvous.records import Status

logger = logging.getLogger(__name__)

NODES_POLL_S = 0.1  # the head counts Ray's nodes this often while they join
REQUEUE_REFUSED_WAIT_S = 600.0  # requeue refused: stay (Slurm ends and requeues a preempted job)
# A stop's outcome by the stop's kind (any other kind: "stopped").
STOP_OUTCOMES: dict[str, Outcome] = {"preempt": "preempted", "signal": "preempted", "time_limit": "time_limit"}


@dataclass(frozen=True)
class Ending:
    """How a generation ended, as published: what comes next, and the ledger it was decided on."""

    decision: Decision
    ledger: RestartLedger


def run_head(node: NodeRun) -> Ending:
    """Rank 0's task: prepare the node, run the head, publish how it ended, tear down."""
    lifecycle = TeacherLifecycle(node.spec, node.files, node.ctx.generation, node.signals)
    error: BaseException | None = None
    ending: Ending | None = None
    try:
        ending = HeadRun(node, node.prepare(), lifecycle).run()
    except BaseException as exc:
        error = exc
        node.failed(exc)
    if ending is None:  # failed before the head could start
        ending = end_generation(node, lifecycle, error)
    node.teardown()
    return ending


def end_generation(node: NodeRun, lifecycle: TeacherLifecycle, error: BaseException | None) -> Ending:
    """How this generation ended, per the restart policy, published; the decision."""
    intent = node.signals.intent()
    host: str | None = None
    outcome: Outcome
    if lifecycle.fault is not None:
        outcome, (reason, host) = "failed", lifecycle.fault
    elif intent is not None and (intent.requeue or intent.kind in STOP_OUTCOMES or error is None
                                 or isinstance(error, (KeyboardInterrupt, SystemExit))):
        # A stop: a failure while being preempted still brings the job back, and one at the time
        # limit is that time limit's (the restart policy decides), not a failure.
        outcome = STOP_OUTCOMES.get(intent.kind, "stopped")
        reason = node.signals.describe()
    elif error is not None:
        outcome, reason, host = "failed", f"{type(error).__name__}: {error}", getattr(error, "node", None)
    else:
        outcome, reason = "stopped", "ended"
    settings = node.spec.launcher.restart
    ledger = RestartLedger.read(node.files).ended(str(node.ctx.generation), outcome, reason, host)
    if outcome == "failed":
        ledger = excluded_after(ledger, host, settings)
    if isinstance(error, MissingPackagesError) and outcome == "failed":
        decision = Decision(False, True, 0.0, "final: no requeue installs a package")
    else:
        decision = decide(ledger, outcome, settings, can_requeue=node.job_env.requeues)
    try:
        ledger.write(node.files)
    except OSError as exc:
        logger.error("could not write %s: %s", node.files.restarts, exc)
    # Slurm requeuing the job itself: podium asks for nothing, but the teacher does come back
    comes_back = decision.requeue or (intent is not None and intent.kind == REQUEUED_BY_SCHEDULER)
    lifecycle.end(outcome, reason, decision, ledger, comes_back=comes_back)
    return Ending(decision, ledger)


def request_next(node: NodeRun, ending: Ending) -> int:
    """After the teardown: ask for the next generation when the decision says so. Returns the
    task's exit code (non-zero when the teacher failed for good).

    If a requeue is refused, the task stays until Slurm ends it: a task that ends by itself inside
    a preemption's grace time ends its job, and Slurm does not requeue a job that ended.
    """
    decision, ctx = ending.decision, node.ctx
    if not decision.requeue:
        return 1 if decision.final else 0
    logger.warning("requeueing job %s: generation %s ends, %s:%d comes next (%s)", ctx.job_id,
                   ctx.generation, ctx.job_id, ctx.restart + 1, decision.why)
    # The requeue signals this very task at once (Slurm ends the step): the nodes to avoid and
    # the backoff, set right after it, must not be cut off by that signal or by a handler a
    # library (Ray's, after ray.shutdown) left behind.
    with procs.stop_signals_blocked():
        refused = node.job_env.requeue(ctx, exclude=ending.ledger.excluded_nodes, delay_s=decision.delay_s)
    if refused is None:
        logger.info("job %s requeued", ctx.job_id)
        return 0
    logger.error("requeue of job %s refused: %s", ctx.job_id, refused)
    if not node.signals.urgent.wait(REQUEUE_REFUSED_WAIT_S):
        logger.error("Slurm did not end the job within %.0fs of the refused requeue; exiting",
                     REQUEUE_REFUSED_WAIT_S)
    return 1


class HeadRun:
    """Rank 0's role on its prepared node: Ray head, driver, group and endpoint of this generation."""

    def __init__(self, node: NodeRun, launch: RayLaunch, lifecycle: TeacherLifecycle) -> None:
        self.node, self.launch, self.lifecycle = node, launch, lifecycle
        self.spec, self.files, self.ctx, self.signals = node.spec, node.files, node.ctx, node.signals
        self.nodes_timeout_s = self.spec.launcher.ray.nodes_timeout_s
        self.ray_proc: RayNodeProcess | None = None
        self.token_path: Path | None = None
        self.group: Any = None
        self.joined: list[WatchedNode] = []

    def run(self) -> Ending:
        """Start and serve until a stop or a failure; publish how it ended (before the group and
        the driver go down, so trainers learn of a fault at once)."""
        error: BaseException | None = None
        try:
            if not self.signals.stop.is_set():
                self.lifecycle.publish(Status.STARTING)
                self._start()
            if not self.signals.stop.is_set():
                self._serve()
        except BaseException as exc:
            error = exc
            self.node.failed(exc)
        try:
            return end_generation(self.node, self.lifecycle, error)
        finally:
            self._disconnect()

    def _start(self) -> None:
        job_id, restart = self.ctx.job_id, self.ctx.restart
        self.files.generation_dir(job_id, restart).mkdir(parents=True, exist_ok=True)
        self.token_path = write_auth_token(self.files.ray_token(job_id, restart))
        ray_proc = self.ray_proc = self.node.start_ray(self.launch, token_path=self.token_path)
        if ray_proc is None:  # a stop came first
            return
        assert self.node.launch is not None
        self.launch = self.node.launch  # its ports are another block's when a port was taken under Ray
        ports, ip = self.launch.ports, self.launch.ip
        address = f"{ip}:{ports.gcs}"
        self.lifecycle.stamp("ray_started")
        # Only a head that runs is announced: a worker never joins a try of the head's `ray start`
        # that is then ended and started again (NodeRun.start_ray).
        write_head(self.files.head(job_id, restart),
                   HeadFile(address=address, generation=str(self.ctx.generation), host=self.ctx.host,
                            ports=ports.to_dict(), token_path=str(self.token_path), time=time.time()))
        self.node.state.write(NodeStatus.STARTED)
        use_ray_env(os.environ, token_path=self.token_path)  # before `import ray`: Ray reads it once
        import ray

        # ray.init installs its own SIGTERM handler (exit 1): keep stop signals pending until ours
        # are back, so a signal in between reaches them instead of Ray's.
        with procs.stop_signals_blocked():
            try:
                ray.init(address=address, _node_ip_address=ip, logging_level=logging.WARNING, log_to_driver=True)
            except Exception:
                if not ray_proc.alive():  # it died under the driver: its log says why, not ray.init's timeout
                    raise RayStartError(ray_proc.describe_exit()) from None
                raise
            self.signals.install()
        self._wait_nodes(ray, ray_proc)
        self.lifecycle.stamp("ray_ready")
        if self.signals.stop.is_set():
            return
        self.lifecycle.publish(Status.LOADING)
        from podium.teacher.compute.group import GroupOptions, TeacherWorkerGroup

        # The group's torch.distributed rendezvous takes the port this node's block reserves for
        # it (checked free on all addresses, outside Ray's ports): chosen explicitly too.
        port = ports.torch_master
        self.group = TeacherWorkerGroup(self.spec, GroupOptions(master_port_range=(port, port),
                                                                stuck_after_s=self.spec.launcher.server.stuck_after_s))
        self.signals.install()  # in case the group's libraries installed handlers of their own
        self.lifecycle.stamp("model_loaded")
        # Ready means served once: a forward at the largest shape on every rank, watched, before
        # any trainer is told to call (a lazy collective init that hangs, an out-of-memory).
        self.group.warm_up()
        self.lifecycle.stamp("warmed_up")

    def _wait_nodes(self, ray: Any, ray_proc: RayNodeProcess) -> None:
        """Until Ray counts every node of the job (or a stop); NodeStartError at once when a node
        task reports a failed start or the head's ``ray start`` died, or after ``nodes_timeout_s``."""
        files, ctx = self.files, self.ctx
        alive: list[dict] = []

        def joined() -> bool | None:
            nonlocal alive
            if self.signals.stop.is_set():
                return True
            alive = [n for n in ray.nodes() if n.get("Alive")]
            if len(alive) >= ctx.num_nodes:
                logger.info("all %d Ray nodes joined: %s", ctx.num_nodes,
                            ", ".join(n.get("NodeManagerAddress", "?") for n in alive))
                states = (try_read_node_state(files.node(ctx.job_id, ctx.restart, rank))
                          for rank in range(ctx.num_nodes))
                self.joined = watched_nodes(alive, [s for s in states if s is not None], ctx.host)
                return True
            for rank in range(1, ctx.num_nodes):
                state = try_read_node_state(files.node(ctx.job_id, ctx.restart, rank))
                if state is not None and state.state is NodeStatus.FAILED:
                    raise NodeStartError(f"node {state.host} (rank {rank}) failed at start: "
                                         f"{state.error}; log {state.log}", node=state.host)
            if not ray_proc.alive():
                raise NodeStartError(f"head node {ctx.host}: {ray_proc.describe_exit()}")
            return None

        try:
            poll_until(joined, timeout_s=self.nodes_timeout_s, interval_s=NODES_POLL_S,
                       what=f"{ctx.num_nodes} Ray nodes")
        except PollTimeout:
            raise NodeStartError(
                f"only {len(alive)} of {ctx.num_nodes} Ray nodes joined within {self.nodes_timeout_s:.0f}s; "
                f"node states in {files.generation_dir(ctx.job_id, ctx.restart)}") from None

    def _serve(self) -> None:
        from podium.rendezvous.layout import RunLayout
        from podium.rendezvous.token import read_token

        interface = self.spec.launcher.server.interface
        host = node_ip(interface) if interface else self.launch.ip
        token = read_token(RunLayout(self.files.run_dir).auth_token_path)
        ray_proc = self.ray_proc

        def head_alive() -> str | None:
            """None while the head's own ``ray start`` runs, else how it exited."""
            return None if ray_proc is None or ray_proc.alive() else ray_proc.describe_exit()

        watchdog = Watchdog(files=self.files, job_id=self.ctx.job_id, restart=self.ctx.restart, nodes=self.joined,
                            group=self.group, on_fault=self.lifecycle.fault_found, head_alive=head_alive)

        def on_ready(url: str) -> None:
            self.node.state.write(NodeStatus.SERVING, url=url)
            try:
                RestartLedger.read(self.files).ready().write(self.files)
            except OSError as exc:
                logger.warning("could not reset the failure count in %s: %s", self.files.restarts, exc)
            watchdog.start()
            logger.info("teacher %r ready at %s", self.spec.display, url)

        try:
            self.lifecycle.serve(self.group, host=host, token=token, on_ready=on_ready)
        finally:
            watchdog.stop()

    def _disconnect(self) -> None:
        """Group down and the driver out of Ray (before Ray itself is ended: a driver whose raylet
        dies under it is exited by Ray's core worker)."""
        if self.group is not None:
            try:
                self.group.shutdown()
            except Exception:
                logger.exception("group shutdown failed")
            self.group = None
        try:
            ray = sys.modules.get("ray")
            if ray is not None and ray.is_initialized():
                ray.shutdown()
        except Exception:
            logger.exception("ray.shutdown failed")
        self.signals.install()  # Ray's exit-on-SIGTERM handler must not end the task's last steps
        try:
            self.node.state.write(NodeStatus.STOPPED)
        except OSError as exc:
            logger.warning("could not write %s: %s", self.node.state.path, exc)
