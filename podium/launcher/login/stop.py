"""Stopping teachers: ``podium down``, and what ``up --replace`` and ``scale`` stop.

Owns the way a replica is stopped: a stop request the job's head reads, a cancel through the
backend, a bounded wait until the scheduler says the jobs have ended, the endpoint record marked
``stopped`` where the job could not do it, then a short wait for processes the job left (the
stragglers) and a sweep of their temporary folders. Every step is safe to repeat.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from podium.config.spec import TeacherSpec
from podium.launcher.backends import job_states, scheduler_for
from podium.launcher.common.cleanup import run_processes, sweep_temp_dirs
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.stop_request import request_stop
from podium.launcher.login.selection import resolve
from podium.poll import PollTimeout, poll_until
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.records import STOPPED_BY_DOWN, RecordWriter, StaleGenerationError, Status, read_record

logger = logging.getLogger(__name__)

DOWN_STRAGGLER_S = 15.0  # `down`: how long recorded processes of an ended job may take to go
JOB_END_POLL_S = 0.5  # how often the scheduler is asked whether cancelled jobs have ended
STRAGGLER_POLL_S = 0.2  # how often a replica's recorded processes are looked at after its job ended

Stoppable = tuple[TeacherSpec, TeacherFiles, list[JobRecord]]


def down(run_dir: Path, teachers: Sequence[str] = (), only_orphans: bool = False,
         wait_s: float = 60.0) -> list[str]:
    """Cancel the teachers' jobs (all, or those ``teachers`` names: :mod:`podium.launcher.login.selection`),
    mark records stopped; safe to repeat. A word that names no teacher is an
    :class:`~podium.launcher.login.selection.UnknownTeacherError` and nothing is stopped."""
    return stop_replicas(with_jobs(resolve(run_dir, teachers)), wait_s=wait_s)


def with_jobs(found: Sequence[tuple[TeacherSpec, TeacherFiles]]) -> list[Stoppable]:
    """Each replica with its jobs: the one ``job.json`` names, and live jobs carrying its identity
    that no ``job.json`` names (an ``up`` died between sbatch and ``job.json``)."""
    selected: list[Stoppable] = []
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


def stop_replicas(selected: Sequence[Stoppable], wait_s: float = 60.0,
                  only_their_records: bool = False) -> list[str]:
    """Stop these jobs of these replicas: a stop request (to the first job of each), cancel, wait
    until they have ended, mark the endpoint records stopped (with ``only_their_records``, only a
    record of one of these jobs), sweep what they left. Returns their display names."""
    records = [rec for _, _, recs in selected for rec in recs]
    for _, files, recs in selected:
        if recs:  # a job that cannot be signalled (or misses the signal) stops by this
            request_stop(files, recs[0].job_id)
    by_cluster: dict[str, list[JobRecord]] = {}
    for rec in records:
        by_cluster.setdefault(rec.cluster, []).append(rec)
    for cluster, recs in by_cluster.items():
        scheduler_for(cluster).cancel(recs)
    deadline = time.monotonic() + wait_s
    if records:
        _wait_ended(records, wait_s)
    names = []
    for spec, files, recs in selected:
        _mark_stopped(files, {r.job_id for r in recs} if only_their_records else None)
        # The job has ended; its tasks' processes end with it (stragglers get a few seconds).
        straggle_s = max(0.0, min(deadline, time.monotonic() + DOWN_STRAGGLER_S) - time.monotonic())
        try:
            poll_until(functools.partial(_all_gone, files), timeout_s=straggle_s, interval_s=STRAGGLER_POLL_S,
                       what=f"the processes of teacher {spec.display!r} to end")
        except PollTimeout as exc:
            logger.info("%s: left running", exc)
        for path in sweep_temp_dirs(files):
            logger.info("teacher %r: removed %s", spec.display, path)
        names.append(spec.display)
    return names


def _all_gone(files: TeacherFiles) -> bool:
    """No process the replica's job recorded runs any more."""
    return not run_processes(files)


def _wait_ended(records: Sequence[JobRecord], wait_s: float) -> None:
    """Until no job of ``records`` is pending or running (jobs the scheduler no longer lists have
    ended), for at most ``wait_s``."""
    def all_ended() -> bool:
        states = job_states(records)
        return all(not states[r.job_id].alive for r in records if r.job_id in states)

    try:
        poll_until(all_ended, timeout_s=wait_s, interval_s=JOB_END_POLL_S,
                   what=f"jobs {', '.join(r.job_id for r in records)} to end")
    except PollTimeout as exc:
        logger.info("%s: going on", exc)


def _mark_stopped(files: TeacherFiles, job_ids: set[str] | None = None) -> None:
    """Record ``stopped`` where the job could not (cancelled before serving, or killed); with
    ``job_ids``, only a record of one of those jobs.

    ``down`` is then a second writer of the record: it writes through :class:`RecordWriter`, resumed
    from the record read here, so it is fenced as the head process is (a record of a newer
    generation, there or appearing before the rename, is left as it is)."""
    try:
        record = read_record(files.endpoint)
    except FileReadError:
        return
    if record.status in (Status.STOPPED, Status.FAILED):
        return
    if job_ids is not None and str(record.generation.job_id) not in job_ids:
        return
    try:
        RecordWriter.resume(files.endpoint, record).publish(Status.STOPPED, reason=STOPPED_BY_DOWN)
    except (StaleGenerationError, ValueError) as exc:
        logger.info("left %s alone: %s", files.endpoint, exc)
