"""Cluster kinds by name: the one place that maps a ``podium.cluster`` value to its classes.

A kind is a :class:`BackendKind`: its :class:`Scheduler` (the login node: submit, states, cancel)
and its :class:`JobEnvironment` (inside the job: node context, requeue, what a stop means), see
:mod:`podium.launcher.backends.base`. ``slurm`` and ``local`` are registered when this package is
imported; :func:`registered` puts another in place for a block (a test's fake scheduler) and then
puts back what was there. The rest of the launcher holds a scheduler or an environment and never
asks which kind it is.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from podium.launcher.backends.base import JobEnvironment, NodeContext, Scheduler, Submission, SubmitError
from podium.launcher.backends.local.environment import LocalEnvironment
from podium.launcher.backends.local.scheduler import LocalScheduler
from podium.launcher.backends.slurm.environment import SlurmEnvironment
from podium.launcher.backends.slurm.scheduler import SlurmScheduler
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.slurm_state import JobState

SUBMIT_GRACE_S = 60.0  # a job this fresh that the scheduler does not list yet counts as pending

__all__ = ["BackendKind", "JobEnvironment", "NodeContext", "Scheduler", "Submission", "SubmitError",
           "environment_for", "job_states", "kind_for", "known_kinds", "register", "registered", "scheduler_for",
           "unregister"]


@dataclass(frozen=True)
class BackendKind:
    """One cluster kind: the classes of its two halves."""

    name: str
    scheduler: type[Scheduler]
    environment: type[JobEnvironment]


_KINDS: dict[str, BackendKind] = {}


def register(name: str, scheduler: type[Scheduler], environment: type[JobEnvironment]) -> BackendKind | None:
    """Run the cluster kind ``name`` on these classes; returns the registration it replaces, if any.
    Both classes carry the name (what submissions and messages say), so it must be theirs."""
    if scheduler.name != name or environment.name != name:
        raise ValueError(f"cluster kind {name!r}: {scheduler.__name__}.name is {scheduler.name!r}, "
                         f"{environment.__name__}.name is {environment.name!r}")
    previous = _KINDS.get(name)
    _KINDS[name] = BackendKind(name, scheduler, environment)
    return previous


def unregister(name: str) -> None:
    """Forget the cluster kind ``name`` (no error when it is not registered)."""
    _KINDS.pop(name, None)


@contextlib.contextmanager
def registered(name: str, scheduler: type[Scheduler], environment: type[JobEnvironment]) -> Iterator[BackendKind]:
    """:func:`register` for the block, then restore what ``name`` was before (or nothing)."""
    previous = register(name, scheduler, environment)
    try:
        yield _KINDS[name]
    finally:
        if previous is None:
            unregister(name)
        else:
            _KINDS[name] = previous


def known_kinds() -> tuple[str, ...]:
    return tuple(sorted(_KINDS))


def kind_for(cluster: str) -> BackendKind:
    try:
        return _KINDS[cluster]
    except KeyError:
        raise ValueError(f"unknown cluster kind {cluster!r} (known: {', '.join(known_kinds())})") from None


def scheduler_for(cluster: str) -> Scheduler:
    """The login-node half of a ``podium.cluster`` value's kind."""
    return kind_for(cluster).scheduler()


def environment_for(cluster: str) -> JobEnvironment:
    """The in-job half of a ``podium.cluster`` value's kind."""
    return kind_for(cluster).environment()


def job_states(records: Iterable[JobRecord]) -> dict[str, JobState]:
    """Current states of the records' jobs, one query per kind; a job submitted less than
    :data:`SUBMIT_GRACE_S` ago that its scheduler does not list yet counts as pending."""
    by_cluster: dict[str, list[JobRecord]] = defaultdict(list)
    records = list(records)
    for rec in records:
        by_cluster[rec.cluster].append(rec)
    out: dict[str, JobState] = {}
    for cluster, recs in by_cluster.items():
        out.update(scheduler_for(cluster).states(recs))
    now = time.time()
    for rec in records:
        if rec.job_id not in out and now - rec.submitted_at < SUBMIT_GRACE_S:
            out[rec.job_id] = JobState(rec.job_id, "PENDING", raw_state="SUBMITTED")
    return out


register("slurm", SlurmScheduler, SlurmEnvironment)
register("local", LocalScheduler, LocalEnvironment)
