"""The ``local`` cluster kind on the login side: submitit's local controller on this machine, one
node, no Slurm.

The job is submitit's local ``Controller`` (``python -m submitit.local._local FOLDER``), which runs
the same node entry as a Slurm task, with ``SUBMITIT_LOCAL_*`` describing it; its job id is the
controller's PID above a sequence newer than every job the teacher's folder records
(:func:`~podium.launcher.backends.local.environment.local_job_id`, :func:`next_sequence`). podium
starts the controller itself rather than through
``submitit.local.local.start_controller`` for two reasons: the controller must not hold its
caller's stdin/stdout/stderr (``out=$(podium up --wait)`` would never see an end of file), and it
runs in a session of its own, so a Ctrl-C at ``podium up --wait`` does not end the teachers (a
local teacher outlives ``up``, as a Slurm job does). The environment :meth:`LocalScheduler.submit`
sets is the controller's contract (``submitit/local/local.py``). What the machine's GPUs allow is
:mod:`podium.launcher.backends.local.environment`'s (:func:`gpu_use`).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from podium.config.spec import TeacherSpec
from podium.launcher.backends.base import Scheduler, Submission, SubmitError, node_command
from podium.launcher.backends.local.environment import (
    PID_SPAN,
    SEQUENCE_ENV,
    controller_pid,
    gpu_use,
    local_job_id,
)
from podium.launcher.common.files import NODES_DIR, TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.slurm_state import JobState
from podium.rendezvous.atomic import try_read_json

logger = logging.getLogger(__name__)

CONTROLLER_MODULE = "submitit.local._local"
CONTROLLER_LOG = "controller.log"
TIMEOUT_S = 30 * 24 * 3600  # the controller ends a job after its timeout: a month
STOP_WAIT_S = 30.0


def is_controller_of(pid: int, folder: str | Path) -> bool:
    """``pid`` is a submitit controller of this submitit folder (its argv names both), so a reused
    PID is not mistaken for it; a zombie has no argv."""
    try:
        argv = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return False
    return CONTROLLER_MODULE.encode() in argv and os.fsencode(str(folder)) in argv


def controller_alive(job: JobRecord) -> bool:
    """The job's controller still runs (its PID is a controller of the job's folder)."""
    return is_controller_of(controller_pid(job.job_id), job.folder) if job.job_id.isdigit() else False


def find_controllers(folder: str | Path) -> list[str]:
    """Job ids of the running controllers of this submitit folder (a ``/proc`` scan; the sequence
    from each controller's environment)."""
    return [local_job_id(_sequence_of(int(name)), int(name)) for name in os.listdir("/proc")
            if name.isdigit() and is_controller_of(int(name), folder)]


def _sequence_of(pid: int) -> int:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return 0
    prefix = f"{SEQUENCE_ENV}=".encode()
    values = [item[len(prefix):] for item in environ if item.startswith(prefix)]
    return int(values[0]) if values and values[0].isdigit() else 0


def recorded_job_ids(files: TeacherFiles) -> list[int]:
    """Every job id the teacher's folder names: ``job.json`` (and the jobs before it), the endpoint
    record's generation, ``stop.request``, the generations' node folders."""
    found: list[object] = []
    job = try_read_json(files.job).data
    if isinstance(job, dict):
        found += [job.get("job_id"), *(job.get("previous_job_ids") or [])]
    record = try_read_json(files.endpoint).data
    if isinstance(record, dict) and isinstance(record.get("generation"), dict):
        found.append(record["generation"].get("job_id"))
    request = try_read_json(files.stop_request).data
    if isinstance(request, dict):
        found.append(request.get("job_id"))
    nodes = files.folder / NODES_DIR
    if nodes.is_dir():
        found += [name.split("-", 1)[0] for name in os.listdir(nodes)]
    return [int(str(value)) for value in found if str(value).isdigit()]


def next_sequence(files: TeacherFiles) -> int:
    """A sequence whose job ids are above every job id the teacher's folder records."""
    return max(recorded_job_ids(files), default=0) // PID_SPAN + 1


class LocalScheduler(Scheduler):
    name = "local"

    def check(self, spec: TeacherSpec) -> None:
        if spec.num_nodes != 1:
            raise SubmitError(f"teacher {spec.name!r}: cluster 'local' runs one node, the plan asks for "
                              f"num_nodes={spec.num_nodes} (set podium.cluster: slurm, or num_nodes: 1)")
        gpu_use(spec)

    def notices(self, spec: TeacherSpec) -> list[str]:
        return [notice] if (notice := gpu_use(spec)[1]) else []

    def materialise(self, spec: TeacherSpec, files: TeacherFiles) -> Submission:
        command = node_command(spec, files)
        replica = f" replica {spec.replica}" if spec.replica else ""
        text = (f"# podium teacher {spec.name} ({spec.key}){replica}, serving: {', '.join(spec.aliases)}\n"
                f"# cluster: local: submitit's local controller runs this command as the job's one task\n"
                f"# (logs: {files.task_log('<job>', 0)} and .err)\n"
                f"{shlex.join(command)}\n")
        return Submission(backend=self.name, teacher=spec.label, folder=files.submitit, text=text, command=command)

    def submit(self, submission: Submission) -> str:
        folder = submission.folder
        folder.mkdir(parents=True, exist_ok=True)
        sequence = next_sequence(TeacherFiles(folder.parent))  # the submitit folder is in the teacher's
        env = dict(os.environ)
        env[SEQUENCE_ENV] = str(sequence)
        env.update(
            SUBMITIT_EXECUTOR="local",
            SUBMITIT_LOCAL_NTASKS="1",
            SUBMITIT_LOCAL_COMMAND=shlex.join(submission.command),
            SUBMITIT_LOCAL_TIMEOUT_S=str(TIMEOUT_S),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S="120",
            SUBMITIT_LOCAL_NODEID="0",
            SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="",
            SUBMITIT_LOCAL_WITH_SHELL="",
        )
        try:
            with open(folder / CONTROLLER_LOG, "ab") as log:
                process = subprocess.Popen([sys.executable, "-m", CONTROLLER_MODULE, str(folder)], env=env,
                                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, close_fds=True)
        except OSError as exc:
            raise SubmitError(f"teacher {submission.teacher}: starting the local controller failed: {exc}") from exc
        return local_job_id(sequence, process.pid)

    def states(self, jobs: Sequence[JobRecord]) -> dict[str, JobState]:
        return {job.job_id: JobState(job.job_id, "RUNNING" if controller_alive(job) else "COMPLETED")
                for job in jobs}

    def find_live(self, spec: TeacherSpec, files: TeacherFiles) -> list[str]:
        return find_controllers(files.submitit)

    def cancel(self, jobs: Sequence[JobRecord]) -> None:
        """SIGTERM to each controller (it passes it to its task, which drains and stops); one that
        is still there after :data:`STOP_WAIT_S` gets SIGKILL."""
        live = [job for job in jobs if controller_alive(job)]
        for job in live:
            _signal(job, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(controller_alive(job) for job in live) and time.monotonic() < deadline:
            time.sleep(0.2)
        for job in live:
            if controller_alive(job):
                logger.warning("local job %s did not stop within %.0fs: SIGKILL", job.job_id, STOP_WAIT_S)
                _signal(job, signal.SIGKILL)

    def log_paths(self, files: TeacherFiles, job_id: str, ranks: Sequence[int]) -> list[Path]:
        # submitit names the task logs by the controller's PID
        return [*super().log_paths(files, str(controller_pid(job_id)), ranks), files.submitit / CONTROLLER_LOG]


def _signal(job: JobRecord, sig: signal.Signals) -> None:
    try:
        os.kill(controller_pid(job.job_id), sig)
    except ProcessLookupError:
        pass
