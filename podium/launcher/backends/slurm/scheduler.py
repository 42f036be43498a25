"""Slurm on the login node: a teacher's typed request, rendered into the sbatch script submitted.

One materialisation (torchx's split): :func:`sbatch_request` turns a ``TeacherSpec`` into an
:class:`SbatchRequest` (pure), :meth:`SbatchRequest.render` renders ``templates/teacher.sbatch.j2``
into the script text (pure), and :meth:`SlurmScheduler.submit` hands exactly that text to submitit,
whose ``SlurmExecutor`` writes it to ``submitit/<job>_submission.sh``, runs ``sbatch`` and parses
the job id. ``podium render`` and ``podium up --dry-run`` print the same text, so what a user
reads is what Slurm gets.

====================================  ========================================================
request                               from
====================================  ========================================================
``--job-name``, ``--comment``         ``podium-<name>-<key8>[-r<i>]``; the identity ``job_comment``
``--nodes``, ``--ntasks-per-node=1``  ``num_nodes``; one task per node (the node entry)
``--cpus-per-task``                   ``slurm.cpus_per_task``, else workers per node + 1
``--gpus-per-node`` / ``--gres``      ``gpus_per_node`` when ``slurm.gpus`` (``gpu_request``)
``--time`` (minutes)                  ``slurm.time``
``--signal=<sig>@<lead>``             ``slurm.signal``, ``slurm.signal_lead_s``
``--requeue``                         ``slurm.requeue``
partition/account/qos/constraint/mem  as set; ``--exclusive`` with ``slurm.exclusive``
``extra_sbatch``                      verbatim ``--key=value`` (last, so they win)
srun ``--container-*``                ``slurm.container_image`` / ``container_mounts`` (pyxis)
====================================  ========================================================

Every value that reaches a shell line goes through ``shlex.quote``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from podium.config.spec import TeacherSpec
from podium.launcher.backends.base import Scheduler, Submission, SubmitError, node_command
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.slurm_state import (
    JobState,
    SlurmQueryError,
    query_live_by_comment,
    query_states,
    time_to_minutes,
)
from podium.launcher.login.sbatch_errors import explain, one_line

TEMPLATES = Path(__file__).resolve().parents[3] / "templates"
TEACHER_TEMPLATE = "teacher.sbatch.j2"
SUBMITIT_TEMP_SCRIPTS = ".submission_file_*.sh"  # submitit's script before sbatch gives it a job id


def _remove(paths: set[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def job_name(spec: TeacherSpec) -> str:
    """``podium-<name>-<key8>``, ``-r<i>`` added for replica i >= 1."""
    replica = spec.identity[len(spec.key):]  # the identity's replica suffix ("" for replica 0)
    return f"podium-{spec.name}-{spec.key[:8]}{replica}"


def job_comment(spec: TeacherSpec, files: TeacherFiles) -> str:
    """The replica's identity, carried by its job as ``--comment``: ``podium:<identity>:<run dir
    id>`` (:attr:`TeacherSpec.identity`: the key, ``-r<i>`` added for replica i >= 1), the run dir
    id being 16 hex of the sha256 of the run dir's absolute resolved path. Slurm knows it from the
    moment ``sbatch`` is accepted, so a job whose ``job.json`` was never written (its ``up`` died in
    between) is still found (:meth:`SlurmScheduler.find_live`)."""
    run_dir = str(files.run_dir.absolute().resolve())
    return f"podium:{spec.identity}:{hashlib.sha256(run_dir.encode()).hexdigest()[:16]}"


def _option(name: str, value: Any) -> str:
    return f"--{name}" if value is True else f"--{name}={shlex.quote(str(value))}"


@dataclass(frozen=True)
class SbatchRequest:
    """Everything one teacher asks of Slurm, typed; :meth:`render` makes the script."""

    name: str
    key: str
    aliases: tuple[str, ...]
    replica: int  # 0: the script names no replica (a teacher's only or first allocation)
    options: tuple[tuple[str, Any], ...]  # sbatch option name (without --) -> value (True: a flag)
    setup: tuple[str, ...]  # shell lines before srun, verbatim (the user's own)
    srun_args: tuple[str, ...]
    command: tuple[str, ...]

    def option(self, name: str) -> Any:
        return dict(self.options).get(name)

    def render(self) -> str:
        env = Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                          keep_trailing_newline=True, autoescape=False)
        return env.get_template(TEACHER_TEMPLATE).render(
            name=self.name, key=self.key, aliases=", ".join(self.aliases), replica=self.replica,
            options=[_option(k, v) for k, v in self.options],
            setup=list(self.setup),
            srun_args=shlex.join(self.srun_args),
            command=shlex.join(self.command),
        )


def sbatch_request(spec: TeacherSpec, files: TeacherFiles) -> SbatchRequest:
    """The request of ``spec`` (pure; see the module table)."""
    s = spec.launcher.slurm
    options: dict[str, Any] = {
        "job-name": job_name(spec),
        "comment": job_comment(spec, files),
        "nodes": spec.num_nodes,
        "ntasks-per-node": 1,
        "cpus-per-task": spec.cpus_per_task,
        "time": time_to_minutes(s.time),
        "signal": f"{s.signal}@{s.signal_lead_s}",
        "output": str(files.sbatch_log_pattern),
        "open-mode": "append",
    }
    for name in ("partition", "account", "qos", "constraint", "mem"):
        value = getattr(s, name)
        if value:
            options[name] = str(value)
    if s.exclusive:
        options["exclusive"] = True
    if s.gpus:
        if s.gpu_request == "gres":
            options["gres"] = f"gpu:{spec.gpus_per_node}"
        else:
            options["gpus-per-node"] = spec.gpus_per_node
    if s.requeue:
        options["requeue"] = True
    options.update({str(k): v for k, v in s.extra_sbatch.items()})
    # --kill-on-bad-exit=0: a task that fails does not take the others down with it; the head
    # watches its nodes, publishes which one failed and why, and decides the job's fate.
    srun = ["--unbuffered", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            f"--output={files.task_log_pattern('out')}", f"--error={files.task_log_pattern('err')}"]
    if s.container_image:
        srun.append(f"--container-image={s.container_image}")
        if s.container_mounts:
            srun.append(f"--container-mounts={','.join(s.container_mounts)}")
    return SbatchRequest(name=spec.name, key=spec.key, aliases=spec.aliases, replica=spec.replica,
                         options=tuple(sorted(options.items())), setup=tuple(s.setup),
                         srun_args=tuple(srun), command=node_command(spec, files))


def _executor_class() -> type:
    """submitit's ``SlurmExecutor``, submitting podium's rendered script instead of its own."""
    import submitit

    class PodiumSlurmExecutor(submitit.SlurmExecutor):
        def __init__(self, folder: Path, script: str) -> None:
            super().__init__(folder=str(folder))
            self._script = script

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return self._script

    return PodiumSlurmExecutor


class SlurmScheduler(Scheduler):
    name = "slurm"

    def materialise(self, spec: TeacherSpec, files: TeacherFiles) -> Submission:
        request = sbatch_request(spec, files)
        return Submission(backend=self.name, teacher=spec.label, folder=files.submitit,
                          text=request.render(), command=request.command, spec=spec)

    def submit(self, submission: Submission) -> str:
        """sbatch through submitit; a refusal is a :class:`SubmitError` of one line that names the
        recipe settings at fault and the fix (:mod:`podium.launcher.login.sbatch_errors`), and leaves
        nothing behind (no job; submitit's temporary script removed)."""
        import submitit

        folder = submission.folder
        folder.mkdir(parents=True, exist_ok=True)  # sbatch --output points here
        before = set(folder.glob(SUBMITIT_TEMP_SCRIPTS))
        try:
            executor = _executor_class()(folder, submission.text)
            # submitit's own path from a command to a job: writes the file, runs sbatch, parses the
            # id, keeps the script as <job>_submission.sh. The command is in the script already.
            # submitit also prints a refusal to stderr: podium's one line says it, with the fix.
            with contextlib.redirect_stderr(io.StringIO()):
                job = executor._submit_command(shlex.join(submission.command))
        except submitit.core.utils.FailedJobError as exc:
            _remove(set(folder.glob(SUBMITIT_TEMP_SCRIPTS)) - before)
            if submission.spec is None:
                refused = one_line(str(exc))
                raise SubmitError(f"teacher {submission.teacher}: sbatch refused the job: {refused}") from exc
            raise SubmitError(explain(str(exc), submission.spec)) from exc
        except Exception as exc:
            _remove(set(folder.glob(SUBMITIT_TEMP_SCRIPTS)) - before)
            raise SubmitError(f"teacher {submission.teacher}: sbatch failed: {exc}") from exc
        return str(job.job_id)

    def states(self, jobs: Sequence[JobRecord]) -> dict[str, JobState]:
        return query_states([job.job_id for job in jobs])

    def find_live(self, spec: TeacherSpec, files: TeacherFiles) -> list[str]:
        return query_live_by_comment(job_name(spec), job_comment(spec, files))

    def cancel(self, jobs: Sequence[JobRecord]) -> None:
        job_ids = [job.job_id for job in jobs]
        if not job_ids:
            return
        # --me: only this user's jobs, whatever a job.json names
        proc = subprocess.run(["scancel", "--me", *job_ids], capture_output=True, text=True)
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
            raise SlurmQueryError(f"scancel {' '.join(job_ids)}: {proc.stderr.strip()}")
