"""``job.json``: a teacher's current job and the ones before it (written by ``up`` only).

A teacher started with plain sbatch has no ``job.json``; its endpoint record names its job
(:meth:`JobRecord.from_endpoint`).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, ValidationError

from podium.config.launcher import TeacherLauncherSettings
from podium.launcher.common.files import FILE_MODE, TeacherFiles
from podium.rendezvous.atomic import FileReadError, atomic_write_json, parse_model, read_json
from podium.rendezvous.records import read_record
from podium.rendezvous.schema import VersionedFile

logger = logging.getLogger(__name__)


class JobRecord(VersionedFile):
    """``job.json``: the teacher's current job and the ones before it."""

    SCHEMA_VERSION: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "a job record"
    model_config = ConfigDict(extra="ignore")

    teacher_key: str
    teacher_name: str
    job_id: str
    cluster: str  # the backend that submitted it
    submitted_at: float
    folder: str  # the submitit folder
    submitted_by: str = ""
    previous_job_ids: list[str] = Field(default_factory=list)
    # The launcher settings the job was submitted with (``TeacherLauncherSettings`` as JSON); None
    # when not known (a job.json of an older podium, a plain-sbatch teacher).
    launcher: dict[str, Any] | None = None

    def launcher_settings(self) -> TeacherLauncherSettings | None:
        """:attr:`launcher`, validated; None when absent or no longer valid."""
        if self.launcher is None:
            return None
        try:
            return TeacherLauncherSettings.model_validate(self.launcher)
        except ValidationError as exc:
            logger.warning("job %s: recorded launcher settings do not validate: %s", self.job_id, exc)
            return None

    @classmethod
    def read(cls, files: TeacherFiles) -> JobRecord | None:
        """``job.json``; None when there is none (a corrupt or newer one is logged)."""
        try:
            return parse_model(cls, read_json(files.job), files.job, "a job record")
        except FileReadError as exc:
            if exc.kind != "missing":
                logger.warning("%s", exc)
            return None

    @classmethod
    def from_endpoint(cls, files: TeacherFiles, cluster: str) -> JobRecord | None:
        """The job a teacher without ``job.json`` (plain sbatch) runs as, from its endpoint record."""
        try:
            endpoint = read_record(files.endpoint)
        except FileReadError:
            return None
        return cls(teacher_key=endpoint.teacher_key, teacher_name=endpoint.teacher_name,
                   job_id=str(endpoint.generation.job_id), cluster=cluster, submitted_at=endpoint.started_at,
                   folder=str(files.submitit), submitted_by="sbatch")

    @classmethod
    def of(cls, files: TeacherFiles, cluster: str) -> JobRecord | None:
        """``job.json``, else what the endpoint record says."""
        return cls.read(files) or cls.from_endpoint(files, cluster)

    def write(self, files: TeacherFiles) -> None:
        atomic_write_json(files.job, self.model_dump(mode="json"), mode=FILE_MODE)
