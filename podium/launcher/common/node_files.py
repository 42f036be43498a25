"""The files the node tasks of one generation hand each other, typed: ``<rank>.json`` and ``head.json``.

Both live in ``nodes/<job>-<restart>/`` (paths: :class:`podium.launcher.common.files.TeacherFiles`), are
replaced whole (atomic write, mode 0600: they name addresses and ports) and have one writer each:

===============  ===================================  ==============================================
file             written by                           read by
===============  ===================================  ==============================================
``<rank>.json``  that rank's task (:class:`NodeStateWriter`)  the head (a worker that failed at start,
                                                      or while it serves: the watchdog), the workers
                                                      (the head failed, or is done), the sweep of
                                                      ended generations (:mod:`podium.launcher.common.cleanup`)
``head.json``    rank 0, once its GCS answers         the worker ranks: where to join, with which token
===============  ===================================  ==============================================

A task's state (:class:`NodeStatus`), in the order it passes through them::

    starting -> ray_starting -> started -> serving (rank 0) -> stopped (rank 0) -> ended
          \\-> failed (with ``error``), from any state; it stays failed once torn down

A task in a :data:`DONE_STATES` state no longer needs the Ray of the job's other nodes, and no
longer serves: the head's group and driver are down (``stopped``), or its teardown ran (``ended``),
or it failed.

Readers go through :func:`try_read_node_state` / :func:`try_read_head` (never the raw JSON): a
missing or damaged file reads as "not there yet", and a file of a newer schema than this podium
reads is an error that names the file and both versions.
"""

from __future__ import annotations

import enum
import os
import time
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from podium.launcher.common.procs import ProcRef
from podium.rendezvous.atomic import NEWER, FileReadError, atomic_write_json, parse_model, read_json
from podium.rendezvous.schema import VersionedFile

ADDRESS_FILE_MODE = 0o600  # files that name a node's address and ports: the owner's only


class NodeStatus(str, enum.Enum):
    STARTING = "starting"
    RAY_STARTING = "ray_starting"
    STARTED = "started"
    SERVING = "serving"
    STOPPED = "stopped"
    ENDED = "ended"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


DONE_STATES = frozenset({NodeStatus.STOPPED, NodeStatus.ENDED, NodeStatus.FAILED})


class RecordedProc(BaseModel):
    """A process as a node state records it (:class:`podium.launcher.common.procs.ProcRef`)."""

    model_config = ConfigDict(frozen=True)

    pid: int
    start: int | None = None

    @property
    def ref(self) -> ProcRef:
        return ProcRef(self.pid, self.start)


class NodeState(VersionedFile):
    """The content of ``nodes/<job>-<restart>/<rank>.json``: one node task of one generation."""

    SCHEMA_VERSION: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "a node state"
    model_config = ConfigDict(frozen=True, extra="ignore")

    state: NodeStatus
    rank: int
    host: str
    pid: int | None = None  # the node task's own process (with pid_start: its start time)
    pid_start: int | None = None
    generation: str | None = None  # "job:restart"
    started_at: float | None = None
    time: float | None = None  # of this write
    ip: str | None = None  # the address this node's Ray uses
    ports: dict[str, int] | None = None  # its block of Ray ports (ray_ports.RayPorts.to_dict)
    temp: str | None = None  # its Ray temp dir
    log: str | None = None  # the task's log
    ray: RecordedProc | None = None  # its `ray start` session's leader
    ray_attempt: int | None = None  # which try of its `ray start` that is (ray.start_attempts)
    url: str | None = None  # rank 0, serving: the endpoint
    error: str | None = None  # failed: what failed, naming the node
    stop: str | None = None  # torn down after a stop: why it stopped
    ended_at: float | None = None
    teardown_s: float | None = None
    survivors: list[int] = Field(default_factory=list)  # processes of its Ray that outlived SIGKILL

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES

    @property
    def task(self) -> ProcRef | None:
        return ProcRef(self.pid, self.pid_start) if self.pid else None

    @property
    def temp_dir(self) -> Path | None:
        return Path(self.temp) if self.temp else None


class HeadFile(VersionedFile):
    """The content of ``nodes/<job>-<restart>/head.json``: where this generation's Ray head is."""

    SCHEMA_VERSION: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "a Ray head file"
    model_config = ConfigDict(frozen=True, extra="ignore")

    address: str  # ip:gcs_port
    generation: str  # "job:restart"
    host: str
    ports: dict[str, int]
    token_path: str  # the generation's Ray auth token (0600)
    time: float


class NodeStateWriter:
    """This task's ``<rank>.json``: only this task writes it, each write the whole state so far."""

    def __init__(self, path: Path, *, rank: int, host: str, generation: str) -> None:
        self.path = path
        me = ProcRef.of(os.getpid())
        self._fields: dict[str, Any] = {"rank": rank, "host": host, "pid": me.pid, "pid_start": me.start,
                                        "generation": generation, "started_at": time.time()}
        self.last: NodeState | None = None

    @property
    def error(self) -> str | None:
        return self._fields.get("error")

    def write(self, state: NodeStatus, **fields: Any) -> NodeState:
        """Record ``state`` with ``fields`` added to (or replacing) those written before."""
        self._fields.update(fields)
        node = NodeState(state=state, **self._fields, time=time.time())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, node.model_dump(mode="json"), mode=ADDRESS_FILE_MODE)
        self.last = node
        return node


def write_head(path: Path, head: HeadFile) -> None:
    atomic_write_json(path, head.model_dump(mode="json"), mode=ADDRESS_FILE_MODE)


ModelT = TypeVar("ModelT", bound=VersionedFile)


def _try_read(model: type[ModelT], path: Path) -> ModelT | None:
    """The file as ``model``; None while it is missing or damaged (written again soon, or never);
    :class:`FileReadError` (kind ``newer``) when a newer podium wrote it."""
    try:
        return parse_model(model, read_json(path), path, model.DESCRIPTION)
    except FileReadError as exc:
        if exc.kind == NEWER:
            raise
        return None


def read_node_state(path: Path) -> NodeState:
    """The node state at ``path``; :class:`FileReadError` naming the file when it cannot be."""
    return parse_model(NodeState, read_json(path), path, NodeState.DESCRIPTION)


def try_read_node_state(path: Path) -> NodeState | None:
    return _try_read(NodeState, path)


def try_read_head(path: Path) -> HeadFile | None:
    return _try_read(HeadFile, path)
