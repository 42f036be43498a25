"""The launcher's files inside one teacher's folder (``<run_dir>/teachers/<name>-<key8>/``).

A teacher with several replicas has one such folder per replica (``<name>-<key8>-r<i>/`` for
replica i >= 1, :func:`podium.rendezvous.layout.teacher_dir_name`), each with every file below: a
replica is launched, requeued, fenced and stopped as a teacher is.

``podium.rendezvous.layout`` names the run directory and the endpoint record; this module names
what the launcher adds next to it. Every file is replaced whole (atomic write), written by one
process only.

===================================  ==============  ==============================================
path (in the teacher's folder)       written by      holds
===================================  ==============  ==============================================
``spec.json``                        ``up``          the ``TeacherSpec`` (what every node reads)
``job.json``                         ``up``          job record: job id, cluster, submitted_at,
                                                     submitit folder, previous job ids, the
                                                     launcher settings it was submitted with
``submit.claim.<N>``                 ``up``          numbered O_EXCL claims: the highest is held
                                                     while one ``up`` submits (pid, start time,
                                                     host, time), then marked released; taking
                                                     over claim N creates N+1 (``claims.py``);
                                                     stale when its holder here has ended, or
                                                     (held elsewhere) after ``CLAIM_STALE_S``
``submitting.json``                  ``up``          the launcher settings of the last submission,
                                                     written just before it: what a job adopted
                                                     without ``job.json`` was submitted with
``submitit/``                        submitit        ``%j_submission.sh`` (the script as submitted),
                                                     ``%j_%t_log.out/err`` (node tasks),
                                                     ``%j_sbatch.out`` (the batch step),
                                                     ``controller.log`` (local controller)
``nodes/<job>-<restart>/head.json``  node rank 0     Ray head address of that generation (0600)
``nodes/<job>-<restart>/ray_token``  node rank 0     that generation's Ray auth token (0600)
``nodes/<job>-<restart>/<rank>.json`` node <rank>    that node's state: host, ip, pid, ports, log,
                                                     ``failed`` + error when its start failed (0600)
``restarts.json``                    the head        how each generation ended, failures in a
                                                     row, requeues, excluded nodes
                                                     (:mod:`podium.launcher.common.restarts`)
``stop.request``                     ``down``        asks the head of the job it names
                                                     (``job_id``) to stop; ignored by other jobs
===================================  ==============  ==============================================
In the run dir itself, ``rendezvous.claim.<N>`` are the same numbered claims around every edit of
``rendezvous.json`` (``up``, ``scale``). Every file here is 0600 in a 0700 run dir.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from podium.rendezvous.layout import ENDPOINT_FILE, RunLayout

if TYPE_CHECKING:  # pragma: no cover
    from podium.config.spec import TeacherSpec

SPEC_FILE = "spec.json"
JOB_FILE = "job.json"
CLAIM_PREFIX = "submit.claim."  # + the claim's number
RENDEZVOUS_CLAIM_PREFIX = "rendezvous.claim."  # in the run dir, + the claim's number
SUBMITTING_FILE = "submitting.json"
SUBMITIT_DIR = "submitit"
NODES_DIR = "nodes"
HEAD_FILE = "head.json"
STOP_FILE = "stop.request"
RESTARTS_FILE = "restarts.json"
RAY_TOKEN_FILE = "ray_token"
PLAN_FILE = "plan.json"  # in the run dir: the resolved plan
RECIPE_FILE = "recipe.yaml"  # in the run dir: the resolved recipe (as loaded, overrides applied)
# submitit's log of one node task; a script's srun names them all with %j (job) and %t (rank)
TASK_LOG_NAME = "{job}_{rank}_log.{stream}"
SBATCH_LOG_NAME = "%j_sbatch.out"  # sbatch's own output (the batch step), %j: the job id
CLAIM_STALE_S = 120.0
FILE_MODE = 0o600  # every file the launcher writes in the run dir (itself 0700)


def numbered_files(folder: Path, prefix: str) -> list[int]:
    """The numbers N of the files ``<prefix><N>`` in ``folder``, in no particular order."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    pattern = re.compile(re.escape(prefix) + r"(\d+)")
    return [int(m.group(1)) for m in map(pattern.fullmatch, names) if m]


@dataclass(frozen=True)
class TeacherFiles:
    """Paths of one teacher's folder (pure: creates nothing)."""

    folder: Path

    @classmethod
    def of(cls, run_dir: str | Path, name: str, key: str, replica: int = 0) -> TeacherFiles:
        return cls(RunLayout(Path(run_dir)).teacher_dir(name, key, replica))

    @classmethod
    def of_spec(cls, run_dir: str | Path, spec: TeacherSpec) -> TeacherFiles:
        """The folder of the replica ``spec`` describes."""
        return cls.of(run_dir, spec.name, spec.key, spec.replica)

    @property
    def run_dir(self) -> Path:
        return self.folder.parent.parent

    @property
    def spec(self) -> Path:
        return self.folder / SPEC_FILE

    @property
    def job(self) -> Path:
        return self.folder / JOB_FILE

    def claim(self, number: int) -> Path:
        return self.folder / f"{CLAIM_PREFIX}{number}"

    def claim_numbers(self) -> list[int]:
        """Numbers of the claim files present (``submit.claim.<N>``), in no particular order."""
        return numbered_files(self.folder, CLAIM_PREFIX)

    @property
    def submitting(self) -> Path:
        return self.folder / SUBMITTING_FILE

    @property
    def submitit(self) -> Path:
        return self.folder / SUBMITIT_DIR

    @property
    def endpoint(self) -> Path:
        return self.folder / ENDPOINT_FILE

    @property
    def restarts(self) -> Path:
        return self.folder / RESTARTS_FILE

    @property
    def stop_request(self) -> Path:
        return self.folder / STOP_FILE

    def generation_dir(self, job_id: int | str, restart: int) -> Path:
        return self.folder / NODES_DIR / f"{job_id}-{restart}"

    def head(self, job_id: int | str, restart: int) -> Path:
        return self.generation_dir(job_id, restart) / HEAD_FILE

    def ray_token(self, job_id: int | str, restart: int) -> Path:
        """The generation's Ray auth token (0600; written by the head, read by every node)."""
        return self.generation_dir(job_id, restart) / RAY_TOKEN_FILE

    def node(self, job_id: int | str, restart: int, rank: int) -> Path:
        return self.generation_dir(job_id, restart) / f"{rank}.json"

    def task_log(self, job_id: str, rank: int) -> Path:
        """submitit's log of one node task (``%j_%t_log.out``)."""
        return self.submitit / TASK_LOG_NAME.format(job=job_id, rank=rank, stream="out")

    def task_err(self, job_id: str, rank: int) -> Path:
        return self.submitit / TASK_LOG_NAME.format(job=job_id, rank=rank, stream="err")

    def task_log_pattern(self, stream: str) -> Path:
        """Every node task's log as a script's ``srun --output``/``--error`` names it (``stream``:
        ``out`` or ``err``): ``%j_%t_log.<stream>``."""
        return self.submitit / TASK_LOG_NAME.format(job="%j", rank="%t", stream=stream)

    @property
    def sbatch_log_pattern(self) -> Path:
        """The batch step's output as ``sbatch --output`` names it (``%j_sbatch.out``)."""
        return self.submitit / SBATCH_LOG_NAME
