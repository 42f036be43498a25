"""The logic of ``podium scale`` (the CLI only parses and prints): serve a running teacher by a
number of replicas, submitting the missing ones and stopping those beyond.

The words a user types are turned into teachers by :mod:`podium.launcher.login.selection`; the
replicas are submitted as ``up`` submits them (:mod:`podium.launcher.login.submission`) and stopped
as ``down`` stops them (:mod:`podium.launcher.login.stop`). Light imports only: no torch, no ray.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from podium.launcher.backends import SubmitError, live_job_ids
from podium.launcher.common.files import TeacherFiles
from podium.launcher.login.run_dir import editing_rendezvous, known_teachers, write_spec
from podium.launcher.login.selection import select
from podium.launcher.login.stop import stop_replicas, with_jobs
from podium.launcher.login.submission import ensure_submitted, require_launcher_packages
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.manifest import read_rendezvous, write_rendezvous


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
    require_launcher_packages()
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
            with editing_rendezvous(run_dir):
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
    with editing_rendezvous(run_dir):
        write_rendezvous(layout, read_rendezvous(run_dir).with_replicas(key, [endpoint(i) for i in range(count)]))
    beyond = with_jobs([found for index, found in sorted(replicas.items()) if index >= count])
    live = live_job_ids([rec for _, _, recs in beyond for rec in recs])
    result.stopped = [spec.display for spec, _, recs in beyond if any(rec.job_id in live for rec in recs)]
    stop_replicas(beyond, wait_s=wait_s)
    return result
