"""One node task of one generation: its Ray node, the worker ranks' whole run, and the teardown.

:class:`NodeRun` is what every rank does around its role: record itself (``<rank>.json``,
:mod:`podium.launcher.common.node_files`), sweep what ended generations left on the node, choose the
address, ports and temp dir of its Ray node (:class:`RayLaunch`), start ``ray start`` and, at the
end, stop it by its session and remove the temp dir. A worker rank's role is here too
(:meth:`NodeRun.run_worker`): wait for the head's address, join its Ray, watch it until a stop,
then keep it until the head has drained. Rank 0's role is :mod:`podium.launcher.job.head_run`.
"""

from __future__ import annotations

import logging
import shutil
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path

from podium.config.spec import TeacherSpec
from podium.faults import Faults
from podium.launcher.backends import JobEnvironment, NodeContext
from podium.launcher.common import procs
from podium.launcher.common.cleanup import sweep_temp_dirs
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.node_files import HeadFile, NodeStateWriter, NodeStatus, try_read_head, try_read_node_state
from podium.launcher.common.packages import TEACHER_INSTALL, TEACHER_PACKAGES, missing_message, missing_modules
from podium.launcher.common.ray_ports import LOCK_DIR_NAME, PortClaim, RayPorts, RayStartError, claim_ports
from podium.launcher.job.ray_bootstrap import RayNodeProcess, private_temp_root, start_command, temp_dir
from podium.launcher.job.signals import Signals
from podium.poll import PollTimeout, poll_until

logger = logging.getLogger(__name__)

HEAD_FILE_POLL_S = 0.05  # a worker rank looks for the head's address this often
HEAD_DONE_POLL_S = 0.1  # a stopping worker rank looks at the head's state this often
RAY_CHECK_S = 0.5  # a worker rank checks its own `ray start` this often while it runs
URGENT_HEAD_WAIT_S = 3.0  # worker ranks on SIGTERM: how long they leave their Ray to the head


class NodeStartError(RuntimeError):
    """A node of the job could not start or join; the message names the node and its log."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node  # the host at fault, when it is another node


class MissingPackagesError(NodeStartError):
    """This node's Python lacks a package the teacher imports: no requeue brings it, so the teacher
    fails for good at once (:func:`podium.launcher.job.head_run.end_generation`)."""


def check_teacher_packages(host: str) -> None:
    """:class:`MissingPackagesError` naming the node, this Python and what it cannot import of
    what a teacher's node task imports, with the command that installs it."""
    missing = missing_modules(TEACHER_PACKAGES)
    if missing:
        raise MissingPackagesError(f"node {host}: " + missing_message(missing, TEACHER_PACKAGES, TEACHER_INSTALL))


@dataclass(frozen=True)
class RayLaunch:
    """What this node's ``ray start`` runs with (the head's or a worker's)."""

    ip: str
    ports: RayPorts
    temp: Path
    num_cpus: int
    num_gpus: int
    object_store_memory_mb: int | None
    extra_args: tuple[str, ...] = ()  # fault injection (tests): appended as they are

    def command(self, head_address: str | None = None) -> list[str]:
        """The head's command without ``head_address``, a worker's joining it with one."""
        cmd = start_command(head=head_address is None, head_address=head_address, ip=self.ip, ports=self.ports,
                            temp=self.temp, num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                            object_store_memory_mb=self.object_store_memory_mb)
        return cmd + list(self.extra_args)


class NodeRun:
    """One node task of one generation: its record, its Ray node, its teardown."""

    def __init__(self, spec: TeacherSpec, files: TeacherFiles, job_env: JobEnvironment, ctx: NodeContext,
                 signals: Signals, faults: Faults) -> None:
        self.spec, self.files, self.job_env, self.ctx, self.signals = spec, files, job_env, ctx, signals
        self.faults = faults
        self.state = NodeStateWriter(files.node(ctx.job_id, ctx.restart, ctx.rank), rank=ctx.rank, host=ctx.host,
                                     generation=str(ctx.generation))
        self.log_path = files.task_log(ctx.log_job_id or ctx.job_id, ctx.rank)
        self.ray_proc: RayNodeProcess | None = None
        self.launch: RayLaunch | None = None  # what this node's Ray runs with (its ports change on a retry)
        self._claim: PortClaim | None = None  # this node's block of ports, held until the teardown
        self._skip_blocks: set[int] = set()  # blocks whose ports another process took under Ray
        self._temp: Path | None = None

    def prepare(self) -> RayLaunch:
        """Sweep what ended generations left here, choose this node's Ray address, ports and temp
        dir, and record them (``starting``)."""
        ctx, spec = self.ctx, self.spec
        if self.signals.stop.is_set():
            logger.warning("a stop signal came before the task started: %s", self.signals.describe())
        for path in sweep_temp_dirs(self.files, keep=(ctx.job_id, ctx.restart)):
            logger.info("swept %s (an ended generation's Ray temp dir)", path)
        if self.faults.fail_node_rank == ctx.rank:
            raise NodeStartError(f"fault injected by {self.faults.injected('fail_node_rank')}")
        check_teacher_packages(ctx.host)  # before Ray or the model would fail on it, later and less clearly
        ray_cfg = spec.launcher.ray
        gpus = self.job_env.node_gpus(spec)
        if spec.launcher.slurm.gpus and gpus < spec.gpus_per_node:
            logger.warning("no CUDA device for gpus_per_node=%d on %s: the workers run on CPU",
                           spec.gpus_per_node, ctx.host)
        private = private_temp_root(ray_cfg.temp_dir_root)
        self._claim = claim_ports(ray_cfg.port_range, ctx.job_id, ctx.restart, ctx.rank, private / LOCK_DIR_NAME)
        launch = self.launch = RayLaunch(ip=self.job_env.node_address(ray_cfg.interface),
                           ports=self._claim.ports,
                           temp=temp_dir(private, ctx.job_id, ctx.restart, ctx.rank),
                           num_cpus=self.job_env.node_cpus(spec),
                           num_gpus=gpus, object_store_memory_mb=ray_cfg.object_store_memory_mb,
                           extra_args=tuple(self.faults.ray_start_words()))
        self._temp = launch.temp
        self.state.write(NodeStatus.STARTING, ip=launch.ip, ports=launch.ports.to_dict(), temp=str(launch.temp),
                         log=str(self.log_path))
        return launch

    def start_ray(self, launch: RayLaunch, *, head_address: str | None = None,
                  token_path: Path | None = None) -> RayNodeProcess | None:
        """This node's Ray (the head's without ``head_address``) once ``ray start`` says it runs;
        None when a stop came first. A start that missed one of Ray's fixed start limits (a starved
        or slow node) is tried again, and one whose ports another process took between the check
        and Ray's bind is tried again on another block (:attr:`launch` then names it), up to
        ``ray.start_attempts`` tries, each failed one logged with its cause; RayStartError when
        ``ray start`` dies of anything else, or on the last try, or says nothing within
        ``ray.nodes_timeout_s``. Ended by :meth:`teardown`."""
        ctx, ray_cfg = self.ctx, self.spec.launcher.ray
        folder = self.files.generation_dir(ctx.job_id, ctx.restart)
        self.launch = launch
        for attempt in range(1, ray_cfg.start_attempts + 1):
            log = folder / (f"{ctx.rank}.ray-start.log" if attempt == 1 else f"{ctx.rank}.ray-start-{attempt}.log")
            held = self._port_taken_by_fault(attempt)
            ray_proc = self.ray_proc = RayNodeProcess(self.launch.command(head_address), log, token_path=token_path,
                                                      temp=self.launch.temp,
                                                      extra_env=self.faults.ray_start_env(ctx.rank, attempt))
            self.state.write(NodeStatus.RAY_STARTING, ray=ray_proc.ref.to_dict(), ray_attempt=attempt)
            try:
                ray_proc.wait_started(ray_cfg.nodes_timeout_s, stop=self.signals.stop)
                return None if self.signals.stop.is_set() else ray_proc
            except RayStartError as exc:
                taken = ray_proc.ports_taken()
                if attempt == ray_cfg.start_attempts or not (taken or ray_proc.missed_start_limit()):
                    raise
                cause = str(exc)
            finally:
                if held is not None:
                    held.close()
            logger.warning("node %s (rank %d): %s; starting its Ray again%s (try %d of %d)", ctx.host, ctx.rank,
                           cause, " on another block of ports" if taken else "", attempt + 1, ray_cfg.start_attempts)
            ray_proc.stop()  # whatever of that try still runs (its GCS, its agents), by session
            if taken:
                self._claim_another_block()
        raise AssertionError("unreachable: the last try returns or raises")

    def _port_taken_by_fault(self, attempt: int) -> socket.socket | None:
        """Under ``take_ray_port_rank``, this rank's first try: a socket holding its node-manager port."""
        if self.faults.take_ray_port_rank != self.ctx.rank or attempt != 1:
            return None
        assert self.launch is not None
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.bind(("", self.launch.ports.node_manager))
        held.listen(1)
        logger.warning("port %d taken by %s", self.launch.ports.node_manager,
                       self.faults.injected("take_ray_port_rank"))
        return held

    def _claim_another_block(self) -> None:
        """After a block's port was taken under Ray: the next free, unclaimed block, recorded."""
        assert self.launch is not None and self._claim is not None, "prepare() claimed a block"
        ctx, ray_cfg = self.ctx, self.spec.launcher.ray
        taken = self.launch.ports.base
        self._skip_blocks.add(taken)
        lock_dir = self._claim.lock_dir
        self._claim.release()
        self._claim = claim_ports(ray_cfg.port_range, ctx.job_id, ctx.restart, ctx.rank, lock_dir,
                                  skip=self._skip_blocks)
        self.launch = replace(self.launch, ports=self._claim.ports)
        self.state.write(NodeStatus.RAY_STARTING, ports=self.launch.ports.to_dict())

    def failed(self, exc: BaseException) -> None:
        """Record in this node's state that its task failed (the other ranks watch it)."""
        msg = f"node {self.ctx.host} (rank {self.ctx.rank}) failed: {type(exc).__name__}: {exc}"
        logger.error("%s (log %s)", msg, self.log_path)
        try:
            self.state.write(NodeStatus.FAILED, error=msg)
        except OSError:
            pass

    def teardown(self) -> None:
        """End this node's Ray (by session) and remove its temp dir; harmless when repeated."""
        t0 = time.monotonic()
        survivors: list[int] = []
        if self.ray_proc is not None:
            survivors = self.ray_proc.stop()
        if self._temp is not None and not survivors:
            shutil.rmtree(self._temp, ignore_errors=True)
        procs.reap_orphans(exclude=[self.ray_proc.pid] if self.ray_proc is not None else [])
        if self._claim is not None and not survivors:  # a survivor may still hold its ports
            self._claim.release()
        state = NodeStatus.FAILED if self.state.error else NodeStatus.ENDED
        try:
            self.state.write(state, ended_at=time.time(), teardown_s=round(time.monotonic() - t0, 3),
                             survivors=survivors, stop=self.signals.describe() if self.signals.stop.is_set() else None)
        except OSError as exc:
            logger.warning("could not write %s: %s", self.state.path, exc)
        logger.info("node %s (rank %d) torn down in %.2fs", self.ctx.host, self.ctx.rank, time.monotonic() - t0)

    # ------------------------------------------------------------------ worker ranks

    def run_worker(self) -> None:
        """A worker rank's whole run: join the head's Ray, keep it until a stop, tear down; raises
        what made it fail (after recording it)."""
        error: BaseException | None = None
        try:
            launch = self.prepare()
            self._join(launch)
        except BaseException as exc:
            error = exc
            self.failed(exc)
        self.teardown()
        if error is not None:
            raise error

    def _join(self, launch: RayLaunch) -> None:
        if self.signals.stop.is_set():
            return
        head = self._wait_head_file()
        if head is None:
            return
        ray_proc = self.start_ray(launch, head_address=head.address, token_path=Path(head.token_path))
        if ray_proc is None:  # a stop came first
            return
        self.state.write(NodeStatus.STARTED)
        while not self.signals.stop.wait(RAY_CHECK_S):
            if not ray_proc.alive():
                raise NodeStartError(f"node {self.ctx.host} (rank {self.ctx.rank}): {ray_proc.describe_exit()}")
        logger.warning("generation %s rank %d: %s; ending this node's Ray once the head has drained",
                       self.ctx.generation, self.ctx.rank, self.signals.describe())
        self._wait_head_done()

    def _wait_head_file(self) -> HeadFile | None:
        """This generation's head file, or None on a stop; NodeStartError when the head failed or
        wrote none within ``ray.nodes_timeout_s``."""
        files, ctx = self.files, self.ctx
        path = files.head(ctx.job_id, ctx.restart)

        def found() -> tuple[HeadFile | None] | None:
            if self.signals.stop.is_set():
                return (None,)
            head = try_read_head(path)
            if head is not None and head.generation == str(ctx.generation):
                return (head,)
            head_state = try_read_node_state(files.node(ctx.job_id, ctx.restart, 0))
            if head_state is not None and head_state.state is NodeStatus.FAILED:
                raise NodeStartError(f"head node failed: {head_state.error}")
            return None

        timeout_s = self.spec.launcher.ray.nodes_timeout_s
        try:
            (head,) = poll_until(found, timeout_s=timeout_s, interval_s=HEAD_FILE_POLL_S,
                                 what=f"the Ray head address in {path}")
        except PollTimeout:
            raise NodeStartError(f"no Ray head address in {path} after {timeout_s:.0f}s") from None
        return head

    def _wait_head_done(self) -> None:
        """Keep this node's Ray until the head has drained (its queued requests may need it), for
        as long as the stop allows: until the drain's end on a preemption or a time limit, a few
        seconds on a cancel or when Slurm requeues the job itself."""
        head_file = self.files.node(self.ctx.job_id, self.ctx.restart, 0)
        intent = self.signals.intent()
        wait_s = URGENT_HEAD_WAIT_S if intent is None or intent.urgent else intent.drain_s() + URGENT_HEAD_WAIT_S

        def head_done() -> bool:
            head = try_read_node_state(head_file)
            return head is not None and head.done

        try:
            poll_until(head_done, timeout_s=wait_s, interval_s=HEAD_DONE_POLL_S, what="the head to finish draining")
        except PollTimeout:
            logger.warning("head did not finish draining in time; ending this node's Ray")
