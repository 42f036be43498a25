"""Submitting one teacher job through submitit, once: executor parameters, the claim, job records.

- :func:`slurm_parameters` is pure: a ``TeacherSpec`` -> submitit ``SlurmExecutor`` parameters
  (``nodes = num_nodes``, one task per node, GPUs only with ``slurm.gpus``, CPUs per task, partition /
  account / qos / time / constraint / exclusive / mem, setup lines, pyxis options as ``srun``
  arguments, ``--requeue``, ``--signal=<sig>@<lead>``, job name ``podium-<name>-<key8>``).
- :func:`ensure_submitted` is idempotent: a teacher whose recorded job is pending or running is
  reattached; otherwise one process wins an O_EXCL claim file in the teacher's folder and submits,
  the others wait for its ``job.json`` (no fcntl locks: shared filesystems differ in lock support).
- :func:`clean_submit_env` drops the SLURM_* / SBATCH_* / SUBMITIT_* variables a job inherits
  (``podium up`` inside an sbatch script), keeping ``SLURM_CONF`` so ``sbatch`` finds its cluster.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from podium.config.spec import TeacherSpec
from podium.launcher.files import CLAIM_STALE_S, TeacherFiles
from podium.launcher.procs import shim_python
from podium.launcher.slurm_state import JobState, query_states
from podium.rendezvous.atomic import atomic_write_json, try_read_json

logger = logging.getLogger(__name__)

KEEP_ENV = frozenset({"SLURM_CONF"})
CLEAN_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SUBMITIT_", "PMI_", "PMIX_")
LOCAL_TIMEOUT_MIN = 60 * 24 * 30  # submitit's local executor kills a job after its timeout
SUBMIT_GRACE_S = 60.0  # a job this fresh that Slurm does not list yet counts as pending


class SubmitError(RuntimeError):
    """Submitting a teacher's job failed; names the teacher and the scheduler's answer."""


def job_name(spec: TeacherSpec) -> str:
    return f"podium-{spec.name}-{spec.key[:8]}"


def time_to_minutes(text: str) -> int:
    """Slurm time -> minutes (rounded up). Slurm's forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``,
    ``D-H:M``, ``D-H:M:S``: without a day part one or two fields start at minutes, with a day
    part they start at hours."""
    rest = text.strip()
    days = 0
    if "-" in rest:
        d, rest = rest.split("-", 1)
        days = int(d)
    parts = [int(p) for p in rest.split(":")]
    if days or "-" in text:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:
        h, (m, s) = 0, (parts + [0])[:2]
    return days * 1440 + h * 60 + m + (1 if s else 0)


def cpus_per_task(spec: TeacherSpec) -> int:
    slurm = spec.launcher.get("slurm", {})
    if slurm.get("cpus_per_task"):
        return int(slurm["cpus_per_task"])
    return spec.gpus_per_node + 1  # one per worker slot plus the node's Ray and driver


def slurm_parameters(spec: TeacherSpec) -> dict[str, Any]:
    """submitit ``SlurmExecutor.update_parameters`` arguments for ``spec`` (pure)."""
    s = dict(spec.launcher.get("slurm", {}))
    params: dict[str, Any] = {
        "job_name": job_name(spec),
        "nodes": spec.num_nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus_per_task(spec),
        "time": time_to_minutes(str(s.get("time", "04:00:00"))),
        "signal_delay_s": int(s.get("signal_lead_s", 120)),
        "setup": list(s.get("setup") or []),
    }
    for name in ("partition", "account", "qos", "constraint", "mem"):
        if s.get(name):
            params[name] = str(s[name])
    if s.get("exclusive", True):
        params["exclusive"] = True
    if s.get("gpus", True):
        if s.get("gpu_request") == "gres":
            params["gres"] = f"gpu:{spec.gpus_per_node}"
        else:
            params["gpus_per_node"] = spec.gpus_per_node
    extra: dict[str, Any] = {}
    if s.get("requeue", True):
        extra["requeue"] = True
    extra["signal"] = f"{s.get('signal', 'USR2')}@{int(s.get('signal_lead_s', 120))}"
    extra.update({str(k): v for k, v in (s.get("extra_sbatch") or {}).items()})
    params["additional_parameters"] = extra
    srun_args: list[str] = []
    if s.get("container_image"):
        srun_args.append(f"--container-image={s['container_image']}")
        if s.get("container_mounts"):
            srun_args.append(f"--container-mounts={','.join(s['container_mounts'])}")
    if srun_args:
        params["srun_args"] = srun_args
    return params


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


@dataclass
class JobRecord:
    """``job.json``: the teacher's current job and the ones before it."""

    teacher_key: str
    teacher_name: str
    job_id: str
    cluster: str
    submitted_at: float
    folder: str
    submitted_by: str = ""
    previous_job_ids: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, files: TeacherFiles) -> Optional["JobRecord"]:
        found = try_read_json(files.job)
        if not found.ok:
            if found.error is not None and found.error.kind != "missing":
                logger.warning("%s", found.error)
            return None
        data = found.data
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def write(self, files: TeacherFiles) -> None:
        atomic_write_json(files.job, asdict(self))


def local_job_alive(job_id: str) -> bool:
    """submitit's local job id is its controller's PID: alive when that process runs submitit."""
    try:
        cmdline = Path(f"/proc/{int(job_id)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    return b"submitit" in cmdline


def job_states(records: list[JobRecord]) -> dict[str, JobState]:
    """Current states of the records' jobs (Slurm ones in one query; local ones by PID)."""
    out: dict[str, JobState] = {}
    slurm_ids = [r.job_id for r in records if r.cluster == "slurm"]
    if slurm_ids:
        out.update(query_states(slurm_ids))
    for rec in records:
        if rec.cluster == "local":
            out[rec.job_id] = JobState(rec.job_id, "RUNNING" if local_job_alive(rec.job_id) else "COMPLETED")
    now = time.time()
    for rec in records:
        if rec.job_id not in out and now - rec.submitted_at < SUBMIT_GRACE_S:
            out[rec.job_id] = JobState(rec.job_id, "PENDING", raw_state="SUBMITTED")
    return out


def make_executor(spec: TeacherSpec, files: TeacherFiles) -> Any:
    import submitit

    cluster = spec.launcher.get("cluster", "slurm")
    python = spec.launcher.get("slurm", {}).get("python") or sys.executable
    files.submitit.mkdir(parents=True, exist_ok=True)
    if cluster == "local":
        executor = submitit.LocalExecutor(folder=str(files.submitit), python=python)
        executor.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN, tasks_per_node=1, nodes=1)
        return executor
    # The shim blocks the stop signals before Python imports anything: a preemption signal that
    # comes while the task starts waits for the node entry's handlers instead of killing it.
    executor = submitit.SlurmExecutor(folder=str(files.submitit), python=shim_python(shlex.quote(python)))
    executor.update_parameters(**slurm_parameters(spec))
    return executor


def submit(spec: TeacherSpec, files: TeacherFiles) -> str:
    """Submit the teacher's job now (no checks); returns the job id."""
    from podium.launcher.node_entry import run_node

    cluster = spec.launcher.get("cluster", "slurm")
    if cluster == "local" and spec.num_nodes != 1:
        raise SubmitError(f"teacher {spec.name!r}: cluster 'local' runs one node, the plan asks "
                          f"for num_nodes={spec.num_nodes}")
    executor = make_executor(spec, files)
    try:
        with _clean_environ():
            job = executor.submit(run_node, str(files.folder))
    except Exception as exc:
        raise SubmitError(f"teacher {spec.name!r}: submitting to {cluster} failed: {exc}") from exc
    logger.info("teacher %r: submitted job %s (%s)", spec.name, job.job_id, cluster)
    return str(job.job_id)


def _claim(files: TeacherFiles) -> bool:
    """Create the claim file exclusively; False when another live ``up`` holds it."""
    payload = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()})
    try:
        fd = os.open(files.claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        found = try_read_json(files.claim)
        # Age from the file itself: a claim just created has no payload yet and is not stale.
        try:
            age = time.time() - files.claim.stat().st_mtime
        except FileNotFoundError:
            return False
        same_host_dead = (found.ok and found.data.get("host") == socket.gethostname()
                          and not Path(f"/proc/{found.data.get('pid')}").exists())
        if age > CLAIM_STALE_S or same_host_dead:
            logger.warning("removing stale claim %s (age %.0fs)", files.claim, age)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(files.claim)
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(payload)
    return True


def ensure_submitted(spec: TeacherSpec, files: TeacherFiles, timeout_s: float = 120.0) -> tuple[JobRecord, str]:
    """The teacher's live job, submitting one only if none is pending or running.

    Returns ``(record, action)`` with action ``reattached``, ``submitted`` or ``resubmitted``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        record = JobRecord.read(files)
        if record is not None:
            state = job_states([record]).get(record.job_id)
            if state is not None and state.alive:
                return record, "reattached"
        if _claim(files):
            try:
                fresh = JobRecord.read(files)  # another `up` may have finished just before our claim
                if fresh is not None and (record is None or fresh.job_id != record.job_id):
                    state = job_states([fresh]).get(fresh.job_id)
                    if state is not None and state.alive:
                        return fresh, "reattached"
                    record = fresh
                job_id = submit(spec, files)
                previous = ([*record.previous_job_ids, record.job_id] if record else [])
                new = JobRecord(teacher_key=spec.key, teacher_name=spec.name, job_id=job_id,
                                cluster=spec.launcher.get("cluster", "slurm"), submitted_at=time.time(),
                                folder=str(files.submitit), previous_job_ids=previous,
                                submitted_by=f"{socket.gethostname()}:{os.getpid()}")
                new.write(files)
                return new, "resubmitted" if record else "submitted"
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(files.claim)
        if time.monotonic() > deadline:
            raise SubmitError(f"teacher {spec.name!r}: another `podium up` holds {files.claim} "
                              f"for more than {timeout_s:.0f}s")
        time.sleep(0.2)
