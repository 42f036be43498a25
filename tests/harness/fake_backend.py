"""A fake Slurm for the launcher's logic tests: :func:`fake_slurm` registers, for a block, a
:class:`FakeScheduler` (through :func:`podium.launcher.backends.registered`, so the launcher holds
it as it holds the real one) over a :class:`FakeJobs` the test reads and changes.

Submitting (``podium.launcher.login.submission.submit``, patched) numbers jobs from 100 and enters them in
``jobs`` with the state asked for; ``states`` answers from ``jobs``; ``find_live`` lists the
``unrecorded`` jobs (the scheduler runs them, no ``job.json`` names them) that are ``RUNNING``;
``cancel`` records the job and marks it ``CANCELLED``; each ``states`` query is timed in ``queries``.
The real cluster: ``tests/integration/``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from podium.config.spec import TeacherSpec
from podium.launcher.backends import registered
from podium.launcher.backends.slurm.environment import SlurmEnvironment
from podium.launcher.backends.slurm.scheduler import SlurmScheduler
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.slurm_state import JobState
from podium.launcher.login import submission

FIRST_JOB_ID = 100


@dataclass
class FakeJobs:
    """What the fake scheduler knows: state by job id, and what was asked of it."""

    jobs: dict[str, str] = field(default_factory=dict)  # job id -> Slurm state
    submitted: list[str] = field(default_factory=list)  # job ids, in submission order
    cancelled: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)  # jobs that find_live reports while RUNNING
    queries: list[float] = field(default_factory=list)  # time.monotonic() of each states() query
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # submissions number jobs under it


class FakeScheduler(SlurmScheduler):
    """``SlurmScheduler`` answering from :attr:`fake` instead of squeue/sacct/scancel."""

    fake: ClassVar[FakeJobs]

    def states(self, jobs: Sequence[JobRecord]) -> dict[str, JobState]:
        self.fake.queries.append(time.monotonic())
        known = self.fake.jobs
        return {r.job_id: JobState(r.job_id, known[r.job_id]) for r in jobs if r.job_id in known}

    def find_live(self, spec: TeacherSpec, files: TeacherFiles) -> list[str]:
        return [j for j in self.fake.unrecorded if self.fake.jobs.get(j) == "RUNNING"]

    def cancel(self, jobs: Sequence[JobRecord]) -> None:
        for rec in jobs:
            self.fake.cancelled.append(rec.job_id)
            self.fake.jobs[rec.job_id] = "CANCELLED"


@contextlib.contextmanager
def fake_slurm(monkeypatch: pytest.MonkeyPatch, *, state: str = "RUNNING",
               submit_delay_s: float = 0.0) -> Iterator[FakeJobs]:
    """The ``slurm`` kind runs on a fresh :class:`FakeJobs` for the block; a submitted job starts in
    ``state``, after ``submit_delay_s`` (a slow sbatch widens a race window)."""
    fake = FakeJobs()

    def submit(spec: TeacherSpec, files: TeacherFiles) -> str:
        if submit_delay_s:
            time.sleep(submit_delay_s)
        with fake.lock:
            job_id = str(FIRST_JOB_ID + len(fake.submitted))
            fake.submitted.append(job_id)
            fake.jobs[job_id] = state
        return job_id

    scheduler = type("FakeSlurm", (FakeScheduler,), {"fake": fake})
    monkeypatch.setattr(submission, "submit", submit)
    with registered("slurm", scheduler, SlurmEnvironment):
        yield fake
