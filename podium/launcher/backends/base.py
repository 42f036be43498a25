"""What every cluster kind provides, split as submitit splits it, and the data both halves share.

A cluster kind (``slurm``, ``local``) is two small classes, registered together by name in
:mod:`podium.launcher.backends`: a :class:`Scheduler`, what runs on the login node (submitit's
``Executor``), and a :class:`JobEnvironment`, what runs inside the job (submitit's
``JobEnvironment``). The rest of the launcher asks them, and never asks which kind it has.

=========================  ==============  ==============================================
method                     class           does
=========================  ==============  ==============================================
``check(spec)``            Scheduler       refuse what this kind cannot run (exit 2)
``notices(spec)``          Scheduler       one line each: how it runs ``spec`` otherwise
                                           than asked (``up`` prints them on stderr)
``materialise(spec, f)``   Scheduler       pure: the exact script/command ``submit``
                                           sends (what ``render``/``--dry-run`` print)
``submit(submission)``     Scheduler       send it; the job id
``states(jobs)``           Scheduler       :class:`JobState` per job (one query)
``find_live(spec, f)``     Scheduler       ids of pending/running jobs of this teacher
                                           (this run dir), recorded in ``job.json`` or not
``cancel(jobs)``           Scheduler       end those jobs (``job.json`` records)
``log_paths(f, job, n)``   Scheduler       where the node tasks write
``node_context()``         JobEnvironment  rank, node count, generation, host
``node_gpus(spec)``        JobEnvironment  GPUs each node's Ray offers (0: CPU slots)
``node_cpus(spec)``        JobEnvironment  CPUs each node's Ray offers
``node_address(iface)``    JobEnvironment  the address Ray and the endpoint use
``requeue(ctx, ...)``      JobEnvironment  ask for the next generation; why not, if not
``stop_intent(ctx, sig)``  JobEnvironment  what a stop signal means (cancel, preemption,
                                           time limit, ...): :mod:`podium.launcher.job.signals`
=========================  ==============  ==============================================
"""

from __future__ import annotations

import abc
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from podium.config.spec import TeacherSpec
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.procs import shim_command
from podium.launcher.common.ray_ports import node_ip
from podium.launcher.common.slurm_state import JobState
from podium.rendezvous.records import Generation

NODE_ENTRY_MODULE = "podium.launcher.job.node_entry"


class SubmitError(RuntimeError):
    """Submitting a teacher's job failed; names the teacher and the scheduler's answer."""


@dataclass(frozen=True)
class Submission:
    """One teacher's job, materialised: exactly what :meth:`Scheduler.submit` sends.

    ``text`` is the sbatch script (Slurm) or the shell command line (local) as it is submitted;
    :meth:`render` is what ``podium render`` and ``podium up --dry-run`` print.
    """

    backend: str
    teacher: str  # the teacher's label, ``<name>-<key8>``
    folder: Path  # the submitit folder: scripts and logs of this teacher's jobs
    text: str
    command: tuple[str, ...]  # the node entry every task runs
    spec: TeacherSpec | None = None  # what it was materialised from (a refusal is explained by it)

    def render(self) -> str:
        return self.text if self.text.endswith("\n") else self.text + "\n"


@dataclass(frozen=True)
class NodeContext:
    """Where one node task runs (from the kind's :meth:`JobEnvironment.node_context`)."""

    job_id: str
    rank: int
    num_nodes: int
    restart: int
    host: str
    log_job_id: str = ""  # the id the task's log files are named by, when not ``job_id`` (local: the PID)

    @property
    def generation(self) -> Generation:
        return Generation(int(self.job_id), self.restart)


# The scheduler requeues the job itself (``scontrol requeue``): this generation does not ask for the
# next one, yet the next one comes; its record says so (``will_retry``).
REQUEUED_BY_SCHEDULER = "requeued"
URGENT_KINDS = frozenset({REQUEUED_BY_SCHEDULER, "cancel", "fault"})


@dataclass(frozen=True)
class StopIntent:
    """What a stop means: its kind, whether this generation requeues its job when it is done, and
    until when (wall clock) it may drain; ``why`` is the sentence the record and logs show."""

    kind: str
    requeue: bool
    drain_until: float
    why: str

    @property
    def urgent(self) -> bool:
        return self.kind in URGENT_KINDS

    def drain_s(self, now: float | None = None) -> float:
        return max(0.0, self.drain_until - (time.time() if now is None else now))


def node_command(spec: TeacherSpec, files: TeacherFiles) -> tuple[str, ...]:
    """The command every node task runs: the node entry on the teacher's folder, behind the shim
    that blocks the stop signals before Python loads anything (:mod:`podium.launcher.common.procs`)."""
    python = spec.launcher.slurm.python or sys.executable
    return (*shim_command(python), "-u", "-m", NODE_ENTRY_MODULE, str(files.folder))


def asked_gpus(spec: TeacherSpec) -> int:
    """GPUs the recipe asks of each node: ``gpus_per_node`` with ``podium.slurm.gpus`` on, else 0."""
    return spec.gpus_per_node if spec.launcher.slurm.gpus else 0


def host_name() -> str:
    return socket.gethostname()


class Scheduler(abc.ABC):
    """One cluster kind on the login node (see the module table)."""

    name: ClassVar[str]

    def check(self, spec: TeacherSpec) -> None:  # noqa: B027 - an optional hook: a kind that runs anything has none
        """Raise :class:`SubmitError` for what this kind cannot run."""

    def notices(self, spec: TeacherSpec) -> list[str]:
        """One-line notices about how ``spec`` runs here otherwise than its recipe asks."""
        return []

    @abc.abstractmethod
    def materialise(self, spec: TeacherSpec, files: TeacherFiles) -> Submission: ...

    @abc.abstractmethod
    def submit(self, submission: Submission) -> str: ...

    @abc.abstractmethod
    def states(self, jobs: Sequence[JobRecord]) -> dict[str, JobState]:
        """States of these jobs by id; a job the scheduler does not know (yet) is absent."""

    @abc.abstractmethod
    def find_live(self, spec: TeacherSpec, files: TeacherFiles) -> list[str]:
        """Ids of the pending or running jobs that carry this teacher's identity (its key and run
        dir), whatever ``job.json`` says: how a job submitted by an ``up`` that died before writing
        ``job.json`` is found."""

    @abc.abstractmethod
    def cancel(self, jobs: Sequence[JobRecord]) -> None: ...

    def log_paths(self, files: TeacherFiles, job_id: str, ranks: Sequence[int]) -> list[Path]:
        """Each rank's output and error logs, in rank order."""
        return [path for rank in ranks for path in (files.task_log(job_id, rank), files.task_err(job_id, rank))]


class JobEnvironment(abc.ABC):
    """One cluster kind inside the job, where every node task runs (see the module table)."""

    name: ClassVar[str]
    #: the job comes back as the next generation when its head asks (:meth:`requeue`)
    requeues: ClassVar[bool] = False
    #: a node task signalled by the scheduler leaves with ``os._exit`` once torn down (Slurm's
    #: KillWait would otherwise SIGKILL it in interpreter finalizers, and delay the requeue)
    exit_fast_after_signal: ClassVar[bool] = False

    @abc.abstractmethod
    def node_context(self) -> NodeContext: ...

    def node_gpus(self, spec: TeacherSpec) -> int:
        """GPUs each node's Ray offers the teacher's workers (``ray start --num-gpus``); with 0 the
        workers are CPU slots. The scheduler allocated what the recipe asked, so the recipe's count."""
        return asked_gpus(spec)

    def node_cpus(self, spec: TeacherSpec) -> int:
        """CPUs each node's Ray offers (``ray start --num-cpus``): the recipe's ``cpus_per_task``."""
        return spec.cpus_per_task

    def node_address(self, interface: str | None) -> str:
        return node_ip(interface)

    def requeue(self, ctx: NodeContext, *, exclude: Sequence[str] = (), delay_s: float = 0.0) -> str | None:
        """Ask for the next generation of this job (not on the ``exclude`` nodes, not before
        ``delay_s``); None when asked, else why it was not."""
        return f"cluster {self.name!r} does not requeue jobs"

    def stop_intent(self, ctx: NodeContext, signal_name: str, spec: TeacherSpec) -> StopIntent:
        """What a stop signal means here (see :mod:`podium.launcher.job.signals`)."""
        user = signal_name in ("SIGUSR1", "SIGUSR2")
        drain = spec.launcher.server.drain_s if user else 0.0
        return StopIntent("signal" if user else "cancel", user and self.requeues, time.time() + drain,
                          f"stopped by {signal_name}")
