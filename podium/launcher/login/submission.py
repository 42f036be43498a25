"""Submitting one teacher's job, once: the claim, the backend's submission, the job record.

:func:`ensure_submitted` is idempotent: a teacher whose recorded job is pending or running is
reattached; otherwise one process wins the teacher's submit claim (:mod:`podium.launcher.login.claims`:
numbered O_EXCL files, no fcntl locks, since shared filesystems differ in lock support) and submits
through the teacher's backend (:mod:`podium.launcher.backends`), the others wait for its
``job.json``. Every job carries the teacher's identity, so a job whose ``job.json`` was never
written is found (``Scheduler.find_live``) and adopted rather than submitted again. A job submitted
here starts a fresh restart ledger (``restarts.json``: no failures, no excluded nodes); an adopted
or reattached one keeps its own. While it submits, the SLURM_* / SBATCH_* / SUBMITIT_* variables
of an enclosing job (``podium up`` inside an sbatch script) are cleared (:func:`clean_submit_env`;
``SLURM_CONF`` is kept so ``sbatch`` finds its cluster).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from typing import TypeGuard

from podium.config.spec import TeacherSpec
from podium.faults import faults
from podium.launcher.backends import SubmitError, job_states, scheduler_for
from podium.launcher.common.files import FILE_MODE, TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.packages import LAUNCHER_INSTALL, LAUNCHER_PACKAGES, missing_message, missing_modules
from podium.launcher.common.restarts import RestartLedger
from podium.launcher.login.claims import try_claim
from podium.rendezvous.atomic import atomic_write_json, try_read_json

logger = logging.getLogger(__name__)

# Fault injection for tests (podium.faults): PODIUM_FAULTS=exit_after_submit
# ends `up` with os._exit(FAULT_EXIT_CODE) right after the backend returned a job id, before
# job.json is written (what a crash, a kill or a lost login session does at the worst moment).
FAULT_EXIT_CODE = 17

KEEP_ENV = frozenset({"SLURM_CONF"})
CLEAN_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SUBMITIT_", "PMI_", "PMIX_")

__all__ = ["SubmitError", "clean_submit_env", "ensure_submitted", "submit"]


def clean_submit_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables of an enclosing Slurm job (``SLURM_CONF`` kept)."""
    return {k: v for k, v in environ.items()
            if k in KEEP_ENV or not k.startswith(CLEAN_PREFIXES)}


@contextlib.contextmanager
def _clean_environ() -> Iterator[None]:
    saved = dict(os.environ)
    cleaned = clean_submit_env(saved)
    try:
        for key in set(saved) - set(cleaned):
            del os.environ[key]
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def submit(spec: TeacherSpec, files: TeacherFiles) -> str:
    """Submit the teacher's job now (no checks of what runs); returns the job id."""
    scheduler = scheduler_for(spec.launcher.cluster)
    scheduler.check(spec)
    submission = scheduler.materialise(spec, files)
    with _clean_environ():
        job_id = scheduler.submit(submission)
    logger.info("teacher %r: submitted job %s (%s)", spec.display, job_id, scheduler.name)
    return job_id


def _check_fault_env() -> None:
    try:
        faults()
    except ValueError as exc:
        raise SubmitError(str(exc)) from None


def require_launcher_packages() -> None:
    """:class:`SubmitError` naming what this Python lacks to submit (a trainer's light install has
    no submitit), before anything is written."""
    missing = missing_modules(LAUNCHER_PACKAGES)
    if missing:
        raise SubmitError("submitting teachers needs the launcher's packages: " + missing_message(
            missing, LAUNCHER_PACKAGES, LAUNCHER_INSTALL,
            advice="or run `podium up` from the teachers' environment (a trainer's base install plans, waits and "
                   "reads status; it does not submit)"))


def _fault(name: str, detail: str) -> None:
    """End this process at once when ``PODIUM_FAULTS`` asks for this fault (tests only)."""
    injected = faults()
    if getattr(injected, name):
        os.write(2, f"podium: fault injected by {injected.injected(name)}: {detail}\n".encode())
        os._exit(FAULT_EXIT_CODE)


def _alive(record: JobRecord | None) -> TypeGuard[JobRecord]:
    if record is None:
        return False
    state = job_states([record]).get(record.job_id)
    return state is not None and state.alive


def _adopt(spec: TeacherSpec, files: TeacherFiles, found: list[str],
           record: JobRecord | None) -> JobRecord:
    """Record a live job of this teacher that ``job.json`` does not name (its ``up`` died between
    the submission and ``job.json``): no second job is submitted."""
    job_id = max(found, key=lambda j: (len(j), j))  # the newest (Slurm ids grow)
    others = [j for j in found if j != job_id]
    if others:
        logger.warning("teacher %r: jobs %s also carry its identity; %s is adopted, the others are left "
                       "running (cancel them yourself)", spec.display, ", ".join(others), job_id)
    logger.warning("teacher %r: job %s runs but %s did not name it (an interrupted `podium up`?): "
                   "adopted", spec.display, job_id, files.job)
    previous = [*record.previous_job_ids, record.job_id] if record and record.job_id != job_id else []
    intent = try_read_json(files.submitting)  # the settings of the last submission: this job's
    launcher = intent.data.get("launcher") if intent.ok and isinstance(intent.data, dict) else None
    adopted = JobRecord(teacher_key=spec.key, teacher_name=spec.name, job_id=job_id,
                        cluster=spec.launcher.cluster, submitted_at=time.time(), folder=str(files.submitit),
                        previous_job_ids=previous, submitted_by=f"adopted by {_me()}", launcher=launcher)
    adopted.write(files)
    return adopted


def _me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def ensure_submitted(spec: TeacherSpec, files: TeacherFiles, timeout_s: float = 120.0) -> tuple[JobRecord, str]:
    """The teacher's live job, submitting one only if none is pending or running.

    Returns ``(record, action)`` with action ``reattached``, ``submitted`` or ``resubmitted``. When
    ``job.json`` is missing or names a job that has ended, the backend is asked for live jobs that
    carry the teacher's identity (:meth:`Scheduler.find_live`) before anything is submitted: one found
    is adopted (``job.json`` written, ``reattached``).
    """
    _check_fault_env()
    deadline = time.monotonic() + timeout_s
    while True:
        record = JobRecord.read(files)
        if _alive(record):
            return record, "reattached"
        claim = try_claim(files)
        if claim is not None:
            try:
                fresh = JobRecord.read(files)  # another `up` may have finished just before our claim
                if fresh is not None and (record is None or fresh.job_id != record.job_id):
                    if _alive(fresh):
                        return fresh, "reattached"
                    record = fresh
                found = scheduler_for(spec.launcher.cluster).find_live(spec, files)
                if found:
                    return _adopt(spec, files, found, record), "reattached"
                launcher = spec.launcher.model_dump(mode="json")
                # Before sbatch: should this process die before job.json, whoever adopts the job
                # knows what it was submitted with.
                atomic_write_json(files.submitting, {"launcher": launcher, "time": time.time(), "by": _me()},
                                  mode=FILE_MODE)
                # A new job starts its own restart ledger: the failures and excluded nodes of the
                # job before it (which may have failed for good) are not this one's. Written before
                # sbatch, so the new job's head never reads the old one.
                RestartLedger().write(files)
                try:
                    job_id = submit(spec, files)
                except SubmitError:  # refused: nothing was submitted, so no submission is in flight
                    files.submitting.unlink(missing_ok=True)
                    raise
                _fault("exit_after_submit", f"teacher {spec.display!r}: job {job_id} submitted, job.json not written")
                previous = ([*record.previous_job_ids, record.job_id] if record else [])
                new = JobRecord(teacher_key=spec.key, teacher_name=spec.name, job_id=job_id,
                                cluster=spec.launcher.cluster, submitted_at=time.time(),
                                folder=str(files.submitit), previous_job_ids=previous,
                                submitted_by=_me(), launcher=launcher)
                new.write(files)
                return new, "resubmitted" if record else "submitted"
            finally:
                claim.release()
        if time.monotonic() > deadline:
            raise SubmitError(f"teacher {spec.display!r}: another `podium up` holds its submit claim in "
                              f"{files.folder} for more than {timeout_s:.0f}s")
        time.sleep(0.2)
