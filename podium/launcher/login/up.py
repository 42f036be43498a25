"""The logic of ``podium up`` and ``up --dry-run`` (the CLI only parses and prints): bring a run to
its recipe.

Submits each replica of each teacher once, reattaches to live jobs, lists the replicas in the
rendezvous, and reports (or with ``--replace`` applies) what the recipe changed under a live job.
What runs is seen by :mod:`podium.launcher.login.status`, stopped by :mod:`podium.launcher.login.stop`;
a teacher's count of replicas is changed by :mod:`podium.launcher.login.scale`.

All state comes from the run directory (``job.json``, the endpoint records) and Slurm, so any
``podium`` process on any login node can run it. Light imports only: no torch, no ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from podium.config.errors import ConfigError, refusal
from podium.config.launcher import SettingChange, launcher_changes
from podium.config.plan import Plan
from podium.config.spec import TeacherSpec
from podium.launcher.backends import Submission, SubmitError, live_job_ids, scheduler_for
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.login.run_dir import editing_rendezvous, known_teachers, make_run_dir, prepare_run_dir, write_spec
from podium.launcher.login.stop import down, stop_replicas
from podium.launcher.login.submission import ensure_submitted, require_launcher_packages


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
    require_launcher_packages()
    run_dir = make_run_dir(run_dir.absolute())
    # The replicas `scale` started are read and listed under the claim: a `scale` that submits one
    # meanwhile lists it after this write (its job.json exists before its own write).
    with editing_rendezvous(run_dir):
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
    live = live_job_ids([rec for _, _, rec in with_jobs])
    out: dict[str, list[tuple[TeacherSpec, TeacherFiles, JobRecord]]] = {}
    for spec, files, rec in with_jobs:
        if rec.job_id in live:
            out.setdefault(spec.key, []).append((spec, files, rec))
    return out


def validate(plan: Plan) -> None:
    """What ``up`` checks before it writes or submits anything: checkpoints, and that each
    teacher's backend can run it; one ``ConfigError`` listing every problem (a backend's refusal
    alone: its ``SubmitError``)."""
    problems: list[str] = []
    refused: SubmitError | None = None
    for spec in plan.teachers:
        try:
            scheduler_for(spec.launcher.cluster).check(spec)
        except (ConfigError, SubmitError) as exc:
            problems.append(str(exc))
            refused = exc if isinstance(exc, SubmitError) else None
    if len(problems) == 1 and refused is not None and not plan.warnings:
        raise refused
    if plan.warnings or problems:
        raise refusal([*plan.warnings, *problems])


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
