"""The logic of ``podium up / scale / logs`` and ``up --dry-run`` (the CLI only parses and prints).

Owns what brings a run to the recipe (``up``) or a teacher to a count of replicas (``scale``):
submitting each replica once, reattaching to live jobs, listing the replicas in the rendezvous.
What runs is seen by :mod:`podium.launcher.login.status`, stopped by :mod:`podium.launcher.login.stop`, and
the words a user types are turned into teachers by :mod:`podium.launcher.login.selection`.

All state comes from the run directory (``job.json``, the endpoint records) and Slurm, so any
``podium`` process on any login node can run these. Light imports only: no torch, no ray.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from podium.config.launcher import SettingChange, launcher_changes
from podium.config.plan import Plan, require_checkpoints
from podium.config.spec import TeacherSpec
from podium.launcher.backends import Submission, SubmitError, job_states, scheduler_for
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.login.claims import Claim, holding
from podium.launcher.login.run_dir import known_teachers, make_run_dir, prepare_run_dir, rendezvous_claims, write_spec
from podium.launcher.login.selection import resolve, select
from podium.launcher.login.stop import down, stop_replicas, with_jobs
from podium.launcher.login.submission import ensure_submitted
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.manifest import read_rendezvous, write_rendezvous

logger = logging.getLogger(__name__)

RENDEZVOUS_CLAIM_WAIT_S = 120.0  # another `up`/`scale` edits rendezvous.json for seconds at most


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


def recorded_changes(spec: TeacherSpec, record: JobRecord) -> list[SettingChange] | None:
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
    run_dir = make_run_dir(run_dir.absolute())
    # The replicas `scale` started are read and listed under the claim: a `scale` that submits one
    # meanwhile lists it after this write (its job.json exists before its own write).
    with _editing_rendezvous(run_dir):
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
            stop_replicas([(s, files, [rec]) for s, files, rec in found])
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
        stop_replicas([(spec, files, [old])], only_their_records=True)
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
    run_dir = run_dir.absolute()
    return [scheduler_for(replica.launcher.cluster).materialise(replica, TeacherFiles.of_spec(run_dir, replica))
            for spec in plan.teachers for replica in spec.replica_specs()]


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
    """Serve ``teacher`` of a running run by ``count`` replicas: any word naming one of its replicas
    (:mod:`podium.launcher.login.selection`: name, key, folder name, ``name#i``) names the teacher.

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
    keys = {spec.key for spec, _ in select(known, [teacher], run_dir)}
    listed_keys = sorted(keys & set(rdv.teachers))
    if len(listed_keys) != 1:
        names = ", ".join(dict.fromkeys(entry.name for entry in rdv.teachers.values()))
        if not listed_keys:
            raise ValueError(f"teacher {teacher!r} is not in {layout.rendezvous_path} (the recipe no longer has it): "
                             f"`podium up` it first; teachers: {names}")
        raise ValueError(f"{teacher!r} names {len(listed_keys)} teachers in {run_dir}: name one by its key "
                         f"({', '.join(listed_keys)})")
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
            with _editing_rendezvous(run_dir):
                fresh = read_rendezvous(run_dir)
                listed = list(dict.fromkeys([*fresh.entry(key).replicas, *map(endpoint, range(index))]))
                write_rendezvous(layout, fresh.with_replicas(key, listed))
            done = ", ".join(f"{name} job {job}" for name, job in result.job_ids.items()) or "none"
            raise SubmitError(f"{exc} [replicas with jobs: {done}; the rendezvous lists {len(listed)}; nothing "
                              f"was stopped; `podium scale` again, once fixed, submits the rest]") from exc
        result.actions[spec.display] = action
        result.job_ids[spec.display] = record.job_id
    # listed first, stopped after: a client re-reads the rendezvous and moves to the replicas that stay.
    # Read again under the claim: another `scale` or `up` may have edited it since (other teachers).
    with _editing_rendezvous(run_dir):
        write_rendezvous(layout, read_rendezvous(run_dir).with_replicas(key, [endpoint(i) for i in range(count)]))
    beyond = with_jobs([found for index, found in sorted(replicas.items()) if index >= count])
    live = _live_job_ids([rec for _, _, recs in beyond for rec in recs])
    result.stopped = [spec.display for spec, _, recs in beyond if any(rec.job_id in live for rec in recs)]
    stop_replicas(beyond, wait_s=wait_s)
    return result


def _editing_rendezvous(run_dir: Path) -> AbstractContextManager[Claim]:
    """The run's rendezvous claim, held around a read-modify-write of ``rendezvous.json``."""
    return holding(rendezvous_claims(run_dir), "the claim on rendezvous.json", RENDEZVOUS_CLAIM_WAIT_S)


def log_paths(run_dir: Path, teacher: str, node: int | None = None) -> list[Path]:
    """The logs of a teacher's current job's node tasks (one node, or all): the first replica
    ``teacher`` names (:mod:`podium.launcher.login.selection`; a teacher's name: its replica 0)."""
    spec, files = resolve(run_dir, [teacher])[0]
    rec = JobRecord.of(files, spec.launcher.cluster)
    if rec is None:
        raise FileNotFoundError(f"teacher {teacher!r}: no job submitted yet ({files.job} missing)")
    ranks = [node] if node is not None else list(range(spec.num_nodes))
    return scheduler_for(rec.cluster).log_paths(files, rec.job_id, ranks)
