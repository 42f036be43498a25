"""Cluster kinds, one small class each (``base.Backend``): ``slurm`` and ``local``.

:func:`backend_for` is the only place that maps a ``podium.cluster`` value to its class; the rest
of the launcher holds a ``Backend`` and never asks which one it is.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Iterable

from podium.launcher.backends.base import Backend, NodeContext, Submission, SubmitError
from podium.launcher.jobs import JobRecord
from podium.launcher.slurm_state import JobState

SUBMIT_GRACE_S = 60.0  # a job this fresh that the scheduler does not list yet counts as pending

__all__ = ["Backend", "NodeContext", "Submission", "SubmitError", "backend_for", "job_states"]


def backend_for(cluster: str) -> Backend:
    """The backend of a ``podium.cluster`` value (``slurm`` or ``local``)."""
    if cluster == "slurm":
        from podium.launcher.backends.slurm import SlurmBackend

        return SlurmBackend()
    if cluster == "local":
        from podium.launcher.backends.local import LocalBackend

        return LocalBackend()
    raise ValueError(f"unknown cluster kind {cluster!r} (slurm or local)")


def job_states(records: Iterable[JobRecord]) -> dict[str, JobState]:
    """Current states of the records' jobs, one query per backend; a job submitted less than
    :data:`SUBMIT_GRACE_S` ago that its scheduler does not list yet counts as pending."""
    by_cluster: dict[str, list[JobRecord]] = defaultdict(list)
    records = list(records)
    for rec in records:
        by_cluster[rec.cluster].append(rec)
    out: dict[str, JobState] = {}
    for cluster, recs in by_cluster.items():
        out.update(backend_for(cluster).states(recs))
    now = time.time()
    for rec in records:
        if rec.job_id not in out and now - rec.submitted_at < SUBMIT_GRACE_S:
            out[rec.job_id] = JobState(rec.job_id, "PENDING", raw_state="SUBMITTED")
    return out
