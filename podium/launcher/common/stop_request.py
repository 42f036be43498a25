"""``stop.request``: ``podium down`` asking one job of a teacher to stop (it, not a later one).

Written by ``down`` on a login node (:func:`request_stop`); read by the teacher's head while it
serves (:func:`stop_requested`). The request names the job it is for, so a request left behind for
an older job never stops a later one of the same teacher.
"""

from __future__ import annotations

import os
import time
from typing import ClassVar

from pydantic import ConfigDict

from podium.launcher.common.files import FILE_MODE, TeacherFiles
from podium.rendezvous.atomic import FileReadError, atomic_write_json, parse_model, read_json
from podium.rendezvous.schema import VersionedFile


class StopRequest(VersionedFile):
    """The content of ``teachers/<name>-<key8>[-r<i>]/stop.request``."""

    SCHEMA_VERSION: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "a stop request"
    model_config = ConfigDict(frozen=True, extra="allow")

    job_id: str  # the job asked to stop
    time: float  # when it was asked
    pid: int  # the asking process (on whichever host ran `podium down`)


def request_stop(files: TeacherFiles, job_id: str) -> StopRequest:
    """Ask job ``job_id`` of this teacher to stop (replacing any earlier request)."""
    request = StopRequest(job_id=str(job_id), time=time.time(), pid=os.getpid())
    atomic_write_json(files.stop_request, request.model_dump(mode="json"), mode=FILE_MODE)
    return request


def stop_requested(files: TeacherFiles, job_id: int | str) -> StopRequest | None:
    """The request for job ``job_id``, if there is one (a missing, unreadable or other job's
    request is none: the head asks again at its next look)."""
    try:
        request = parse_model(StopRequest, read_json(files.stop_request), files.stop_request, "a stop request")
    except FileReadError:
        return None
    return request if request.job_id == str(job_id) else None
