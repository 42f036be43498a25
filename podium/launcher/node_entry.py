"""The job entry that runs on every node of a teacher job (one task per node).

``run_node(teacher_dir)`` is what submitit (or ``srun`` in a rendered sbatch script) runs on each
node. The role comes from the rank:

- rank 0 starts the Ray head, writes the head address file of this generation (atomic, once the
  GCS port answers), waits until Ray counts all nodes (by condition, with a timeout; a node task
  that reports a failed start, or a head that dies, ends the wait at once with the node's name and
  log), then builds the teacher group, serves it (``podium.teacher.endpoint.serve``) and keeps the
  endpoint record and its heartbeat;
- the other ranks wait for that head file and start a Ray worker node that joins it.

Generation = (Slurm job id, ``SLURM_RESTART_COUNT``). Every task records itself in
``nodes/<job>-<restart>/<rank>.json`` (host, PID and start time, its ``ray start`` session, its
Ray temp dir), and sweeps the temp dirs ended generations of this teacher left on its node
(:mod:`podium.launcher.cleanup`).

Stopping. Slurm signals every process of the step; only this task reacts (the Ray tree runs with
the stop signals blocked, :mod:`podium.launcher.procs`), and a signal that arrives before the
handlers are installed waits, blocked, until they are (the submitit command and ``python -m
podium.launcher.node_entry`` block them before anything is imported):

- USR1/USR2 (``--signal``: preemption, or the time limit ahead): drain. The record goes
  ``draining`` (new requests get 503, queued ones finish, up to ``server.drain_s``), then
  ``stopped``; the group is shut down, Ray disconnected and ended by session, the temp dir
  removed; then rank 0 requeues its own job (``scontrol requeue``) and exits, and the job comes
  back as generation (job id, restart + 1). If the requeue is refused, the task stays until Slurm
  ends it (a preempted job that ends by itself inside its grace time is not requeued by Slurm).
- SIGTERM/SIGINT (``scancel``, ``scontrol requeue``, the end of a preemption's grace time): the
  same teardown at once (well under a second when no request is queued); Slurm SIGKILLs the task
  ``KillWait`` seconds later and requeues the job itself when that is what it is doing.

A task Slurm signalled leaves with ``os._exit`` once torn down: interpreter finalizers (torch,
Ray) can outlast ``KillWait``, and a job is requeued only once its tasks have ended. A task
that fails while it is being preempted still requeues its job.

Worker ranks end their Ray only once the head has finished draining (or after a bound), so
queued requests keep their workers. Never ``ray stop``, never pkill: only the processes this task
started, by recorded ID.

The group is built by ``PODIUM_GROUP_FACTORY`` (``module:callable`` taking the ``TeacherSpec``),
by default ``podium.teacher.group:TeacherWorkerGroup``. Fault injection for tests:
``PODIUM_FAIL_NODE_RANK=<rank>`` makes that rank's start fail; ``PODIUM_DELAY_START_S=<s>`` makes
every task wait that long before it installs its signal handlers.
"""

from __future__ import annotations

import signal

if __name__ == "__main__":  # before any other import: a stop signal now must wait for our handlers
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2))

import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

from podium.config.spec import TeacherSpec  # noqa: E402
from podium.launcher import procs  # noqa: E402
from podium.launcher import ray_bootstrap as rb  # noqa: E402
from podium.launcher.cleanup import sweep_temp_dirs  # noqa: E402
from podium.launcher.files import TeacherFiles  # noqa: E402
from podium.rendezvous.atomic import atomic_write_json, try_read_json  # noqa: E402
from podium.rendezvous.records import Generation, RecordWriter, Status  # noqa: E402

logger = logging.getLogger(__name__)

DEFAULT_GROUP_FACTORY = "podium.teacher.group:TeacherWorkerGroup"
NODES_TIMEOUT_S = float(os.environ.get("PODIUM_NODES_TIMEOUT_S", "300"))
DRAIN_S = 10.0  # default server.drain_s: how long queued requests may finish after a stop signal
REQUEUE_TIMEOUT_S = 30.0
REQUEUE_REFUSED_WAIT_S = 600.0  # requeue refused: stay (Slurm ends and requeues a preempted job)
URGENT_HEAD_WAIT_S = 3.0  # worker ranks on SIGTERM: how long they leave their Ray to the head
# Node states (``<rank>.json``) after which the head no longer needs the workers' Ray.
HEAD_DONE_STATES = frozenset({"stopped", "ended", "failed"})


class NodeStartError(RuntimeError):
    """A node of the job could not start or join; the message names the node and its log."""


def _log_setup() -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class NodeContext:
    """Where this task runs: rank, node count, generation, host (from Slurm or submitit local)."""

    def __init__(self) -> None:
        env = os.environ
        if env.get("SLURM_JOB_ID") and env.get("SUBMITIT_EXECUTOR") != "local":
            self.job_id = env["SLURM_JOB_ID"]
            self.rank = int(env.get("SLURM_NODEID", env.get("SLURM_PROCID", "0")))
            self.num_nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")))
            self.restart = int(env.get("SLURM_RESTART_COUNT") or 0)
            self.local = False
        else:
            self.job_id = env.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())
            self.rank = int(env.get("SUBMITIT_LOCAL_NODEID", "0"))
            self.num_nodes = int(env.get("SUBMITIT_LOCAL_JOB_NUM_NODES", "1"))
            self.restart = 0
            self.local = True
        self.host = socket.gethostname()

    @property
    def generation(self) -> Generation:
        return Generation(int(self.job_id), self.restart)


class Signals:
    """SIGTERM / SIGINT / SIGUSR1 / SIGUSR2 (and the stop file) -> one stop event.

    USR1/USR2 ask for a drain and a requeue; SIGTERM/SIGINT (``urgent``) for a stop now. The
    handler only records and sets events: everything else happens in the threads that wait on them.
    """

    HANDLED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGUSR1, signal.SIGINT)

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.urgent = threading.Event()
        self.requeue = False
        self.received: list[tuple[str, float]] = []
        self.stop_requested_by: Optional[str] = None  # the stop file (``podium down``, local)

    def install(self) -> None:
        for sig in self.HANDLED:
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.received.append((signal.Signals(signum).name, time.time()))
        if signum in (signal.SIGUSR1, signal.SIGUSR2):
            self.requeue = True
        else:
            self.urgent.set()
        self.stop.set()

    def request_stop(self, why: str) -> None:
        self.stop_requested_by = why
        self.stop.set()

    @property
    def first(self) -> Optional[tuple[str, float]]:
        return self.received[0] if self.received else None

    def describe(self) -> str:
        """Why this generation stops, for the record's ``reason`` and the logs."""
        if self.received:
            names = " then ".join(dict.fromkeys(name for name, _ in self.received))
            what = "preempted or near its time limit" if self.requeue else "stopped by Slurm"
            return f"{what} ({names})" + ("; requeueing" if self.requeue else "")
        return self.stop_requested_by or "stop requested"


class NodeState:
    """This task's ``nodes/<job>-<restart>/<rank>.json`` (only this task writes it)."""

    def __init__(self, files: TeacherFiles, ctx: NodeContext) -> None:
        self.path = files.node(ctx.job_id, ctx.restart, ctx.rank)
        me = procs.ProcRef.of(os.getpid())
        self.fields: dict[str, Any] = {"rank": ctx.rank, "host": ctx.host, "pid": me.pid, "pid_start": me.start,
                                       "generation": str(ctx.generation), "started_at": time.time()}

    def write(self, state: str, **fields: Any) -> None:
        self.fields.update(fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {"state": state, **self.fields, "time": time.time()})


class HeadRecordWriter(RecordWriter):
    """The head's record writer: stamps each status's first time in ``extra.timings`` and says,
    in ``reason``, why a generation drains or stops (the signal, and whether it requeues)."""

    def __init__(self, path: Path, *, signals: Signals, timings: dict[str, float], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.signals = signals
        self.timings = timings

    def publish(self, status: Status | str, *, reason: Optional[str] = None, **extra: Any) -> Any:
        status = Status(status)
        self.timings.setdefault(status.value, time.time())
        if status in (Status.DRAINING, Status.STOPPED) and reason is None and self.signals.stop.is_set():
            reason = self.signals.describe()
            if self.signals.first is not None:
                self.timings.setdefault("stop_signal", self.signals.first[1])
        extra["timings"] = dict(self.timings)
        return super().publish(status, reason=reason, **extra)


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
    spec = TeacherSpec.from_dict(json.loads(files.spec.read_text()))
    ctx = NodeContext()
    node = _NodeRun(spec, files, ctx, signals)
    try:
        node.run()
    except BaseException:
        if not signals.requeue or ctx.local:
            raise
        # Failed while it was being preempted: the job must still come back.
        logger.exception("generation %s failed during its stop; requeueing it anyway", ctx.generation)
        node.finish()
        _exit_now(1)
    node.finish()
    if signals.received and not ctx.local:
        # Slurm is ending this task (a requeue, a cancel, a preemption) and SIGKILLs it KillWait
        # seconds after its SIGTERM: the teardown is done, so leave now rather than through the
        # interpreter's exit (torch's and Ray's finalizers sometimes outlast KillWait, and the job
        # stays COMPLETING, so not requeued, until they end). No submitit result for this run.
        _exit_now(0)


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

    def __init__(self, spec: TeacherSpec, files: TeacherFiles, ctx: NodeContext, signals: Signals) -> None:
        self.spec, self.files, self.ctx, self.signals = spec, files, ctx, signals
        self.state = NodeState(files, ctx)
        self.log_path = files.task_log(ctx.job_id, ctx.rank)
        self.ray_proc: Optional[rb.RayNodeProcess] = None
        self.temp: Optional[Path] = None
        server = dict(spec.launcher.get("server", {}))
        self.drain_s = float(server.get("drain_s", DRAIN_S))

    # ------------------------------------------------------------------ the task

    def run(self) -> None:
        ctx, spec, files = self.ctx, self.spec, self.files
        logger.info("teacher %r (%s) node %s rank %d/%d generation %s", spec.name, spec.key, ctx.host,
                    ctx.rank, ctx.num_nodes, ctx.generation)
        if self.signals.received:
            logger.warning("a stop signal came before the task started: %s", self.signals.describe())
        try:
            for path in sweep_temp_dirs(files, keep=(ctx.job_id, ctx.restart)):
                logger.info("swept %s (an ended generation's Ray temp dir)", path)
            if os.environ.get("PODIUM_FAIL_NODE_RANK") == str(ctx.rank):
                raise NodeStartError(f"fault injected by PODIUM_FAIL_NODE_RANK={ctx.rank}")
            ray_cfg = dict(spec.launcher.get("ray", {}))
            ip = "127.0.0.1" if ctx.local else rb.node_ip(ray_cfg.get("interface"))
            ports = rb.choose_ports(tuple(ray_cfg.get("port_range", (30000, 39999))), ctx.job_id,
                                    ctx.restart, ctx.rank)
            self.temp = rb.temp_dir(ray_cfg.get("temp_dir_root", "/tmp"), ctx.job_id, ctx.restart, ctx.rank)
            gpus = spec.gpus_per_node if spec.launcher.get("slurm", {}).get("gpus", True) else 0
            cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or spec.gpus_per_node + 1)
            common = dict(ip=ip, ports=ports, temp=self.temp, num_cpus=cpus, num_gpus=gpus,
                          object_store_memory_mb=ray_cfg.get("object_store_memory_mb"))
            self.state.write("starting", ip=ip, ports=ports.to_dict(), temp=str(self.temp), log=str(self.log_path))
            if ctx.rank == 0:
                _HeadRun(self, common).run()
            else:
                self._run_worker(common)
        except BaseException as exc:
            msg = f"node {ctx.host} (rank {ctx.rank}) failed: {type(exc).__name__}: {exc}"
            logger.error("%s (log %s)", msg, self.log_path)
            try:
                self.state.write("failed", error=msg)
            except OSError:
                pass
            self.teardown()
            raise
        self.teardown()

    def start_ray(self, common: dict[str, Any], head_address: Optional[str] = None) -> rb.RayNodeProcess:
        ray_log = self.files.generation_dir(self.ctx.job_id, self.ctx.restart) / f"{self.ctx.rank}.ray-start.log"
        cmd = rb.start_command(head=head_address is None, head_address=head_address, **common)
        self.ray_proc = rb.RayNodeProcess(cmd, ray_log)
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
        """Keep this node's Ray until the head has drained (its queued requests may need it)."""
        head_file = self.files.node(self.ctx.job_id, self.ctx.restart, 0)
        bound = URGENT_HEAD_WAIT_S if self.signals.urgent.is_set() else self.drain_s + 10.0
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            found = try_read_json(head_file)
            if found.ok and found.data.get("state") in HEAD_DONE_STATES:
                return
            if self.signals.urgent.is_set():
                deadline = min(deadline, time.monotonic() + URGENT_HEAD_WAIT_S)
            time.sleep(0.1)
        logger.warning("head did not finish draining within %.0fs; ending this node's Ray", bound)

    # ------------------------------------------------------------------ requeue

    def finish(self) -> None:
        """After the teardown: rank 0 of a drained Slurm job requeues it.

        If the requeue is refused, it stays until Slurm ends it: a task that ends by itself inside
        a preemption's grace time ends its job, and Slurm does not requeue a job that ended.
        """
        signals, ctx = self.signals, self.ctx
        if not signals.requeue or ctx.local or ctx.rank != 0:
            return
        logger.warning("requeueing job %s: generation %s ends, %s:%d comes next", ctx.job_id,
                       ctx.generation, ctx.job_id, ctx.restart + 1)
        try:
            proc = subprocess.run(["scontrol", "requeue", ctx.job_id], capture_output=True, text=True,
                                  timeout=REQUEUE_TIMEOUT_S)
            refused = proc.stderr.strip() if proc.returncode != 0 else None
        except (OSError, subprocess.TimeoutExpired) as exc:
            refused = str(exc)
        if refused is None:
            logger.info("job %s requeued", ctx.job_id)
            return
        logger.error("scontrol requeue %s refused: %s", ctx.job_id, refused)
        if not signals.urgent.wait(REQUEUE_REFUSED_WAIT_S):
            logger.error("Slurm did not end the job within %.0fs of the refused requeue; exiting",
                         REQUEUE_REFUSED_WAIT_S)


class _HeadRun:
    """Rank 0: Ray head, driver, group, endpoint and the endpoint record of this generation."""

    def __init__(self, node: _NodeRun, common: dict[str, Any]) -> None:
        self.node = node
        self.common = common
        self.spec, self.files, self.ctx, self.signals = node.spec, node.files, node.ctx, node.signals
        self.timings: dict[str, float] = {"task_start": time.time()}
        self.writer = HeadRecordWriter(self.files.endpoint, signals=self.signals, timings=self.timings,
                                       teacher_key=self.spec.key, teacher_name=self.spec.name,
                                       generation=self.ctx.generation, aliases=self.spec.aliases)
        self.group: Any = None

    def run(self) -> None:
        writer = self.writer
        try:
            if not self.signals.stop.is_set():
                writer.publish(Status.STARTING)
                self._start()
            if self.signals.stop.is_set():
                writer.publish(Status.STOPPED)  # stopped before it served: reason says why
            else:
                self._serve()
        except BaseException as exc:
            if not writer.fenced:
                try:
                    if self.signals.stop.is_set() and isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        writer.publish(Status.STOPPED)
                    else:
                        writer.publish(Status.FAILED, reason=f"{type(exc).__name__}: {exc}"[:2000])
                except Exception:  # the original error matters more
                    logger.exception("could not publish the failure")
            raise
        finally:
            self._disconnect()

    def _start(self) -> None:
        ports: rb.RayPorts = self.common["ports"]
        ip: str = self.common["ip"]
        ray_proc = self.node.start_ray(self.common)
        rb.wait_port(ip, ports.gcs, timeout_s=120, alive=ray_proc)
        address = f"{ip}:{ports.gcs}"
        self.timings["gcs_up"] = time.time()
        head_path = self.files.head(self.ctx.job_id, self.ctx.restart)
        head_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(head_path, {"address": address, "generation": str(self.ctx.generation),
                                      "host": self.ctx.host, "ports": ports.to_dict(), "time": time.time()})
        self.node.state.write("started")
        if self.signals.stop.is_set():
            return
        os.environ.update(rb.RAY_ENV)
        import ray

        # ray.init installs its own SIGTERM handler (exit 1): keep stop signals pending until ours
        # are back, so a signal in between reaches them instead of Ray's.
        with procs.stop_signals_blocked():
            ray.init(address=address, _node_ip_address=ip, logging_level=logging.WARNING, log_to_driver=True)
            self.signals.install()
        self._wait_nodes(ray, ray_proc)
        self.timings["ray_ready"] = time.time()
        if self.signals.stop.is_set():
            return
        self.writer.publish(Status.LOADING)
        self.group = make_group(self.spec, master_port=self.common["ports"].torch_master)
        self.signals.install()  # in case the group's libraries installed handlers of their own
        self.timings["model_loaded"] = time.time()

    def _wait_nodes(self, ray: Any, ray_proc: rb.RayNodeProcess) -> None:
        files, ctx = self.files, self.ctx
        deadline = time.monotonic() + NODES_TIMEOUT_S
        while not self.signals.stop.is_set():
            alive = [n for n in ray.nodes() if n.get("Alive")]
            if len(alive) >= ctx.num_nodes:
                logger.info("all %d Ray nodes joined: %s", ctx.num_nodes,
                            ", ".join(n.get("NodeManagerAddress", "?") for n in alive))
                return
            for rank in range(1, ctx.num_nodes):
                state = try_read_json(files.node(ctx.job_id, ctx.restart, rank))
                if state.ok and state.data.get("state") == "failed":
                    raise NodeStartError(
                        f"node {state.data.get('host')} (rank {rank}) failed at start: "
                        f"{state.data.get('error')}; log {state.data.get('log')}")
            if not ray_proc.alive():
                raise NodeStartError(f"head node {ctx.host}: {ray_proc.describe_exit()}")
            if time.monotonic() > deadline:
                raise NodeStartError(
                    f"only {len(alive)} of {ctx.num_nodes} Ray nodes joined within {NODES_TIMEOUT_S:.0f}s; "
                    f"node states in {files.generation_dir(ctx.job_id, ctx.restart)}")
            time.sleep(0.1)

    def _serve(self) -> None:
        from podium.rendezvous.token import read_token
        from podium.teacher.endpoint import serve

        spec, files, signals = self.spec, self.files, self.signals
        server = dict(spec.launcher.get("server", {}))
        host = self.common["ip"]
        if server.get("interface"):
            host = rb.node_ip(server["interface"])
        token = read_token(files.run_dir / "auth_token")

        def watch_stop_file() -> None:
            while not signals.stop.wait(0.5):
                if files.stop_request.exists():
                    logger.warning("stop requested by %s", files.stop_request)
                    signals.request_stop(f"stop requested by {files.stop_request.name}")

        def watch_stop() -> None:
            signals.stop.wait()
            logger.warning("generation %s: %s: draining (up to %.0fs for queued requests)",
                           self.ctx.generation, signals.describe(), self.node.drain_s)

        threading.Thread(target=watch_stop_file, name="podium-stop-file", daemon=True).start()
        threading.Thread(target=watch_stop, name="podium-stop", daemon=True).start()

        def on_ready(url: str) -> None:
            self.timings["endpoint_ready"] = time.time()
            self.writer.publish(Status.READY)
            self.node.state.write("serving", url=url)
            logger.info("teacher %r ready at %s", spec.name, url)

        serve(self.group, token=token, host=host, port_range=tuple(server.get("port_range", (18500, 18999))),
              record_writer=self.writer, heartbeat_interval_s=float(server.get("heartbeat_s", 10.0)),
              stop_event=signals.stop, handle_signals=False, on_ready=on_ready,
              drain_timeout_s=self.node.drain_s,
              max_body_bytes=int(server.get("max_body_mb", 512)) * 1024 * 1024,
              model_name=spec.model_name)

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
        try:
            self.node.state.write("stopped")
        except OSError as exc:
            logger.warning("could not write %s: %s", self.node.state.path, exc)


def make_group(spec: TeacherSpec, master_port: Optional[int] = None) -> Any:
    """The teacher group of ``spec``, built by ``PODIUM_GROUP_FACTORY`` (default the Megatron one).

    A factory that takes ``cluster`` hints gets ``master_port_range`` = the port this node's
    block reserves for the group's ``torch.distributed`` rendezvous (checked free on all
    addresses, outside Ray's ports), so that port is chosen explicitly too.
    """
    target = os.environ.get("PODIUM_GROUP_FACTORY") or DEFAULT_GROUP_FACTORY
    module, _, attr = target.partition(":")
    factory: Callable[..., Any] = getattr(importlib.import_module(module), attr)
    logger.info("building the teacher group with %s", target)
    try:
        takes_cluster = "cluster" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        takes_cluster = False
    if master_port is not None and takes_cluster:
        return factory(spec, cluster={"master_port_range": (master_port, master_port)})
    return factory(spec)


def main(argv: list[str] | None = None) -> None:
    """``python -m podium.launcher.node_entry TEACHER_DIR`` (what a rendered sbatch script runs)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m podium.launcher.node_entry TEACHER_DIR")
    run_node(args[0])


if __name__ == "__main__":
    main()
