"""``job.json``: a teacher's current job and the ones before it (written by ``up`` only).

A teacher started with plain sbatch has no ``job.json``; its endpoint record names its job
(:meth:`JobRecord.from_endpoint`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from pydantic import ValidationError

from podium.config.launcher import TeacherLauncherSettings
from podium.launcher.files import TeacherFiles
from podium.rendezvous.atomic import FileReadError, atomic_write_json, try_read_json
from podium.rendezvous.records import read_record

logger = logging.getLogger(__name__)


@dataclass
class JobRecord:
    """``job.json``: the teacher's current job and the ones before it."""

    teacher_key: str
    teacher_name: str
    job_id: str
    cluster: str  # the backend that submitted it
    submitted_at: float
    folder: str  # the submitit folder
    submitted_by: str = ""
    previous_job_ids: list[str] = field(default_factory=list)
    # The launcher settings the job was submitted with (``TeacherLauncherSettings`` as JSON); None
    # when not known (a job.json of an older podium, a plain-sbatch teacher).
    launcher: Optional[dict[str, Any]] = None

    def launcher_settings(self) -> Optional[TeacherLauncherSettings]:
        """:attr:`launcher`, validated; None when absent or no longer valid."""
        if self.launcher is None:
            return None
        try:
            return TeacherLauncherSettings.model_validate(self.launcher)
        except ValidationError as exc:
            logger.warning("job %s: recorded launcher settings do not validate: %s", self.job_id, exc)
            return None

    @classmethod
    def read(cls, files: TeacherFiles) -> Optional["JobRecord"]:
        found = try_read_json(files.job)
        if not found.ok:
            if found.error is not None and found.error.kind != "missing":
                logger.warning("%s", found.error)
            return None
        data = found.data
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @classmethod
    def from_endpoint(cls, files: TeacherFiles, cluster: str) -> Optional["JobRecord"]:
        """The job a teacher without ``job.json`` (plain sbatch) runs as, from its endpoint record."""
        try:
            endpoint = read_record(files.endpoint)
        except FileReadError:
            return None
        return cls(teacher_key=endpoint.teacher_key, teacher_name=endpoint.teacher_name,
                   job_id=str(endpoint.generation.job_id), cluster=cluster, submitted_at=endpoint.started_at,
                   folder=str(files.submitit), submitted_by="sbatch")

    @classmethod
    def of(cls, files: TeacherFiles, cluster: str) -> Optional["JobRecord"]:
        """``job.json``, else what the endpoint record says."""
        return cls.read(files) or cls.from_endpoint(files, cluster)

    def write(self, files: TeacherFiles) -> None:
        atomic_write_json(files.job, asdict(self))
