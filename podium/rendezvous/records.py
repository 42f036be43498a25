"""The endpoint record: where one teacher is, how it is, and which generation says so.

Owns the record's schema (:class:`EndpointRecord`), generations (:class:`Generation`: Slurm job id
+ restart count, totally ordered), the single writer a teacher's head process uses
(:class:`RecordWriter`, with generation fencing), its heartbeat thread (:class:`Heartbeat`), and the
tolerant reader (:func:`read_record`) trainers use. Staleness is a reader's judgement
(:meth:`EndpointRecord.is_stale`), to be confirmed with a health probe before acting on it.

Status values, in the order a healthy teacher passes through them::

    pending -> starting -> loading -> ready -> draining -> stopped
                                  \\-> failed (with a reason), from any state
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from podium.rendezvous.atomic import atomic_write_json, parse_model, read_json, try_read_json
from podium.rendezvous.layout import ENDPOINT_MODE
from podium.rendezvous.schema import VersionedFile

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # of the endpoint record (see EndpointRecord)
# The reason ``podium down`` writes in a record its job could not mark stopped itself
# (podium.launcher.login.stop; it spells the same text).
STOPPED_BY_DOWN = "podium down"


class Status(str, enum.Enum):
    PENDING = "pending"
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, order=True)
class Generation:
    """One incarnation of a teacher: Slurm job id, then restart count (``SLURM_RESTART_COUNT``).

    Ordered by (job_id, restart): a requeued job keeps its id and counts up; a new submission gets a
    larger job id. Off Slurm the launcher must supply a job id that grows with each submission.
    """

    job_id: int
    restart: int = 0

    def __post_init__(self) -> None:
        if int(self.job_id) < 0 or int(self.restart) < 0:
            raise ValueError(f"generation {self.job_id}:{self.restart}: must be non-negative")

    def __str__(self) -> str:
        return f"{self.job_id}:{self.restart}"

    @classmethod
    def parse(cls, text: str) -> Generation:
        """Inverse of ``str()``: ``"12345:2"`` (``"12345"`` means restart 0)."""
        job, _, restart = str(text).strip().partition(":")
        try:
            return cls(int(job), int(restart or 0))
        except ValueError:
            raise ValueError(f"not a generation: {text!r} (expected JOBID:RESTART)") from None


class ModelInfo(BaseModel):
    """What the teacher serves; also returned by ``GET /v2/models/<name>``."""

    model_config = ConfigDict(frozen=True, extra="allow")

    served_name: str
    model_name: str | None = None
    checkpoint_path: str | None = None
    vocab_size: int
    max_sequence_length: int | None = None
    sequence_length_multiple: int = 1
    data_parallel_size: int = 1  # replicas of the model inside the teacher (NeMo RL pads rows to it)
    temperature: float = 1.0  # what the teacher divides its logits by, unless a request says otherwise
    parallel_sizes: dict[str, int] = Field(default_factory=dict)  # Megatron names: tensor_model_parallel_size, ...
    tokenizer_fingerprint: str | None = None
    tokenizer_vocab_size: int | None = None


class RestartInfo(BaseModel):
    """What the launcher decided when a generation ended (``podium.launcher.common.restarts``), as the
    record carries it for ``podium status`` and trainers."""

    model_config = ConfigDict(frozen=True, extra="allow")

    requeue: bool = False
    final: bool = False
    delay_s: float = 0.0
    why: str = ""
    consecutive_failures: int = 0
    requeues: int = 0
    max_consecutive_failures: int | None = None


# Fields schema 1 kept in ``extra``; schema 2 has them as fields of their own.
_LIFTED_FROM_EXTRA = ("final", "will_retry", "restart", "timings")


class EndpointRecord(VersionedFile):
    """The content of ``teachers/<name>-<key8>[-r<i>]/endpoint.json``.

    Schema 2 (this one) made ``final``, ``will_retry``, ``restart`` and ``timings`` fields of their
    own; a schema 1 record (they sat in ``extra``) reads as schema 2, and a newer one is refused."""

    SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION
    DESCRIPTION: ClassVar[str] = "an endpoint record"
    model_config = ConfigDict(frozen=True, extra="allow")

    teacher_key: str
    teacher_name: str
    aliases: tuple[str, ...] = ()
    replica: int = Field(default=0, ge=0)  # which of the teacher's independent allocations this is
    status: Status
    reason: str | None = None
    url: str | None = None
    generation: Generation
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    model: ModelInfo | None = None
    # The writer's promise: a record whose heartbeat is older than this is stale (server.stale_after_s).
    stale_after_s: float | None = None
    # How a generation that ended (failed or stopped) goes on: the launcher's verdict.
    final: bool | None = None  # True: no generation of this replica comes back
    will_retry: bool | None = None  # True: the job requeues (after restart.delay_s)
    restart: RestartInfo | None = None
    timings: dict[str, float] = Field(default_factory=dict)  # first time of each status/event (epoch s)
    extra: dict[str, Any] = Field(default_factory=dict)  # anything else a writer adds (not read by podium)

    @model_validator(mode="before")
    @classmethod
    def _from_schema_1(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("extra"), dict):
            extra = dict(data["extra"])
            lifted = {name: extra.pop(name) for name in _LIFTED_FROM_EXTRA if name in extra and name not in data}
            if lifted:
                data = {**data, **lifted, "extra": extra}
        return data

    def failure_is_final(self) -> bool:
        """Whether this record says no generation of its replica will come back: ``failed`` and
        either ``final`` (the launcher's verdict) or, without a verdict, no ``will_retry``.

        The one rule: ``podium status``/``wait`` and the trainer's client all ask it."""
        if self.status is not Status.FAILED:
            return False
        if self.final is not None:
            return self.final
        return not self.will_retry

    def stopped_for_good(self) -> bool:
        """Whether this record says its replica was stopped and nothing brings it back by itself:
        ``stopped`` with the job's verdict that it does not requeue (``will_retry`` False: ``podium
        down``, ``scancel``, a time limit that stops), or the mark ``podium down`` writes where the
        job could not (:data:`STOPPED_BY_DOWN`, no verdict). A preempted generation says
        ``will_retry`` and a record without a verdict may be followed by a next generation: neither
        is stopped for good. A call to such a teacher fails at once instead of waiting for it."""
        if self.status is not Status.STOPPED:
            return False
        if self.will_retry is not None:
            return not self.will_retry
        return self.reason == STOPPED_BY_DOWN

    def stopped_at(self) -> float:
        """When it was stopped (epoch s): the first ``stopped`` of its timings, else its last write."""
        return self.timings.get(Status.STOPPED.value, self.heartbeat_at)

    def age(self, now: float | None = None) -> float:
        """Seconds since the last heartbeat."""
        return (time.time() if now is None else now) - self.heartbeat_at

    def is_stale(self, stale_after_s: float | None = None, now: float | None = None) -> bool:
        """No heartbeat for ``stale_after_s`` (default: the record's own): the writer may be gone;
        confirm with a health probe. A record that promises nothing is never judged stale."""
        limit = stale_after_s if stale_after_s is not None else self.stale_after_s
        return limit is not None and self.age(now) > limit

    def describe(self) -> str:
        """One line for errors and logs."""
        replica = f" replica {self.replica}" if self.replica else ""
        text = (f"teacher {self.teacher_name!r} ({self.teacher_key}){replica} generation {self.generation}: "
                f"{self.status.value}")
        if self.reason:
            text += f" ({self.reason})"
        if self.url:
            text += f" at {self.url}"
        return text

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["generation"] = {"job_id": self.generation.job_id, "restart": self.generation.restart}
        return data


def parse_record(data: Any, path: str | Path) -> EndpointRecord:
    """Validate decoded JSON as a record; a bad shape is a :class:`FileReadError` (corrupt)."""
    return parse_model(EndpointRecord, data, path, "an endpoint record")


def read_record(path: str | Path) -> EndpointRecord:
    """The record at ``path``, or :class:`FileReadError` naming the path and the problem."""
    return parse_record(read_json(path), path)


class StaleGenerationError(RuntimeError):
    """This writer's generation is older than the record on disk: it must stop writing."""

    def __init__(self, path: Path, mine: Generation, theirs: Generation) -> None:
        self.path = path
        self.mine = mine
        self.theirs = theirs
        super().__init__(
            f"{path}: generation {mine} must not overwrite the record of newer generation {theirs}; "
            "this process is stale and stops publishing"
        )


class RecordWriter:
    """The one writer of one teacher's endpoint record (the teacher's head process).

    Every write replaces the whole file atomically (mode 0600) and is fenced: it reads the record on
    disk first and again after the temp file is durable, just before the rename, and refuses
    (:class:`StaleGenerationError`, after which every later write refuses at once) when that record
    belongs to a newer generation. An unreadable or corrupt record on disk is overwritten: writing
    is how it heals.

    Remaining race: a newer generation can replace the file in the instant between our final
    re-read and our rename, and our rename then clobbers its record. We accept it because (1) Slurm
    starts the next generation only after the previous job's processes were signalled, so two
    live writers overlap only when an old process lingers; (2) the window is one rename, against a
    heartbeat interval of seconds; (3) the newer writer rewrites its record on every heartbeat, so
    the damage heals within one interval, and the old writer, re-reading before each write, sees the
    newer generation then and stops for good; (4) readers confirm with a health probe and the
    server reports its own generation, so a client is never misled for long. Closing the window
    for real needs a lock or compare-and-swap, which shared filesystems do not offer reliably.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        teacher_key: str,
        teacher_name: str,
        generation: Generation,
        aliases: tuple[str, ...] | list[str] = (),
        replica: int = 0,
        stale_after_s: float | None = None,
        host: str | None = None,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.generation = generation
        self._clock = clock
        self._lock = threading.Lock()
        self._fenced: StaleGenerationError | None = None
        now = clock()
        self._record = EndpointRecord(
            teacher_key=teacher_key,
            teacher_name=teacher_name,
            aliases=tuple(aliases),
            replica=replica,
            status=Status.PENDING,
            generation=generation,
            host=host or socket.gethostname(),
            pid=os.getpid() if pid is None else pid,
            started_at=now,
            heartbeat_at=now,
            stale_after_s=stale_after_s,
        )

    @classmethod
    def resume(cls, path: str | Path, record: EndpointRecord, *,
               clock: Callable[[], float] = time.time) -> RecordWriter:
        """A writer for ``record``'s generation that continues from it (host, pid, start kept): how
        a second process (``podium down``) writes a record it did not start, fenced like the first."""
        writer = cls(path, teacher_key=record.teacher_key, teacher_name=record.teacher_name,
                     generation=record.generation, host=record.host, pid=record.pid, clock=clock)
        writer._record = record
        return writer

    @property
    def record(self) -> EndpointRecord:
        """The record as last written (or about to be first written)."""
        return self._record

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    def _check_fence(self) -> None:
        found = try_read_json(self.path)
        if not found.ok:
            if found.error is not None and found.error.kind != "missing":
                logger.warning("overwriting unreadable endpoint record: %s", found.error)
            return
        data = found.data
        gen = data.get("generation") if isinstance(data, dict) else None
        if not isinstance(gen, dict):
            logger.warning("%s: record without a generation, overwriting it", self.path)
            return
        try:
            theirs = Generation(int(gen["job_id"]), int(gen.get("restart", 0)))
        except (KeyError, TypeError, ValueError):
            logger.warning("%s: record with a malformed generation %r, overwriting it", self.path, gen)
            return
        key = data.get("teacher_key")
        if key is not None and key != self._record.teacher_key:
            raise ValueError(
                f"{self.path}: holds the record of teacher key {key!r}, not {self._record.teacher_key!r}"
            )
        if theirs > self.generation:
            self._fenced = StaleGenerationError(self.path, self.generation, theirs)
            raise self._fenced

    def _write(self, record: EndpointRecord) -> EndpointRecord:
        if self._fenced is not None:
            raise self._fenced
        self._check_fence()
        atomic_write_json(self.path, record.to_json(), mode=ENDPOINT_MODE, before_replace=self._check_fence)
        self._record = record
        return record

    def publish(
        self,
        status: Status | str,
        *,
        reason: str | None = None,
        url: str | None = None,
        model: ModelInfo | Mapping[str, Any] | None = None,
        final: bool | None = None,
        will_retry: bool | None = None,
        restart: RestartInfo | None = None,
        timings: Mapping[str, float] | None = None,
        **extra: Any,
    ) -> EndpointRecord:
        """Write a new status (and URL, model, timings when given; earlier ones are kept otherwise).

        ``final``/``will_retry``/``restart`` are the verdict on a generation that ended; they are
        written as given (None clears them), so a new status never carries an old verdict."""
        status = Status(status)
        if status is Status.FAILED and not reason:
            raise ValueError("status 'failed' needs a reason")
        with self._lock:
            changes: dict[str, Any] = {"status": status, "reason": reason, "heartbeat_at": self._clock(),
                                       "final": final, "will_retry": will_retry, "restart": restart}
            if url is not None:
                changes["url"] = url
            if model is not None:
                changes["model"] = model if isinstance(model, ModelInfo) else ModelInfo.model_validate(dict(model))
            if timings is not None:
                changes["timings"] = dict(timings)
            if extra:
                changes["extra"] = {**self._record.extra, **extra}
            record = self._record.model_copy(update=changes)
            logger.info("publishing %s", record.describe())
            return self._write(record)

    def heartbeat(self) -> EndpointRecord:
        """Rewrite the record with a fresh ``heartbeat_at``."""
        with self._lock:
            return self._write(self._record.model_copy(update={"heartbeat_at": self._clock()}))


class Heartbeat:
    """A daemon thread calling ``writer.heartbeat()`` every ``interval_s`` until stopped.

    Any other error (a filesystem hiccup) is logged and retried at the next tick; being
    fenced by a newer generation stops the thread and calls ``on_fenced`` once.
    """

    def __init__(
        self,
        writer: RecordWriter,
        interval_s: float,
        *,
        on_fenced: Callable[[StaleGenerationError], None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be > 0, got {interval_s}")
        self.writer = writer
        self.interval_s = interval_s
        self.on_fenced = on_fenced
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="podium-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.writer.heartbeat()
            except StaleGenerationError as exc:
                logger.error("heartbeat stopped: %s", exc)
                if self.on_fenced is not None:
                    self.on_fenced(exc)
                return
            except Exception as exc:  # a shared filesystem hiccups: keep beating
                logger.warning("heartbeat of %s failed, retrying in %.1fs: %s", self.writer.path, self.interval_s, exc)
