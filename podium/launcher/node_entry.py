"""The job entry that runs on every node of a teacher job (one task per node).

``python -m podium.launcher.node_entry TEACHER_DIR`` is what every task of a teacher job runs (the
sbatch script's ``srun``, or submitit's local controller). The teacher's backend
(:mod:`podium.launcher.backends`) says where the task is (rank, node count, generation) and
requeues the job; the role comes from the rank:

- rank 0 starts the Ray head, writes the head address file of this generation (atomic, once the
  GCS port answers), waits until Ray counts all nodes (by condition, with a timeout; a node task
  that reports a failed start, or a head that dies, ends the wait at once with the node's name and
  log), then builds the teacher group and serves it; its :class:`~podium.launcher.lifecycle.TeacherLifecycle`
  is the one publisher of the endpoint record;
- the other ranks wait for that head file and start a Ray worker node that joins it.

Generation = (Slurm job id, ``SLURM_RESTART_COUNT``). Every task records itself in
``nodes/<job>-<restart>/<rank>.json`` (host, PID and start time, its ``ray start`` session, its
Ray temp dir), and sweeps the temp dirs ended generations of this teacher left on its node
(:mod:`podium.launcher.cleanup`).

Stopping. Slurm signals every process of the step; only this task reacts (the Ray tree runs with
the stop signals blocked, :mod:`podium.launcher.procs`), and a signal that arrives before the
handlers are installed waits, blocked, until they are (the shim in front of the interpreter and
this module block them before anything is imported). What a stop means (a preemption, a time
limit, a cancel, Slurm's own requeue) is asked of the backend once (:mod:`podium.launcher.signals`):
a preemption or a time limit drains (the record goes ``draining``, new requests get 503, queued
ones finish) for as long as Slurm's end time allows, then rank 0 requeues the job itself, with
plain SIGTERM as with a user signal (a job that ends inside its grace time is not requeued by
Slurm); a cancel or Slurm's own requeue tears down at once. If a requeue is refused, the task
stays until Slurm ends it.

Failing. While serving, the head's :class:`~podium.launcher.watchdog.Watchdog` watches every node
and the group; a fault, or a failed start on any node, ends the generation as ``failed`` with the
node and the cause, and the restart policy (:mod:`podium.launcher.restarts`) requeues it after a
backoff, avoiding a lost node, or gives up after ``restart.max_consecutive_failures`` failures in
a row (the task then exits non-zero and the job ends FAILED).

A task Slurm signalled (or whose head requeued the job) leaves with ``os._exit`` once torn down:
interpreter finalizers (torch, Ray) can outlast ``KillWait``, and a job is requeued only once its
tasks have ended. Worker ranks end their Ray only once the head has finished draining (or after a
bound), so queued requests keep their workers. Never ``ray stop``, never pkill: only the processes
this task started, by recorded ID.

Fault injection for tests: ``PODIUM_FAIL_NODE_RANK=<rank>`` makes that rank's start fail;
``PODIUM_DELAY_START_S=<s>`` makes every task wait that long before it installs its signal handlers;
``PODIUM_RAY_START_ARGS="<args>"`` appends these arguments to every node's ``ray start`` (a bad
one makes it die: what the head must notice at once, and report by its log's cause).
"""

from __future__ import annotations

import signal

if __name__ == "__main__":  # before any other import: a stop signal now must wait for our handlers
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2))

import logging  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Optional  # noqa: E402

from podium.config.spec import TeacherSpec  # noqa: E402
from podium.launcher import procs  # noqa: E402
from podium.launcher import ray_bootstrap as rb  # noqa: E402
from podium.launcher.backends import Backend, NodeContext, backend_for  # noqa: E402
from podium.launcher.cleanup import sweep_temp_dirs  # noqa: E402
from podium.launcher.files import TeacherFiles  # noqa: E402
from podium.launcher.lifecycle import TeacherLifecycle  # noqa: E402
from podium.launcher.restarts import Decision, RestartLedger, decide, excluded_after  # noqa: E402
from podium.launcher.signals import Signals  # noqa: E402
from podium.launcher.watchdog import WatchedNode, Watchdog, watched_nodes  # noqa: E402
from podium.rendezvous.atomic import atomic_write_json, try_read_json  # noqa: E402
from podium.rendezvous.records import Status  # noqa: E402

logger = logging.getLogger(__name__)

NODES_TIMEOUT_S = float(os.environ.get("PODIUM_NODES_TIMEOUT_S", "300"))
REQUEUE_REFUSED_WAIT_S = 600.0  # requeue refused: stay (Slurm ends and requeues a preempted job)
URGENT_HEAD_WAIT_S = 3.0  # worker ranks on SIGTERM: how long they leave their Ray to the head
# Node states (``<rank>.json``) after which the head no longer needs the workers' Ray.
HEAD_DONE_STATES = frozenset({"stopped", "ended", "failed"})


class NodeStartError(RuntimeError):
    """A node of the job could not start or join; the message names the node and its log."""

    def __init__(self, message: str, node: Optional[str] = None) -> None:
        super().__init__(message)
        self.node = node  # the host at fault, when it is another node


def _log_setup() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


ADDRESS_FILE_MODE = 0o600  # files that name a node's address and ports: the owner's only


class NodeState:
    """This task's ``nodes/<job>-<restart>/<rank>.json`` (only this task writes it; 0600: it names
    the node's address and ports)."""

    def __init__(self, files: TeacherFiles, ctx: NodeContext) -> None:
        self.path = files.node(ctx.job_id, ctx.restart, ctx.rank)
        me = procs.ProcRef.of(os.getpid())
        self.fields: dict[str, Any] = {"rank": ctx.rank, "host": ctx.host, "pid": me.pid, "pid_start": me.start,
                                       "generation": str(ctx.generation), "started_at": time.time()}

    def write(self, state: str, **fields: Any) -> None:
        self.fields.update(fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {"state": state, **self.fields, "time": time.time()}, mode=ADDRESS_FILE_MODE)


def run_node(teacher_dir: str) -> None:
    """The entry on every node (see the module docstring)."""
    _log_setup()
    delay = float(os.environ.get("PODIUM_DELAY_START_S") or 0)
    if delay > 0:  # fault injection: a stop signal now finds no handler of ours yet
        logger.warning("PODIUM_DELAY_START_S=%s: waiting before installing the signal handlers", delay)
        time.sleep(delay)
    signals = Signals()
    signals.install()
    procs.unblock_stop_signals()  # a signal that came before now is delivered to the handler here
    procs.set_child_subreaper()
    files = TeacherFiles(Path(teacher_dir))
    spec = TeacherSpec.read(files.spec)
    backend = backend_for(spec.launcher.cluster)
    ctx = backend.node_context()
    signals.set_classifier(lambda name: backend.stop_intent(ctx, name, spec), spec.launcher.server.drain_s)
    node = _NodeRun(spec, files, backend, ctx, signals)
    decision = node.run()
    code = node.finish(decision)
    if backend.exit_fast_after_signal and (signals.received or (decision is not None and decision.requeue)):
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


class _NodeRun:
    """One node task of one generation: start, serve or join, tear down, requeue."""

    def __init__(self, spec: TeacherSpec, files: TeacherFiles, backend: Backend, ctx: NodeContext,
                 signals: Signals) -> None:
        self.spec, self.files, self.backend, self.ctx, self.signals = spec, files, backend, ctx, signals
        self.state = NodeState(files, ctx)
        self.log_path = files.task_log(ctx.job_id, ctx.rank)
        self.ray_proc: Optional[rb.RayNodeProcess] = None
        self.temp: Optional[Path] = None
        self.token_path: Optional[Path] = None
        self.ledger: Optional[RestartLedger] = None

    # ------------------------------------------------------------------ the task

    def run(self) -> Optional[Decision]:
        """Start, serve or join, tear down. The head returns what comes next (its ending has been
        published); a worker rank returns None, or raises what made it fail."""
        ctx, spec, files = self.ctx, self.spec, self.files
        logger.info("teacher %r (%s) node %s rank %d/%d generation %s", spec.display, spec.key, ctx.host,
                    ctx.rank, ctx.num_nodes, ctx.generation)
        lifecycle = TeacherLifecycle(spec, files, ctx.generation, self.signals) if ctx.rank == 0 else None
        error: Optional[BaseException] = None
        decision: Optional[Decision] = None
        try:
            if self.signals.stop.is_set():
                logger.warning("a stop signal came before the task started: %s", self.signals.describe())
            for path in sweep_temp_dirs(files, keep=(ctx.job_id, ctx.restart)):
                logger.info("swept %s (an ended generation's Ray temp dir)", path)
            if os.environ.get("PODIUM_FAIL_NODE_RANK") == str(ctx.rank):
                raise NodeStartError(f"fault injected by PODIUM_FAIL_NODE_RANK={ctx.rank}")
            ray_cfg = spec.launcher.ray
            ip = self.backend.node_address(ray_cfg.interface)
            ports = rb.choose_ports(ray_cfg.port_range, ctx.job_id, ctx.restart, ctx.rank)
            self.temp = rb.temp_dir(ray_cfg.temp_dir_root, ctx.job_id, ctx.restart, ctx.rank)
            gpus = self.backend.node_gpus(spec)
            if spec.launcher.slurm.gpus and gpus < spec.gpus_per_node:
                logger.warning("no CUDA device for gpus_per_node=%d on %s: the workers run on CPU",
                               spec.gpus_per_node, ctx.host)
            cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or spec.gpus_per_node + 1)
            common = dict(ip=ip, ports=ports, temp=self.temp, num_cpus=cpus, num_gpus=gpus,
                          object_store_memory_mb=ray_cfg.object_store_memory_mb)
            self.state.write("starting", ip=ip, ports=ports.to_dict(), temp=str(self.temp), log=str(self.log_path))
            if lifecycle is not None:
                decision = _HeadRun(self, common, lifecycle).run()
            else:
                self._run_worker(common)
        except BaseException as exc:
            error = exc
            self.failed(exc)
        if lifecycle is not None and decision is None:  # failed before the head could start
            decision = self._end(lifecycle, error)
        self.teardown()
        if lifecycle is None and error is not None:
            raise error
        return decision

    def failed(self, exc: BaseException) -> None:
        """Record in this node's state that its task failed (worker ranks watch the head's)."""
        msg = f"node {self.ctx.host} (rank {self.ctx.rank}) failed: {type(exc).__name__}: {exc}"
        logger.error("%s (log %s)", msg, self.log_path)
        try:
            self.state.write("failed", error=msg)
        except OSError:
            pass

    def _end(self, lifecycle: TeacherLifecycle, error: Optional[BaseException]) -> Decision:
        """How this generation ended, per the restart policy, published; the decision."""
        intent = self.signals.intent()
        node: Optional[str] = None
        if lifecycle.fault is not None:
            outcome, (reason, node) = "failed", lifecycle.fault
        elif intent is not None and (intent.requeue or error is None or isinstance(error, (KeyboardInterrupt, SystemExit))):
            # A stop: a failure while being preempted still brings the job back.
            outcome = {"preempt": "preempted", "signal": "preempted", "time_limit": "time_limit"}.get(intent.kind, "stopped")
            reason = self.signals.describe()
        elif error is not None:
            outcome, reason, node = "failed", f"{type(error).__name__}: {error}", getattr(error, "node", None)
        else:
            outcome, reason = "stopped", "ended"
        settings = self.spec.launcher.restart
        ledger = RestartLedger.read(self.files).ended(str(self.ctx.generation), outcome, reason, node)
        if outcome == "failed":
            ledger = excluded_after(ledger, node, settings)
        decision = decide(ledger, outcome, settings, can_requeue=self.backend.requeues)
        try:
            ledger.write(self.files)
        except OSError as exc:
            logger.error("could not write %s: %s", self.files.restarts, exc)
        self.ledger = ledger
        lifecycle.end(outcome, reason, decision, ledger)
        return decision

    def start_ray(self, common: dict[str, Any], head_address: Optional[str] = None) -> rb.RayNodeProcess:
        ray_log = self.files.generation_dir(self.ctx.job_id, self.ctx.restart) / f"{self.ctx.rank}.ray-start.log"
        cmd = rb.start_command(head=head_address is None, head_address=head_address, **common)
        cmd += shlex.split(os.environ.get("PODIUM_RAY_START_ARGS") or "")  # fault injection (tests)
        self.ray_proc = rb.RayNodeProcess(cmd, ray_log, token_path=self.token_path)
        self.state.write("ray_starting", ray=self.ray_proc.ref.to_dict())
        return self.ray_proc

    def teardown(self) -> None:
        """End this node's Ray (by session) and remove its temp dir; harmless when repeated."""
        t0 = time.monotonic()
        survivors: list[int] = []
        if self.ray_proc is not None:
            survivors = self.ray_proc.stop()
        if self.temp is not None and not survivors:
            shutil.rmtree(self.temp, ignore_errors=True)
        procs.reap_orphans(exclude=[self.ray_proc.pid] if self.ray_proc is not None else [])
        state = "failed" if self.state.fields.get("error") else "ended"
        try:
            self.state.write(state, ended_at=time.time(), teardown_s=round(time.monotonic() - t0, 3),
                             survivors=survivors, stop=self.signals.describe() if self.signals.stop.is_set() else None)
        except OSError as exc:
            logger.warning("could not write %s: %s", self.state.path, exc)
        logger.info("node %s (rank %d) torn down in %.2fs", self.ctx.host, self.ctx.rank, time.monotonic() - t0)

    # ------------------------------------------------------------------ worker ranks

    def _run_worker(self, common: dict[str, Any]) -> None:
        if self.signals.stop.is_set():
            return
        head = self._wait_head_file()
        if head is None:
            return
        self.token_path = Path(head["token_path"])
        ray_proc = self.start_ray(common, head_address=head["address"])
        self.state.write("started")
        while not self.signals.stop.wait(0.5):
            if not ray_proc.alive():
                raise NodeStartError(f"node {self.ctx.host} (rank {self.ctx.rank}): {ray_proc.describe_exit()}")
        logger.warning("generation %s rank %d: %s; ending this node's Ray once the head has drained",
                       self.ctx.generation, self.ctx.rank, self.signals.describe())
        self._wait_head_done()

    def _wait_head_file(self) -> Optional[dict]:
        files, ctx = self.files, self.ctx
        path = files.head(ctx.job_id, ctx.restart)
        deadline = time.monotonic() + NODES_TIMEOUT_S
        while not self.signals.stop.is_set():
            found = try_read_json(path)
            if found.ok and found.data.get("generation") == str(ctx.generation):
                return found.data
            head_state = try_read_json(files.node(ctx.job_id, ctx.restart, 0))
            if head_state.ok and head_state.data.get("state") == "failed":
                raise NodeStartError(f"head node failed: {head_state.data.get('error')}")
            if time.monotonic() > deadline:
                raise NodeStartError(f"no Ray head address in {path} after {NODES_TIMEOUT_S:.0f}s")
            time.sleep(0.05)
        return None

    def _wait_head_done(self) -> None:
        """Keep this node's Ray until the head has drained (its queued requests may need it), for
        as long as the stop allows: until the drain's end on a preemption or a time limit, a few
        seconds on a cancel or when Slurm requeues the job itself."""
        head_file = self.files.node(self.ctx.job_id, self.ctx.restart, 0)
        intent = self.signals.intent()
        until = time.time() + (URGENT_HEAD_WAIT_S if intent is None or intent.urgent
                               else intent.drain_s() + URGENT_HEAD_WAIT_S)
        while time.time() < until:
            found = try_read_json(head_file)
            if found.ok and found.data.get("state") in HEAD_DONE_STATES:
                return
            time.sleep(0.1)
        logger.warning("head did not finish draining in time; ending this node's Ray")

    # ------------------------------------------------------------------ what comes next

    def finish(self, decision: Optional[Decision]) -> int:
        """After the teardown: the head asks for the next generation when the decision says so.
        Returns the task's exit code (non-zero when the teacher failed for good).

        If a requeue is refused, the task stays until Slurm ends it: a task that ends by itself
        inside a preemption's grace time ends its job, and Slurm does not requeue a job that ended.
        """
        if decision is None:  # a worker rank: the head decides
            return 0
        if not decision.requeue:
            return 1 if decision.final else 0
        ctx = self.ctx
        exclude = self.ledger.excluded_nodes if self.ledger is not None else ()
        logger.warning("requeueing job %s: generation %s ends, %s:%d comes next (%s)", ctx.job_id,
                       ctx.generation, ctx.job_id, ctx.restart + 1, decision.why)
        # The requeue signals this very task at once (Slurm ends the step): the nodes to avoid and
        # the backoff, set right after it, must not be cut off by that signal or by a handler a
        # library (Ray's, after ray.shutdown) left behind.
        with procs.stop_signals_blocked():
            refused = self.backend.requeue(ctx, exclude=exclude, delay_s=decision.delay_s)
        if refused is None:
            logger.info("job %s requeued", ctx.job_id)
            return 0
        logger.error("requeue of job %s refused: %s", ctx.job_id, refused)
        if not self.signals.urgent.wait(REQUEUE_REFUSED_WAIT_S):
            logger.error("Slurm did not end the job within %.0fs of the refused requeue; exiting",
                         REQUEUE_REFUSED_WAIT_S)
        return 1


class _HeadRun:
    """Rank 0: Ray head, driver, group and endpoint of this generation; its lifecycle publishes."""

    def __init__(self, node: _NodeRun, common: dict[str, Any], lifecycle: TeacherLifecycle) -> None:
        self.node = node
        self.common = common
        self.spec, self.files, self.ctx, self.signals = node.spec, node.files, node.ctx, node.signals
        self.lifecycle = lifecycle
        self.group: Any = None
        self.joined: list[WatchedNode] = []

    def run(self) -> Decision:
        """Start and serve until a stop or a failure; publish how it ended (before the group and
        the driver go down, so trainers learn of a fault at once); the decision."""
        error: Optional[BaseException] = None
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
            return self.node._end(self.lifecycle, error)
        finally:
            self._disconnect()

    def _start(self) -> None:
        ports: rb.RayPorts = self.common["ports"]
        ip: str = self.common["ip"]
        generation_dir = self.files.generation_dir(self.ctx.job_id, self.ctx.restart)
        generation_dir.mkdir(parents=True, exist_ok=True)
        self.node.token_path = rb.write_auth_token(self.files.ray_token(self.ctx.job_id, self.ctx.restart))
        ray_proc = self.node.start_ray(self.common)
        rb.wait_port(ip, ports.gcs, timeout_s=120, alive=ray_proc)
        address = f"{ip}:{ports.gcs}"
        self.lifecycle.stamp("gcs_up")
        atomic_write_json(self.files.head(self.ctx.job_id, self.ctx.restart),
                          {"address": address, "generation": str(self.ctx.generation), "host": self.ctx.host,
                           "ports": ports.to_dict(), "token_path": str(self.node.token_path), "time": time.time()},
                          mode=ADDRESS_FILE_MODE)
        self.node.state.write("started")
        if self.signals.stop.is_set():
            return
        ray_proc.wait_started(NODES_TIMEOUT_S)  # workers join meanwhile: head.json is out
        os.environ.update(rb.ray_env({}, token_path=self.node.token_path))
        import ray

        # ray.init installs its own SIGTERM handler (exit 1): keep stop signals pending until ours
        # are back, so a signal in between reaches them instead of Ray's.
        with procs.stop_signals_blocked():
            try:
                ray.init(address=address, _node_ip_address=ip, logging_level=logging.WARNING, log_to_driver=True)
            except Exception:
                if not ray_proc.alive():  # it died under the driver: its log says why, not ray.init's timeout
                    raise rb.RayStartError(ray_proc.describe_exit()) from None
                raise
            self.signals.install()
        self._wait_nodes(ray, ray_proc)
        self.lifecycle.stamp("ray_ready")
        if self.signals.stop.is_set():
            return
        self.lifecycle.publish(Status.LOADING)
        from podium.teacher.group import GroupOptions, TeacherWorkerGroup

        # The group's torch.distributed rendezvous takes the port this node's block reserves for
        # it (checked free on all addresses, outside Ray's ports): chosen explicitly too.
        port = self.common["ports"].torch_master
        self.group = TeacherWorkerGroup(self.spec, GroupOptions(master_port_range=(port, port)))
        self.signals.install()  # in case the group's libraries installed handlers of their own
        self.lifecycle.stamp("model_loaded")

    def _wait_nodes(self, ray: Any, ray_proc: rb.RayNodeProcess) -> None:
        files, ctx = self.files, self.ctx
        deadline = time.monotonic() + NODES_TIMEOUT_S
        while not self.signals.stop.is_set():
            alive = [n for n in ray.nodes() if n.get("Alive")]
            if len(alive) >= ctx.num_nodes:
                logger.info("all %d Ray nodes joined: %s", ctx.num_nodes,
                            ", ".join(n.get("NodeManagerAddress", "?") for n in alive))
                recorded = [try_read_json(files.node(ctx.job_id, ctx.restart, rank)) for rank in range(ctx.num_nodes)]
                self.joined = watched_nodes(alive, [r.data for r in recorded if r.ok], ctx.host)
                return
            for rank in range(1, ctx.num_nodes):
                state = try_read_json(files.node(ctx.job_id, ctx.restart, rank))
                if state.ok and state.data.get("state") == "failed":
                    raise NodeStartError(
                        f"node {state.data.get('host')} (rank {rank}) failed at start: "
                        f"{state.data.get('error')}; log {state.data.get('log')}", node=state.data.get("host"))
            if not ray_proc.alive():
                raise NodeStartError(f"head node {ctx.host}: {ray_proc.describe_exit()}")
            if time.monotonic() > deadline:
                raise NodeStartError(
                    f"only {len(alive)} of {ctx.num_nodes} Ray nodes joined within {NODES_TIMEOUT_S:.0f}s; "
                    f"node states in {files.generation_dir(ctx.job_id, ctx.restart)}")
            time.sleep(0.1)

    def _serve(self) -> None:
        from podium.rendezvous.layout import RunLayout
        from podium.rendezvous.token import read_token

        interface = self.spec.launcher.server.interface
        host = rb.node_ip(interface) if interface else self.common["ip"]
        token = read_token(RunLayout(self.files.run_dir).auth_token_path)
        ray_proc = self.node.ray_proc
        watchdog = Watchdog(files=self.files, job_id=self.ctx.job_id, restart=self.ctx.restart, nodes=self.joined,
                            group=self.group, on_fault=self.lifecycle.fault_found,
                            head_alive=lambda: None if ray_proc is None or ray_proc.alive() else ray_proc.describe_exit())

        def on_ready(url: str) -> None:
            self.node.state.write("serving", url=url)
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
            self.node.state.write("stopped")
        except OSError as exc:
            logger.warning("could not write %s: %s", self.node.state.path, exc)


def main(argv: list[str] | None = None) -> None:
    """``python -m podium.launcher.node_entry TEACHER_DIR`` (what a rendered sbatch script runs)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m podium.launcher.node_entry TEACHER_DIR")
    run_node(args[0])


if __name__ == "__main__":
    main()
