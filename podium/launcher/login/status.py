"""What ``podium status`` and ``podium wait`` see: one :class:`TeacherStatus` row per replica.

Owns the status view: each replica's job (``job.json``), what Slurm says of it, its endpoint record
and, for a ready one, a probe of its health and its ``/metrics``; and ``wait``, which polls that
view until every planned teacher is ready or one has failed for good. Reads only: the run directory
and the scheduler. Light imports only: no torch, no ray.

``wait`` reads the records every :data:`WAIT_POLL_S` but asks the scheduler (``squeue``/``sacct``,
which many waiting trainers would otherwise load) only every :data:`WAIT_SLURM_POLL_S`, doubling
up to :data:`WAIT_SLURM_MAX_POLL_S` (:class:`SchedulerPolls`); a record that changes, or a job it
has not asked about yet, has it asked at the next look.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podium.config.spec import display_name
from podium.launcher.backends import job_states
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.slurm_state import JobState
from podium.launcher.login.run_dir import known_teachers
from podium.poll import PollTimeout, poll_until
from podium.protocol.names import HEALTH_LIVE, METRICS, OPENAI_BASE
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.manifest import read_rendezvous
from podium.rendezvous.records import EndpointRecord, Generation, Status, read_record
from podium.rendezvous.token import read_token

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0  # a ready endpoint's /health/live and /metrics answer within this, or count as not
WAIT_POLL_S = 0.5  # `wait`: how often it reads the records of every teacher
WAIT_SLURM_POLL_S = 2.0  # `wait`: the scheduler is asked this often at first ...
WAIT_SLURM_MAX_POLL_S = 16.0  # ... the interval doubling up to this


@dataclass
class TeacherStatus:
    """One row of ``podium status``."""

    name: str
    key: str
    aliases: tuple[str, ...]
    replica: int = 0  # which of the teacher's independent allocations this row is
    temperature: float = 1.0  # what the teacher divides its logits by (its record's, else its spec's)
    job_id: str | None = None
    cluster: str = ""
    slurm_state: str = "NOT SUBMITTED"
    job_kind: str = "none"  # pending | running | done | none
    generation: str | None = None  # of the endpoint record: "<job id>:<restart>"
    restarts: int | None = None  # Slurm's restart count of the job (while Slurm lists it)
    status: str = "pending"  # endpoint record status, or pending when there is none yet
    reason: str | None = None
    url: str | None = None
    health: bool | None = None  # probed /v2/health/live
    heartbeat_age_s: float | None = None
    submitted_at: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    restart: dict[str, Any] = field(default_factory=dict)  # the restart decision the record carries
    # a failed record: True when the teacher gave up, False when it retries (EndpointRecord.failure_is_final)
    final: bool | None = None
    in_plan: bool = True  # listed in rendezvous.json (a teacher of the recipe, a replica clients use)
    # From the endpoint's /metrics (podium.teacher.endpoint.metrics.summary): tokens/s and answer bytes/s
    # (bytes_out_per_s_1m) over the last minute, queue depth, padding share, requests, errors; None
    # when not probed or not answering.
    load: dict[str, float] | None = None
    # Why this replica is slow beside the teacher's others (its latest batches, by the
    # client's rule: podium.client.routing.is_slow), else None.
    slow: str | None = None

    @property
    def display(self) -> str:
        """The teacher's name, ``name#i`` for replica i >= 1 (:func:`podium.config.spec.display_name`)."""
        return display_name(self.name, self.replica)

    @property
    def base_url(self) -> str | None:
        """The ``base_url`` an OpenAI client (vLLM's scoring calls) is given: the endpoint's URL +
        ``/v1``; None while it has no endpoint."""
        return self.url + OPENAI_BASE if self.url else None

    @property
    def ready(self) -> bool:
        return (self.status == "ready" and self.job_kind == "running" and self.health is not False
                and not self.superseded)

    @property
    def record_restart(self) -> int | None:
        """The restart count of the generation the endpoint record belongs to."""
        if self.generation is None:
            return None
        return Generation.parse(self.generation).restart

    @property
    def superseded(self) -> bool:
        """The record belongs to an earlier run of a job Slurm has requeued since (it comes back)."""
        return (self.restarts is not None and self.record_restart is not None
                and self.record_restart < self.restarts)

    @property
    def failed(self) -> bool:
        """Failed for good: the job is over, or its record failed with no retry to come."""
        if self.job_kind == "done":
            return self.job_id is not None
        if self.status == "failed":
            coming_back = self.superseded or self.final is False
            return not (coming_back and self.job_kind in ("pending", "running"))
        return False

    @property
    def phase(self) -> str:
        """What ``--wait`` shows: Slurm state until the job runs, then the endpoint status."""
        requeued = f"requeued ×{self.restarts}, " if self.restarts else ""
        if self.job_kind in ("pending", "none"):
            return f"{requeued}{self.slurm_state.lower()}" if requeued else self.slurm_state.lower()
        if self.job_kind == "done":
            return f"{self.slurm_state.lower()} ({self.status})"
        if self.superseded:
            return f"{requeued}starting"
        if self.status == "failed" and self.final is False:
            return f"failed, retrying ({self.restart.get('why', 'requeued')})"
        return self.status

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "replica": self.replica, "aliases": list(self.aliases),
                "temperature": self.temperature,
                "job_id": self.job_id,
                "cluster": self.cluster, "slurm_state": self.slurm_state, "generation": self.generation,
                "restarts": self.restarts,
                "status": self.status, "reason": self.reason, "url": self.url, "base_url": self.base_url,
                "health": self.health,
                "heartbeat_age_s": self.heartbeat_age_s, "ready": self.ready, "in_plan": self.in_plan,
                "timings": self.timings, "restart": self.restart, "final": self.final,
                "submitted_at": self.submitted_at, "load": self.load, "slow": self.slow}


def _probe(record: EndpointRecord, token: str | None,
           timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, dict[str, float] | None]:
    """Whether the endpoint ``record`` names is live, and the key figures of its ``/metrics``.

    With the run's token, the server must first prove it holds the token and is the record's
    generation (as the client asks), so a squatter on a dead teacher's port is shown down, not
    healthy, and never gets the token (which ``/metrics`` may need). Without it (a user who can
    read the run dir but not its token), the probe is as any stranger's: no secret to lose."""
    from podium.client.errors import TransportError
    from podium.client.transport import HTTPTransport, ServerIdentity
    from podium.protocol.metrics_text import summary  # no prometheus_client: a trainer's light install reads it

    assert record.url is not None
    identity = ServerIdentity(str(record.generation), record.teacher_key) if token else None
    transport = HTTPTransport(record.url, token, identity=identity, connect_timeout_s=timeout_s,
                              read_timeout_s=timeout_s)
    try:
        if transport.request("GET", HEALTH_LIVE, timeout_s=timeout_s).status != 200:
            return False, None
        metrics = transport.request("GET", METRICS, timeout_s=timeout_s)
        return True, summary(bytes(metrics.body).decode("utf-8")) if metrics.status == 200 else None
    except (TransportError, ValueError) as exc:
        logger.debug("probe of %s: %s", record.url, exc)
        return False, None
    finally:
        transport.close()


StatesOf = Callable[[Sequence[JobRecord]], dict[str, JobState]]


class SchedulerPolls:
    """The scheduler's job states, asked again only when due (``interval_s``, doubling up to
    ``max_interval_s``), when asked about a job it has no answer for, or after :meth:`expire`."""

    def __init__(self, interval_s: float = WAIT_SLURM_POLL_S, max_interval_s: float = WAIT_SLURM_MAX_POLL_S,
                 states_of: StatesOf = job_states, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.max_interval_s = interval_s, max_interval_s
        self._states_of, self._clock = states_of, clock
        self._states: dict[str, JobState] = {}
        self._asked: set[str] = set()
        self._due = 0.0
        self._interval = interval_s

    def expire(self) -> None:
        """Ask at the next look (something changed), and from the shortest interval again."""
        self._due, self._interval = 0.0, self.interval_s

    def __call__(self, records: Sequence[JobRecord]) -> dict[str, JobState]:
        ids = {rec.job_id for rec in records}
        now = self._clock()
        if now >= self._due or not ids <= self._asked:
            self._states, self._asked = self._states_of(records), ids
            self._due = now + self._interval
            self._interval = min(self._interval * 2, self.max_interval_s)
        return self._states


def _token(layout: RunLayout) -> str | None:
    try:
        return read_token(layout.auth_token_path)
    except FileReadError as exc:  # missing, not yours to read, or refused as readable by others
        logger.debug("status probes without the run's token: %s", exc)
        return None


def status(run_dir: Path, probe: bool = True, states_of: StatesOf = job_states) -> list[TeacherStatus]:
    """Per teacher: job, Slurm state, endpoint record, probed health (raises on a failed sacct);
    ``states_of`` answers the jobs' states (the scheduler, or :class:`SchedulerPolls`)."""
    run_dir = run_dir.absolute()
    layout = RunLayout(run_dir)
    rdv = read_rendezvous(run_dir)
    token = _token(layout) if probe else None
    listed = {layout.resolve(path).parent for entry in rdv.teachers.values() for path in entry.replicas}
    teachers = known_teachers(run_dir)
    records = {files.folder: JobRecord.of(files, spec.launcher.cluster) for spec, files in teachers}
    states = states_of([r for r in records.values() if r is not None])
    rows = []
    for spec, files in teachers:
        row = TeacherStatus(name=spec.name, key=spec.key, aliases=tuple(spec.aliases), replica=spec.replica,
                            temperature=spec.temperature, in_plan=files.folder in listed)
        rec = records.get(files.folder)
        if rec is not None:
            row.job_id, row.cluster, row.submitted_at = rec.job_id, rec.cluster, rec.submitted_at
            state = states.get(rec.job_id)
            if state is None:
                row.slurm_state, row.job_kind = "UNKNOWN", "done"
            else:
                row.slurm_state, row.job_kind, row.restarts = state.state, state.kind, state.restarts
        try:
            endpoint = read_record(files.endpoint)
        except FileReadError as exc:
            if exc.kind != "missing":
                row.reason = str(exc)
            endpoint = None
        if endpoint is not None and (rec is None or str(endpoint.generation.job_id) == str(rec.job_id)):
            row.status = endpoint.status.value
            row.reason = endpoint.reason
            row.url = endpoint.url
            row.generation = str(endpoint.generation)
            row.heartbeat_age_s = round(endpoint.age(), 1)
            row.timings = dict(endpoint.timings)
            row.restart = endpoint.restart.model_dump(mode="json") if endpoint.restart is not None else {}
            row.final = endpoint.failure_is_final() if endpoint.status is Status.FAILED else None
            if endpoint.model is not None:
                row.temperature = endpoint.model.temperature
            if probe and endpoint.url and endpoint.status is Status.READY:
                row.health, row.load = _probe(endpoint, token)
        rows.append(row)
    rows.sort(key=lambda r: (not r.in_plan, r.name, r.replica))
    mark_slow_replicas(rows)
    return rows


def mark_slow_replicas(rows: Sequence[TeacherStatus]) -> None:
    """Each serving replica whose latest batches took longer than the teacher's other
    replicas' by the rule podium's client drains a slow replica by (:func:`podium.client.routing.is_slow`
    at ``ClientOptions.slow_factor``) gets :attr:`TeacherStatus.slow` saying so."""
    from podium.client.options import ClientOptions
    from podium.client.routing import is_slow, typical_s

    factor = ClientOptions().slow_factor
    teachers: dict[tuple[str, str], list[tuple[TeacherStatus, float]]] = {}
    for row in rows:
        seconds = (row.load or {}).get("batch_s_recent")
        if seconds:
            teachers.setdefault((row.name, row.key), []).append((row, seconds))
    for replicas in teachers.values():
        for row, own in replicas:
            others = [s for other, s in replicas if other is not row]
            if others and is_slow(own, others, factor):
                row.slow = (f"slow: its latest batches took {own:.2f} s, the other replicas' {typical_s(others):.2f} s;"
                            f" trainers' clients route around it")


class WaitFailed(RuntimeError):
    pass


def wait(run_dir: Path, timeout_s: float = 600.0,
         on_update: Callable[[list[TeacherStatus], float], None] | None = None,
         poll_s: float = WAIT_POLL_S) -> list[TeacherStatus]:
    """Until every planned teacher is ready; :class:`WaitFailed` naming the teacher otherwise. The
    records are read every ``poll_s``, the scheduler asked with backoff (:class:`SchedulerPolls`)."""
    t0 = time.monotonic()
    rows: list[TeacherStatus] = []
    polls = SchedulerPolls()
    seen: list[tuple[str, str | None, str | None]] = []

    def all_ready() -> list[TeacherStatus] | None:
        nonlocal rows, seen
        rows = [r for r in status(run_dir, states_of=polls) if r.in_plan]
        records = [(r.status, r.generation, r.job_id) for r in rows]
        if seen and records != seen:  # a record changed: what Slurm says of its job may have too
            polls.expire()
        seen = records
        if on_update is not None:
            on_update(rows, time.monotonic() - t0)
        failed = [r for r in rows if r.failed]
        if failed:
            raise WaitFailed("; ".join(
                f"teacher {r.display!r} (job {r.job_id}): {r.slurm_state} / {r.status}"
                + (f": {r.reason}" if r.reason else "") + f" — see `podium logs {run_dir} {r.display}`"
                for r in failed))
        return rows if rows and all(r.ready for r in rows) else None

    try:
        return poll_until(all_ready, timeout_s=timeout_s, interval_s=poll_s, what="every teacher to be ready")
    except PollTimeout:
        waiting = ", ".join(f"{r.display}={r.phase}" for r in rows if not r.ready)
        raise WaitFailed(f"not ready after {timeout_s:.0f}s: {waiting}") from None
