"""The logic of ``podium up / status / wait / scale / logs / down`` (the CLI only parses and prints).

All state comes from the run directory (``job.json``, the endpoint records) and Slurm, so any
``podium`` process on any login node can run these. Light imports only: no torch, no ray.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from podium.config.plan import Plan, require_checkpoints
from podium.protocol.names import HEALTH_LIVE, METRICS
from podium.config.launcher import SettingChange, launcher_changes
from podium.config.spec import REPLICA_MARK, TeacherSpec
from podium.launcher.backends import Submission, SubmitError, job_states, scheduler_for
from podium.launcher.cleanup import run_processes, sweep_temp_dirs
from podium.launcher.files import TeacherFiles
from podium.launcher.jobs import JobRecord
from podium.launcher.run_dir import known_teachers, prepare_run_dir, write_spec
from podium.launcher.submission import ensure_submitted
from podium.rendezvous.atomic import FileReadError, atomic_write_json
from podium.rendezvous.layout import ENDPOINT_MODE, RunLayout
from podium.rendezvous.manifest import read_rendezvous, write_rendezvous
from podium.rendezvous.records import StaleGenerationError, Status, read_record

logger = logging.getLogger(__name__)

DOWN_STRAGGLER_S = 15.0  # `down`: how long recorded processes of an ended job may take to go


@dataclass
class TeacherStatus:
    """One row of ``podium status``."""

    name: str
    key: str
    aliases: tuple[str, ...]
    replica: int = 0  # which of the teacher's independent allocations this row is
    temperature: float = 1.0  # what the teacher divides its logits by (its record's, else its spec's)
    job_id: Optional[str] = None
    cluster: str = ""
    slurm_state: str = "NOT SUBMITTED"
    job_kind: str = "none"  # pending | running | done | none
    generation: Optional[str] = None  # of the endpoint record: "<job id>:<restart>"
    restarts: Optional[int] = None  # Slurm's restart count of the job (while Slurm lists it)
    status: str = "pending"  # endpoint record status, or pending when there is none yet
    reason: Optional[str] = None
    url: Optional[str] = None
    health: Optional[bool] = None  # probed /v2/health/live
    heartbeat_age_s: Optional[float] = None
    submitted_at: Optional[float] = None
    timings: dict[str, float] = field(default_factory=dict)
    restart: dict[str, Any] = field(default_factory=dict)  # the restart decision the record carries
    final: Optional[bool] = None  # a failed record: True when the teacher gave up, False when it retries
    in_plan: bool = True  # listed in rendezvous.json (a teacher of the recipe, a replica clients use)
    # From the endpoint's /metrics (podium.teacher.metrics.summary): tokens/s over the last minute,
    # queue depth, padding share, requests, errors; None when not probed or not answering.
    load: Optional[dict[str, float]] = None

    @property
    def display(self) -> str:
        """The teacher's name, ``name#i`` for replica i >= 1 (:attr:`TeacherSpec.display`)."""
        return f"{self.name}{REPLICA_MARK}{self.replica}" if self.replica else self.name

    @property
    def ready(self) -> bool:
        return (self.status == "ready" and self.job_kind == "running" and self.health is not False
                and not self.superseded)

    @property
    def record_restart(self) -> Optional[int]:
        """The restart count of the generation the endpoint record belongs to."""
        if self.generation is None:
            return None
        return int(self.generation.rpartition(":")[2] or 0)

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
                "status": self.status, "reason": self.reason, "url": self.url, "health": self.health,
                "heartbeat_age_s": self.heartbeat_age_s, "ready": self.ready, "in_plan": self.in_plan,
                "timings": self.timings, "restart": self.restart, "final": self.final,
                "submitted_at": self.submitted_at, "load": self.load}


@dataclass
class UpResult:
    run_dir: Path
    # keyed by the replica's display name (the teacher's name; ``name#i`` for replica i >= 1)
    actions: dict[str, str]  # -> submitted | reattached | resubmitted | replaced
    job_ids: dict[str, str]
    orphans: list[str]  # teachers in the run dir that the plan no longer has
    replaced: dict[str, str] = field(default_factory=dict)  # display name -> the job it replaced
    notes: list[str] = field(default_factory=list)  # live jobs left running with other settings
    notices: list[str] = field(default_factory=list)  # runs otherwise than asked (CPU for GPUs): stderr


def recorded_changes(spec: TeacherSpec, record: JobRecord) -> Optional[list[SettingChange]]:
    """The launcher settings the plan changes from those ``record``'s job was submitted with
    (None: not recorded)."""
    recorded = record.launcher_settings()
    return None if recorded is None else launcher_changes(recorded, spec.launcher)


def _described(changes: Sequence[SettingChange]) -> str:
    return "; ".join(map(str, changes))


def up(plan: Plan, run_dir: Path, *, replace: bool = False) -> UpResult:
    """Validate, write the run dir, submit each replica of each teacher once (reattach to live jobs).

    A live job whose recorded launcher settings differ from the plan's is left running and
    reported (:attr:`UpResult.notes`); with ``replace`` it is cancelled and the replica submitted
    again. Live replicas beyond the plan's ``replicas`` count (``podium scale`` started them) stay
    listed in the rendezvous and running; with ``replace`` they are stopped. With ``replace``
    teachers of the run dir that the plan no longer has are stopped too.
    """
    validate(plan)
    run_dir = run_dir.absolute()
    extras = _live_extra_replicas(plan, run_dir)
    listed = {spec.key: [*range(spec.launcher.replicas),
                         *([] if replace else [s.replica for s, _, _ in extras.get(spec.key, [])])]
              for spec in plan.teachers}
    layout = prepare_run_dir(plan, run_dir, replicas=listed)
    result = UpResult(layout.run_dir, {}, {}, [], notices=notices(plan))
    for replica in (r for spec in plan.teachers for r in spec.replica_specs()):
        _up_replica(replica, layout.run_dir, replace, result)
    for key, found in extras.items():
        teacher = plan.teacher(key)
        wanted, names = teacher.launcher.replicas, ", ".join(f"{s.display} (job {rec.job_id})" for s, _, rec in found)
        if replace:
            # listed no more (rendezvous written above): clients move to the others, then it stops
            _stop([(s, files, [rec]) for s, files, rec in found])
            result.notes.append(f"teacher {teacher.name!r}: replicas beyond the recipe's {wanted} stopped: {names}")
        else:
            result.notes.append(f"teacher {teacher.name!r}: replicas beyond the recipe's {wanted} run and stay "
                                f"listed: {names}; `podium scale {layout.run_dir} {teacher.name} {wanted}` or "
                                f"`podium up --replace` stops them")
    planned = {s.key for s in plan.teachers}
    result.orphans = [s.label for s, _ in known_teachers(layout.run_dir) if s.key not in planned]
    if result.orphans and replace:
        down(layout.run_dir, result.orphans, only_orphans=True)
    return result


def _up_replica(spec: TeacherSpec, run_dir: Path, replace: bool, result: UpResult) -> None:
    """``up`` of one replica: submit it once, or reattach (and with ``replace`` resubmit a job that
    runs with other settings); what happened goes into ``result``."""
    files = TeacherFiles.of_spec(run_dir, spec)
    who = f"teacher {spec.display!r}"
    try:
        record, action = ensure_submitted(spec, files)
    except SubmitError as exc:
        if not result.job_ids:
            raise
        # The replicas before it have their jobs (recorded): say so, and that `up` again keeps them.
        done = ", ".join(f"{name} job {job}" for name, job in result.job_ids.items())
        raise SubmitError(f"{exc} [left running: {done}; `podium up` with the fixed recipe reattaches "
                          f"them and submits the rest]") from exc
    changes = recorded_changes(spec, record) if action == "reattached" else []
    if changes and replace:
        old = record
        _stop([(spec, files, [old])], only_their_records=True)
        record, action = ensure_submitted(spec, files)
        if record.job_id == old.job_id:
            raise SubmitError(f"{who}: job {old.job_id} still runs after it was cancelled; "
                              f"run `podium up --replace` again once it has ended")
        action = "replaced"
        result.replaced[spec.display] = old.job_id
        result.notes.append(f"{who}: job {old.job_id} ran with {_described(changes)}: "
                            f"cancelled, replaced by job {record.job_id}")
    elif changes:
        # The job left running keeps reading (on every node, at every requeue) the spec it was
        # submitted with, not the new settings its sbatch request does not have.
        write_spec(run_dir, spec.model_copy(update={"launcher": record.launcher_settings()}))
        result.notes.append(f"{who}: job {record.job_id} runs with {_described(changes)}: "
                            f"left running; `podium up --replace` resubmits it")
    elif changes is None:
        result.notes.append(f"{who}: job {record.job_id} has no recorded launcher settings "
                            f"(an older podium, or not submitted by `podium up`), so changes to podium.* "
                            f"cannot be told: left running; `podium down` and `podium up` apply the recipe's")
    result.actions[spec.display] = action
    result.job_ids[spec.display] = record.job_id


def _live_extra_replicas(plan: Plan, run_dir: Path) -> dict[str, list[tuple[TeacherSpec, TeacherFiles, JobRecord]]]:
    """Per teacher key of the plan, its replicas beyond the plan's count whose job is pending or
    running (``podium scale`` started them)."""
    wanted = {spec.key: spec.launcher.replicas for spec in plan.teachers}
    found = [(spec, files, JobRecord.of(files, spec.launcher.cluster)) for spec, files in known_teachers(run_dir)
             if spec.key in wanted and spec.replica >= wanted[spec.key]]
    with_jobs = [(spec, files, rec) for spec, files, rec in found if rec is not None]
    live = _live_job_ids([rec for _, _, rec in with_jobs])
    out: dict[str, list[tuple[TeacherSpec, TeacherFiles, JobRecord]]] = {}
    for spec, files, rec in with_jobs:
        if rec.job_id in live:
            out.setdefault(spec.key, []).append((spec, files, rec))
    return out


def _live_job_ids(records: Sequence[JobRecord]) -> set[str]:
    """The ids of these jobs that are pending or running (one query)."""
    return {job_id for job_id, state in job_states(records).items() if state.alive}


def validate(plan: Plan) -> None:
    """What ``up`` checks before it writes or submits anything: checkpoints, and that each
    teacher's backend can run it (``ConfigError`` / ``SubmitError``)."""
    require_checkpoints(plan)
    for spec in plan.teachers:
        scheduler_for(spec.launcher.cluster).check(spec)


def notices(plan: Plan) -> list[str]:
    """One line per teacher that its backend runs otherwise than the recipe asks (a local teacher on
    CPU where the recipe asks for GPUs), for ``up`` to print on stderr."""
    return [line for spec in plan.teachers for line in scheduler_for(spec.launcher.cluster).notices(spec)]


def dry_run(plan: Plan, run_dir: Path) -> list[Submission]:
    """What ``up`` would submit (every replica's job), validated as ``up`` validates; nothing is
    written or submitted."""
    validate(plan)
    return [scheduler_for(replica.launcher.cluster).materialise(replica, TeacherFiles.of_spec(run_dir.absolute(), replica))
            for spec in plan.teachers for replica in spec.replica_specs()]


def _probe(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}{HEALTH_LIVE}", timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _load(url: str, timeout_s: float = 2.0) -> Optional[dict[str, float]]:
    """The key figures of the endpoint's ``/metrics`` (None when it does not answer them)."""
    from podium.teacher.metrics import summary  # prometheus_client only: no torch

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}{METRICS}", timeout=timeout_s) as resp:
            return summary(resp.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def status(run_dir: Path, probe: bool = True) -> list[TeacherStatus]:
    """Per teacher: job, Slurm state, endpoint record, probed health (raises on a failed sacct)."""
    run_dir = run_dir.absolute()
    layout = RunLayout(run_dir)
    rdv = read_rendezvous(run_dir)
    listed = {layout.resolve(path).parent for entry in rdv.teachers.values() for path in entry.replicas}
    teachers = known_teachers(run_dir)
    records = {files.folder: JobRecord.of(files, spec.launcher.cluster) for spec, files in teachers}
    states = job_states([r for r in records.values() if r is not None])
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
            row.timings = dict(endpoint.extra.get("timings", {}))
            row.restart = dict(endpoint.extra.get("restart", {}))
            row.final = endpoint.extra.get("final")
            if endpoint.model is not None:
                row.temperature = endpoint.model.temperature
            if probe and endpoint.url and endpoint.status is Status.READY:
                row.health = _probe(endpoint.url)
                if row.health:
                    row.load = _load(endpoint.url)
        rows.append(row)
    rows.sort(key=lambda r: (not r.in_plan, r.name, r.replica))
    return rows


class WaitFailed(RuntimeError):
    pass


def wait(run_dir: Path, timeout_s: float = 600.0,
         on_update: Optional[Callable[[list[TeacherStatus], float], None]] = None,
         poll_s: float = 0.5) -> list[TeacherStatus]:
    """Until every planned teacher is ready; :class:`WaitFailed` naming the teacher otherwise."""
    t0 = time.monotonic()
    while True:
        rows = [r for r in status(run_dir) if r.in_plan]
        elapsed = time.monotonic() - t0
        if on_update is not None:
            on_update(rows, elapsed)
        failed = [r for r in rows if r.failed]
        if failed:
            raise WaitFailed("; ".join(
                f"teacher {r.display!r} (job {r.job_id}): {r.slurm_state} / {r.status}"
                + (f": {r.reason}" if r.reason else "") + f" — see `podium logs {run_dir} {r.display}`"
                for r in failed))
        if rows and all(r.ready for r in rows):
            return rows
        if elapsed > timeout_s:
            waiting = ", ".join(f"{r.display}={r.phase}" for r in rows if not r.ready)
            raise WaitFailed(f"not ready after {timeout_s:.0f}s: {waiting}")
        time.sleep(poll_s)


def down(run_dir: Path, teachers: Sequence[str] = (), only_orphans: bool = False,
         wait_s: float = 60.0) -> list[str]:
    """Cancel the teachers' jobs (all, or those named), mark records stopped; safe to repeat."""
    run_dir = run_dir.absolute()
    found = [(spec, files) for spec, files in known_teachers(run_dir)
             if not teachers or {spec.name, spec.key, spec.label, spec.display} & set(teachers)]
    return _stop(_with_jobs(found), wait_s=wait_s)


@dataclass
class ScaleResult:
    """What ``podium scale`` did to one teacher."""

    run_dir: Path
    teacher: str
    key: str
    count: int
    before: int  # replicas the rendezvous listed before
    actions: dict[str, str] = field(default_factory=dict)  # display name -> submitted | reattached | resubmitted
    job_ids: dict[str, str] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)  # display names of the replicas stopped


def scale(run_dir: Path, teacher: str, count: int, wait_s: float = 60.0) -> ScaleResult:
    """Serve ``teacher`` (its name or key) of a running run by ``count`` replicas.

    Replicas ``0..count-1`` that run are left as they are (reattached); the missing ones are
    submitted with the teacher's spec (replica 0's: the settings it runs with). The rendezvous is
    rewritten to list exactly those, so clients spread their calls over them; only then are the
    replicas beyond ``count`` stopped (a call in flight there is retried on another replica). The
    recipe is not read: the next ``podium up`` brings the teacher back to the recipe's count, and
    keeps live replicas beyond it (``--replace`` stops them)."""
    run_dir = run_dir.absolute()
    if count < 1:
        raise ValueError(f"podium scale: {count} replicas: a teacher needs at least 1 "
                         f"(`podium down {run_dir} {teacher}` stops it)")
    layout = RunLayout(run_dir)
    rdv = read_rendezvous(run_dir)
    known = known_teachers(run_dir)
    keys = {spec.key for spec, _ in known if teacher in (spec.name, spec.key)}
    listed_keys = sorted(keys & set(rdv.teachers))
    if len(listed_keys) != 1:
        names = ", ".join(dict.fromkeys(entry.name for entry in rdv.teachers.values()))
        if not listed_keys and keys:
            raise ValueError(f"teacher {teacher!r} is not in {layout.rendezvous_path} (the recipe no longer has it): "
                             f"`podium up` it first; teachers: {names}")
        raise ValueError(f"no teacher {teacher!r} in {run_dir} (teachers: {names})")
    (key,) = listed_keys
    replicas = {spec.replica: (spec, files) for spec, files in known if spec.key == key}
    template = replicas[min(replicas)][0]
    result = ScaleResult(run_dir, template.name, key, count, len(rdv.entry(key).replicas))
    endpoint = functools.partial(layout.endpoint_relpath, template.name, key)
    for index in range(count):
        spec = replicas[index][0] if index in replicas else template.replica_spec(index)
        if index not in replicas:
            write_spec(run_dir, spec)
        try:
            record, action = ensure_submitted(spec, TeacherFiles.of_spec(run_dir, spec))
        except SubmitError as exc:
            # what runs stays listed and what was just submitted is listed too; nothing is stopped
            listed = list(dict.fromkeys([*rdv.entry(key).replicas, *map(endpoint, range(index))]))
            write_rendezvous(layout, rdv.with_replicas(key, listed))
            done = ", ".join(f"{name} job {job}" for name, job in result.job_ids.items()) or "none"
            raise SubmitError(f"{exc} [replicas with jobs: {done}; the rendezvous lists {len(listed)}; nothing "
                              f"was stopped; `podium scale` again, once fixed, submits the rest]") from exc
        result.actions[spec.display] = action
        result.job_ids[spec.display] = record.job_id
    # listed first, stopped after: a client re-reads the rendezvous and moves to the replicas that stay
    write_rendezvous(layout, rdv.with_replicas(key, [endpoint(i) for i in range(count)]))
    beyond = _with_jobs([found for index, found in sorted(replicas.items()) if index >= count])
    live = _live_job_ids([rec for _, _, recs in beyond for rec in recs])
    result.stopped = [spec.display for spec, _, recs in beyond if any(rec.job_id in live for rec in recs)]
    _stop(beyond, wait_s=wait_s)
    return result


def _with_jobs(found: Sequence[tuple[TeacherSpec, TeacherFiles]]) -> list[tuple[TeacherSpec, TeacherFiles, list[JobRecord]]]:
    """Each replica with its jobs: the one ``job.json`` names, and live jobs carrying its identity
    that no ``job.json`` names (an ``up`` died between sbatch and ``job.json``)."""
    selected: list[tuple[TeacherSpec, TeacherFiles, list[JobRecord]]] = []
    for spec, files in found:
        rec = JobRecord.of(files, spec.launcher.cluster)
        records = [rec] if rec is not None else []
        # Live jobs of the teacher that no job.json names (an `up` died between sbatch and job.json).
        for job_id in scheduler_for(spec.launcher.cluster).find_live(spec, files):
            if rec is None or job_id != rec.job_id:
                logger.warning("teacher %r: job %s carries its identity but %s does not name it: "
                               "cancelled too", spec.display, job_id, files.job)
                records.append(JobRecord(teacher_key=spec.key, teacher_name=spec.name, job_id=job_id,
                                         cluster=spec.launcher.cluster, submitted_at=0.0,
                                         folder=str(files.submitit), submitted_by="found by down"))
        selected.append((spec, files, records))
    return selected


def _stop(selected: Sequence[tuple[TeacherSpec, TeacherFiles, list[JobRecord]]], wait_s: float = 60.0,
          only_their_records: bool = False) -> list[str]:
    """Stop these jobs of these replicas: a stop request (to the first job of each), cancel, wait
    until they have ended, mark the endpoint records stopped (with ``only_their_records``, only a
    record of one of these jobs), sweep what they left. Returns their display names."""
    records = [rec for _, _, recs in selected for rec in recs]
    for _, files, recs in selected:
        if recs:  # a job that cannot be signalled (or misses the signal) stops by this
            atomic_write_json(files.stop_request, {"job_id": recs[0].job_id, "time": time.time(), "pid": os.getpid()})
    by_cluster: dict[str, list[JobRecord]] = {}
    for rec in records:
        by_cluster.setdefault(rec.cluster, []).append(rec)
    for cluster, recs in by_cluster.items():
        scheduler_for(cluster).cancel(recs)
    deadline = time.monotonic() + wait_s
    while records and time.monotonic() < deadline:
        states = job_states(records)
        if all(not states[r.job_id].alive for r in records if r.job_id in states):
            break
        time.sleep(0.5)
    names = []
    for spec, files, recs in selected:
        _mark_stopped(files, {r.job_id for r in recs} if only_their_records else None)
        # The job has ended; its tasks' processes end with it (stragglers get a few seconds).
        straggle_deadline = min(deadline, time.monotonic() + DOWN_STRAGGLER_S)
        while run_processes(files) and time.monotonic() < straggle_deadline:
            time.sleep(0.2)
        for path in sweep_temp_dirs(files):
            logger.info("teacher %r: removed %s", spec.display, path)
        names.append(spec.display)
    return names


def _mark_stopped(files: TeacherFiles, job_ids: Optional[set[str]] = None) -> None:
    """Record ``stopped`` where the job could not (cancelled before serving, or killed); with
    ``job_ids``, only a record of one of those jobs.

    ``down`` is then a second writer of the record, so it is fenced like the head process: the
    record is replaced only if it still belongs to the generation read here, checked again just
    before the rename; a newer generation's record is left as it is."""
    try:
        record = read_record(files.endpoint)
    except FileReadError:
        return
    if record.status in (Status.STOPPED, Status.FAILED):
        return
    if job_ids is not None and str(record.generation.job_id) not in job_ids:
        return
    data = record.to_json()
    data.update(status="stopped", reason="podium down", heartbeat_at=time.time())

    def same_generation() -> None:
        current = read_record(files.endpoint)
        if current.generation != record.generation:
            raise StaleGenerationError(files.endpoint, record.generation, current.generation)

    try:
        atomic_write_json(files.endpoint, data, mode=ENDPOINT_MODE, before_replace=same_generation)
    except (StaleGenerationError, FileReadError) as exc:
        logger.info("left %s alone: %s", files.endpoint, exc)


def log_paths(run_dir: Path, teacher: str, node: Optional[int] = None) -> list[Path]:
    """The logs of a teacher's current job's node tasks (one node, or all)."""
    teachers = known_teachers(run_dir.absolute())
    for spec, files in teachers:
        if teacher in (spec.name, spec.key, spec.label, spec.display):
            rec = JobRecord.of(files, spec.launcher.cluster)
            if rec is None:
                raise FileNotFoundError(f"teacher {teacher!r}: no job submitted yet ({files.job} missing)")
            ranks = [node] if node is not None else list(range(spec.num_nodes))
            return scheduler_for(rec.cluster).log_paths(files, rec.job_id, ranks)
    names = ", ".join(s.name for s, _ in teachers)
    raise FileNotFoundError(f"no teacher {teacher!r} in {run_dir} (teachers: {names})")
