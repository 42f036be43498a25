"""Cluster kinds by name: the one place that maps a ``podium.cluster`` value to its classes.

A kind is a :class:`BackendKind`: its :class:`Scheduler` (the login node: submit, states, cancel)
and its :class:`JobEnvironment` (inside the job: node context, requeue, what a stop means), see
:mod:`podium.launcher.backends.base`. ``slurm`` and ``local`` are registered by the dotted names of
their classes, and a half's module is imported when it is first asked for (:func:`scheduler_for`,
:func:`environment_for`): a job that asks for its environment never imports its scheduler (for Slurm,
the sbatch renderer and its refusal table). :func:`registered` puts another kind in place for a block
(a test's fake scheduler, by class) and then puts back what was there. The rest of the launcher holds
a scheduler or an environment and never asks which kind it is.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from podium.launcher.backends.base import JobEnvironment, NodeContext, Scheduler, Submission, SubmitError
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.slurm_state import JobState

SUBMIT_GRACE_S = 60.0  # a job this fresh that the scheduler does not list yet counts as pending

__all__ = ["BackendKind", "JobEnvironment", "NodeContext", "Scheduler", "Submission", "SubmitError",
           "environment_for", "job_states", "kind_for", "known_kinds", "live_job_ids", "register", "registered",
           "scheduler_for", "unregister"]


@dataclass(frozen=True)
class BackendKind:
    """One cluster kind: its two halves, each a class or the dotted name of one, imported when asked for."""

    name: str
    scheduler_ref: type[Scheduler] | str
    environment_ref: type[JobEnvironment] | str

    @property
    def scheduler(self) -> type[Scheduler]:
        return _half(self.name, self.scheduler_ref, Scheduler)

    @property
    def environment(self) -> type[JobEnvironment]:
        return _half(self.name, self.environment_ref, JobEnvironment)


_KINDS: dict[str, BackendKind] = {}


def _half(name: str, ref: type | str, base: type) -> Any:
    """The class ``ref`` names (imported on first use), checked to be a ``base`` that carries ``name``."""
    cls: Any = ref
    if isinstance(ref, str):
        module, _, attr = ref.rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"cluster kind {name!r}: {cls!r} is not a {base.__name__}")
    _check_name(name, cast("type[Scheduler] | type[JobEnvironment]", cls))
    return cls


def _check_name(name: str, *classes: type[Scheduler] | type[JobEnvironment]) -> None:
    """Both classes carry the kind's name (what submissions and messages say), so it must be theirs."""
    wrong = [f"{cls.__name__}.name is {cls.name!r}" for cls in classes if cls.name != name]
    if wrong:
        raise ValueError(f"cluster kind {name!r}: {', '.join(wrong)}")


def register(name: str, scheduler: type[Scheduler] | str,
             environment: type[JobEnvironment] | str) -> BackendKind | None:
    """Run the cluster kind ``name`` on these classes, or on the classes these dotted names
    (``package.module.Class``) give once first asked for; returns the registration it replaces, if
    any. A class must carry the kind's name: checked here, or when a dotted name is imported."""
    _check_name(name, *(ref for ref in (scheduler, environment) if not isinstance(ref, str)))
    previous = _KINDS.get(name)
    _KINDS[name] = BackendKind(name, scheduler, environment)
    return previous


def unregister(name: str) -> None:
    """Forget the cluster kind ``name`` (no error when it is not registered)."""
    _KINDS.pop(name, None)


@contextlib.contextmanager
def registered(name: str, scheduler: type[Scheduler] | str,
               environment: type[JobEnvironment] | str) -> Iterator[BackendKind]:
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


def live_job_ids(records: Sequence[JobRecord]) -> set[str]:
    """The ids of these jobs that are pending or running (:func:`job_states`)."""
    return {job_id for job_id, state in job_states(records).items() if state.alive}


register("slurm", "podium.launcher.backends.slurm.scheduler.SlurmScheduler",
         "podium.launcher.backends.slurm.environment.SlurmEnvironment")
register("local", "podium.launcher.backends.local.scheduler.LocalScheduler",
         "podium.launcher.backends.local.environment.LocalEnvironment")
