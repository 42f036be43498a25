"""Ray on one node of a teacher job: per-job temp dir, auth token, start and stop by PID.

Temp dirs: ``<ray.temp_dir_root>/podium-u<uid>/podium-<job>-<restart>-<rank>``, under a parent
that is the user's own (0700, ownership checked: :func:`private_temp_root`).

The node's address and its block of ports: :mod:`podium.launcher.common.ray_ports`.

``ray start --block`` runs as a child process in a session of its own, with the stop signals
(SIGTERM, SIGINT, USR1, USR2) blocked: Slurm signals every process of a job step, and a raylet
that dies of the preemption signal or of a cancel's SIGTERM takes the head's driver (and so the
drain, the record and the cleanup) down with it (see :mod:`podium.launcher.common.procs`). The node task
ends its Ray when it is done, by session (every Ray process of the node is a member of the session
whose id is the recorded ``ray start`` PID): SIGKILL to each member, in well under a second, so a
teardown fits in Slurm's ``KillWait``. The head's driver disconnects (``ray.shutdown``) before
that. Nothing here runs ``ray stop``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from podium.launcher.common.procs import ProcRef, kill_session, stop_signals_blocked
from podium.launcher.common.ray_ports import RayPorts, RayStartError, bind_failed
from podium.launcher.job.exits import clean_cause, describe_death, read_tail

logger = logging.getLogger(__name__)

RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    # The GCS marks a node whose raylet is gone (its checks fail at once) dead after 5 failed
    # checks 1 s apart (Ray's defaults take 15-30 s): the head's watchdog then sees a lost node in
    # ~5 s. A raylet that is only slow (a starved CPU) gets 3 s per check, so a loaded node is not
    # taken for a lost one (1 s and 3 checks did that on the 2-core test machine under load).
    "RAY_health_check_initial_delay_ms": "2000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "3000",
    "RAY_health_check_failure_threshold": "5",
}
AUTH_TOKEN_BYTES = 32
STARTED_MARK = "Ray runtime started."  # what `ray start` logs once the node's daemons are up
# What `ray start` says when its node missed one of Ray's fixed start limits: its raylet not
# registered with the GCS within 30 s (ray/_private/node.py). A raylet that gave up first, after
# its own fixed 15 s wait for the dashboard agent's ports, ends the same way (`ray start` names
# only the 30 s): both are a starved or slow node (an agent's Python imports on 2 loaded cores or
# from a slow shared filesystem), not a bad setting, and a second try usually starts.
START_LIMIT_MARK = "The current node timed out during startup"
# The raylet's fatal log line (``[<time> C <pid> <tid>] (raylet) <where>: <message>``) and the
# frame that says it was the wait for the agent.
_RAYLET_FATAL = re.compile(r"^\[[^\]]* C \d+ \d+\] \(raylet\) (.*)$", re.MULTILINE)
_AGENT_PORTS_WAIT = "WaitForDashboardAgentPorts"
FS_CLOCK_SLACK_S = 1.0
BIND_CHECK_S = 1.0  # how often a starting node reads its daemons' logs for a port taken under them


def write_auth_token(path: Path) -> Path:
    """A new Ray auth token for one generation, in a 0600 file (never on a command line): every
    node of the job and the head's driver present it (``RAY_AUTH_MODE=token``), and Ray refuses
    any other process that reaches the job's ports."""
    import secrets

    from podium.rendezvous.atomic import atomic_write_bytes

    atomic_write_bytes(path, secrets.token_hex(AUTH_TOKEN_BYTES).encode(), mode=0o600)
    return path


def auth_env(token_path: Path) -> dict[str, str]:
    """The environment that makes a Ray process (node or driver) use the job's token."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}


PRIVATE_DIR_MODE = 0o700


def temp_dir(parent: str | Path, job_id: int | str, restart: int, rank: int) -> Path:
    """Per-job, per-node Ray temp dir in ``parent`` (:func:`private_temp_root`; short: Ray's socket
    paths must stay under 108 bytes)."""
    return Path(parent) / f"podium-{job_id}-{restart}-{rank}"


def private_temp_name() -> str:
    """``podium-u<uid>``: the name of this user's parent of its Ray temp dirs."""
    return f"podium-u{os.getuid()}"


def private_temp_root(root: str | Path) -> Path:
    """This user's parent of its Ray temp dirs in ``root`` (``ray.temp_dir_root``, a shared ``/tmp``):
    a directory it owns, mode 0700, not a link; created when missing. When that name is taken by
    someone else (another user's directory, a link) a fresh private one (``mkdtemp``) is used, so no
    other user can make ``ray start`` fail, or reach its sockets, by creating a path first."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    path = base / private_temp_name()
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
        if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
            os.chmod(path, PRIVATE_DIR_MODE)
        return path
    fresh = Path(tempfile.mkdtemp(prefix=f"{private_temp_name()}-", dir=base))
    logger.warning("%s is not this user's private directory (owner uid %d, %s): Ray's temp dirs go to %s",
                   path, info.st_uid, "a link" if stat.S_ISLNK(info.st_mode) else f"mode {info.st_mode & 0o777:o}",
                   fresh)
    return fresh


def ray_executable() -> list[str]:
    candidate = Path(sys.executable).parent / "ray"
    if candidate.exists():
        return [str(candidate)]
    found = shutil.which("ray")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def start_command(*, head: bool, ip: str, ports: RayPorts, temp: Path, num_cpus: int,
                  num_gpus: int = 0, head_address: str | None = None,
                  object_store_memory_mb: int | None = None) -> list[str]:
    cmd = [*ray_executable(), "start", "--block", "--disable-usage-stats",
           f"--node-ip-address={ip}", f"--temp-dir={temp}",
           f"--node-manager-port={ports.node_manager}", f"--object-manager-port={ports.object_manager}",
           f"--metrics-export-port={ports.metrics_export}",
           f"--dashboard-agent-grpc-port={ports.dashboard_agent_grpc}",
           f"--dashboard-agent-listen-port={ports.dashboard_agent_listen}",
           f"--runtime-env-agent-port={ports.runtime_env_agent}",
           f"--min-worker-port={ports.min_worker}", f"--max-worker-port={ports.max_worker}",
           f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}"]
    if object_store_memory_mb:
        cmd.append(f"--object-store-memory={object_store_memory_mb * 1024 * 1024}")
    if head:
        cmd += ["--head", f"--port={ports.gcs}", f"--ray-client-server-port={ports.ray_client_server}",
                "--include-dashboard=false", f"--dashboard-port={ports.dashboard}"]
    else:
        if not head_address:
            raise ValueError("a Ray worker node needs the head's address")
        cmd.append(f"--address={head_address}")
    return cmd


# A token in the environment wins over RAY_AUTH_TOKEN_PATH: a user's own (for their Ray elsewhere)
# would become the job's, so the job's processes never inherit one.
INHERITED_TOKEN_VARS = ("RAY_AUTH_TOKEN",)


def use_ray_env(environ: MutableMapping[str, str], token_path: Path | None = None) -> None:
    """``environ`` made the environment of one of this job's Ray processes (node or driver): podium's
    Ray settings and, with ``token_path``, the job's token instead of any token it inherited."""
    environ.update(RAY_ENV)
    if token_path is not None:
        for name in INHERITED_TOKEN_VARS:
            environ.pop(name, None)
        environ.update(auth_env(token_path))


def ray_env(base: Mapping[str, str] | None = None, token_path: Path | None = None) -> dict[str, str]:
    """A copy of ``base`` (default: this process's environment) as :func:`use_ray_env` makes it."""
    env = dict(os.environ if base is None else base)
    use_ray_env(env, token_path)
    return env


def raylet_cause(temp: Path, since: float = 0.0) -> str | None:
    """Why the raylet of the newest Ray session under ``temp`` died, in a phrase, when its log has
    a fatal line (``ray start`` itself only reports that the node did not register in time). Only
    a session made at or after ``since`` (a time): an earlier try's is not this one's cause."""
    session = temp / "session_latest"
    try:
        # A file's times come from the kernel's coarse clock, a tick behind time.time(): a session
        # made just after ``since`` can read as made just before it.
        if session.stat().st_mtime < since - FS_CLOCK_SLACK_S:
            return None
    except OSError:
        return None
    text = read_tail(session / "logs" / "raylet.out")
    found = _RAYLET_FATAL.search(text)
    if found is None:
        return None
    if _AGENT_PORTS_WAIT in text[found.start():]:
        return ("its raylet gave up waiting for the node's dashboard agent (Ray's fixed 15 s: a starved "
                "or slow node)")
    return f"its raylet died: {clean_cause(found.group(1))}"


# The session logs of the daemons that bind the block's ports (the GCS on the head, the raylet).
BINDING_LOGS = ("gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err")


def session_logs(temp: Path, since: float = 0.0) -> str:
    """The tails of :data:`BINDING_LOGS` of the newest Ray session under ``temp``, when it was made
    at or after ``since`` (another try's session is not this one's)."""
    session = temp / "session_latest"
    try:
        if session.stat().st_mtime < since - FS_CLOCK_SLACK_S:
            return ""
    except OSError:
        return ""
    return "\n".join(read_tail(session / "logs" / name) for name in BINDING_LOGS)


class RayNodeProcess:
    """One ``ray start --block`` child of this node task (own session, stop signals blocked)."""

    def __init__(self, cmd: list[str], log_path: Path, token_path: Path | None = None,
                 temp: Path | None = None, extra_env: Mapping[str, str] | None = None) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.temp = temp  # its --temp-dir, where the raylet's own log says why it died
        self.started_at = time.time()  # a session in ``temp`` older than this is another try's
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: the log names the node's address and ports
        self._log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        logger.info("starting Ray: %s (log %s)", " ".join(cmd), log_path)
        with stop_signals_blocked():  # inherited by every Ray process of this node
            # stdin from /dev/null, output to its log: Ray holds nothing of whoever started the task
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                         env={**ray_env(token_path=token_path), **(extra_env or {})},
                                         start_new_session=True)
        self.ref = ProcRef.of(self.proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe_exit(self) -> str:
        """One line: how ``ray start`` ended, the first line of its log that says why (and its
        raylet's, when that one died), the log."""
        detail = raylet_cause(self.temp, since=self.started_at) if self.temp is not None else None
        return describe_death("`ray start`", self.pid, self.proc.returncode, self.log_path, detail=detail)

    def missed_start_limit(self) -> bool:
        """Whether ``ray start`` ended because its node missed one of Ray's fixed start limits
        (:data:`START_LIMIT_MARK`): worth another try, unlike any other death."""
        return not self.alive() and START_LIMIT_MARK in read_tail(self.log_path)

    def ports_taken(self) -> bool:
        """Whether a port of its block was taken under this ``ray start`` (by another user's
        process, between the block's check and the bind): worth another try on another block.
        Its daemon says so in its log at once; ``ray start`` itself only after Ray's 30 s."""
        logs = read_tail(self.log_path)
        if self.temp is not None:
            logs += session_logs(self.temp, since=self.started_at)
        return bind_failed(logs)

    def wait_started(self, timeout_s: float, stop: threading.Event | None = None) -> float:
        """Seconds until ``ray start`` says the node runs (every daemon of it up, the raylet
        registered), or until ``stop`` is set: a driver that connects earlier gives up after Ray's
        own 60 s, which a loaded node's start can take (seen on the 2-core test machine).
        ``RayStartError`` when ``ray start`` dies first or the time runs out."""
        t0 = time.monotonic()
        next_bind_check = t0 + BIND_CHECK_S
        while stop is None or not stop.is_set():
            try:
                if STARTED_MARK in self.log_path.read_text(errors="replace"):
                    return time.monotonic() - t0
            except OSError:
                pass
            if not self.alive():
                raise RayStartError(self.describe_exit())
            if time.monotonic() >= next_bind_check:
                next_bind_check = time.monotonic() + BIND_CHECK_S
                if self.ports_taken():
                    raise RayStartError(f"`ray start` (pid {self.pid}): a port of its block was taken before its "
                                        f"daemons bound it; log {self.log_path}")
            if time.monotonic() - t0 > timeout_s:
                raise RayStartError(f"`ray start` (pid {self.pid}) did not report the node started within "
                                    f"{timeout_s:.0f}s; log {self.log_path}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self, timeout_s: float = 10.0) -> list[int]:
        """End every Ray process of this node (SIGKILL by session); returns PIDs that survived.

        Only the session this task started: its ``ray start`` and whatever Ray started under it.
        """
        t0 = time.monotonic()
        survivors = kill_session(self.ref, timeout_s, not_reaped=[self.pid])
        try:
            self.proc.wait(max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            survivors = sorted({*survivors, self.pid})
        if not self._log.closed:
            self._log.close()
        logger.info("Ray (session %d) ended in %.2fs%s", self.pid, time.monotonic() - t0,
                    f"; still alive: {survivors}" if survivors else "")
        return survivors
