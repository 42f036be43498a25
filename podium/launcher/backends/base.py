"""What every cluster kind provides, and the typed submission it materialises.

A backend is one small class per cluster kind (``slurm``, ``local``), in submitit's style: the
rest of the launcher asks it, and never asks which one it has.

=========================  ==================  ============================================
method                     runs on             does
=========================  ==================  ============================================
``check(spec)``            login node          refuse what this kind cannot run (exit 2)
``notices(spec)``          login node          one line each: how it runs ``spec`` otherwise
                                               than asked (``up`` prints them on stderr)
``materialise(spec, f)``   login node          pure: the exact script/command ``submit``
                                               sends (what ``render``/``--dry-run`` print)
``submit(submission)``     login node          send it; the job id
``states(jobs)``           login node          :class:`JobState` per job (one query)
``find_live(spec, f)``     login node          ids of pending/running jobs of this teacher
                                               (this run dir), recorded in ``job.json`` or not
``cancel(jobs)``           login node          end those jobs (``job.json`` records)
``log_paths(f, job, n)``   login node          where the node tasks write
``node_context()``         in the allocation   rank, node count, generation, host
``node_gpus(spec)``        both                GPUs each node's Ray offers (0: CPU slots)
``node_address(iface)``    in the allocation   the address Ray and the endpoint use
``requeue(ctx, ...)``      in the allocation   ask for the next generation; why not, if not
``stop_intent(ctx, sig)``  in the allocation   what a stop signal means (cancel, preemption,
                                               time limit, ...): :mod:`podium.launcher.signals`
=========================  ==================  ============================================
"""

from __future__ import annotations

import abc
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional, Sequence

from podium.config.spec import TeacherSpec
from podium.launcher.files import TeacherFiles
from podium.launcher.jobs import JobRecord
from podium.launcher.procs import shim_command
from podium.launcher.signals import StopIntent
from podium.launcher.slurm_state import JobState
from podium.rendezvous.records import Generation

NODE_ENTRY_MODULE = "podium.launcher.node_entry"


class SubmitError(RuntimeError):
    """Submitting a teacher's job failed; names the teacher and the scheduler's answer."""


@dataclass(frozen=True)
class Submission:
    """One teacher's job, materialised: exactly what :meth:`Backend.submit` sends.

    ``text`` is the sbatch script (Slurm) or the shell command line (local) as it is submitted;
    :meth:`render` is what ``podium render`` and ``podium up --dry-run`` print.
    """

    backend: str
    teacher: str  # the teacher's label, ``<name>-<key8>``
    folder: Path  # the submitit folder: scripts and logs of this teacher's jobs
    text: str
    command: tuple[str, ...]  # the node entry every task runs
    spec: Optional[TeacherSpec] = None  # what it was materialised from (a refusal is explained by it)

    def render(self) -> str:
        return self.text if self.text.endswith("\n") else self.text + "\n"


@dataclass(frozen=True)
class NodeContext:
    """Where one node task runs (from the backend's job environment)."""

    job_id: str
    rank: int
    num_nodes: int
    restart: int
    host: str

    @property
    def generation(self) -> Generation:
        return Generation(int(self.job_id), self.restart)


def node_command(spec: TeacherSpec, files: TeacherFiles) -> tuple[str, ...]:
    """The command every node task runs: the node entry on the teacher's folder, behind the shim
    that blocks the stop signals before Python loads anything (:mod:`podium.launcher.procs`)."""
    python = spec.launcher.slurm.python or sys.executable
    return (*shim_command(python), "-u", "-m", NODE_ENTRY_MODULE, str(files.folder))


class Backend(abc.ABC):
    """One cluster kind (see the module table)."""

    name: ClassVar[str]
    #: the job comes back as the next generation when its head asks (:meth:`requeue`)
    requeues: ClassVar[bool] = False
    #: a node task signalled by the scheduler leaves with ``os._exit`` once torn down (Slurm's
    #: KillWait would otherwise SIGKILL it in interpreter finalizers, and delay the requeue)
    exit_fast_after_signal: ClassVar[bool] = False

    def check(self, spec: TeacherSpec) -> None:
        """Raise :class:`SubmitError` for what this backend cannot run."""

    def notices(self, spec: TeacherSpec) -> list[str]:
        """One-line notices about how ``spec`` runs here otherwise than its recipe asks."""
        return []

    def node_gpus(self, spec: TeacherSpec) -> int:
        """GPUs each node's Ray offers the teacher's workers (``ray start --num-gpus``); with 0 the
        workers are CPU slots. Slurm allocated what the recipe asked, so the recipe's count."""
        return spec.gpus_per_node if spec.launcher.slurm.gpus else 0

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

    @abc.abstractmethod
    def log_paths(self, files: TeacherFiles, job_id: str, ranks: Sequence[int]) -> list[Path]: ...

    @abc.abstractmethod
    def node_context(self) -> NodeContext: ...

    def node_address(self, interface: Optional[str]) -> str:
        from podium.launcher.ray_bootstrap import node_ip

        return node_ip(interface)

    def requeue(self, ctx: NodeContext, *, exclude: Sequence[str] = (), delay_s: float = 0.0) -> Optional[str]:
        """Ask for the next generation of this job (not on the ``exclude`` nodes, not before
        ``delay_s``); None when asked, else why it was not."""
        return f"cluster {self.name!r} does not requeue jobs"

    def stop_intent(self, ctx: NodeContext, signal_name: str, spec: TeacherSpec) -> StopIntent:
        """What a stop signal means here (see :mod:`podium.launcher.signals`)."""
        user = signal_name in ("SIGUSR1", "SIGUSR2")
        drain = spec.launcher.server.drain_s if user else 0.0
        return StopIntent("signal" if user else "cancel", user and self.requeues, time.time() + drain,
                          f"stopped by {signal_name}")


def host_name() -> str:
    return socket.gethostname()
