"""The restart policy of one teacher: how each generation ended, and whether the next one comes.

``teachers/<name>-<key8>/restarts.json`` (written by the head of the current generation; the
generations of one teacher run one after the other) is the ledger :class:`RestartLedger`. At the
end of every generation the head asks :func:`decide` what to do:

==============  ========================================  =======================================
how it ended    counts as                                  next
==============  ========================================  =======================================
``failed``      a failure (start, join, load, lost node)   requeue after a backoff (``backoff_s``,
                                                           doubling up to ``max_backoff_s``);
                                                           ``max_consecutive_failures`` in a row:
                                                           final, no requeue
``preempted``   a requeue, not a failure                   requeue at once; beyond ``max_requeues``:
                                                           final
``time_limit``  the end (``at_time_limit: stop``, the      nothing; with ``at_time_limit: requeue``
                default), or a requeue                     as ``preempted``
``stopped``     the end (``scancel``, ``podium down``)     nothing
==============  ========================================  =======================================

A generation that reached ``ready`` resets the failure count (:meth:`RestartLedger.ready`): a
teacher that served and then lost a node is not one failure away from giving up. The decision is
pure; the head publishes it in the endpoint record (``extra.restart``) and ``podium status`` shows it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from podium.config.launcher import RestartSettings
from podium.launcher.common.files import FILE_MODE, TeacherFiles
from podium.rendezvous.atomic import FileReadError, atomic_write_json, parse_model, read_json
from podium.rendezvous.schema import VersionedFile

logger = logging.getLogger(__name__)

Outcome = Literal["failed", "preempted", "time_limit", "stopped"]
KEEP_OUTCOMES = 50


class GenerationOutcome(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    generation: str
    outcome: Outcome
    reason: str
    node: str | None = None  # the node at fault, when one is
    time: float


class RestartLedger(VersionedFile):
    """The content of ``restarts.json``."""

    SCHEMA_VERSION: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "a restart ledger"
    model_config = ConfigDict(frozen=True, extra="forbid")

    consecutive_failures: int = 0
    requeues: int = 0  # preemption and time-limit requeues so far
    outcomes: tuple[GenerationOutcome, ...] = ()
    excluded_nodes: tuple[str, ...] = ()

    @classmethod
    def read(cls, files: TeacherFiles) -> RestartLedger:
        """The ledger (an empty one when there is none; a corrupt one is logged and restarted)."""
        try:
            return parse_model(cls, read_json(files.restarts), files.restarts, "a restart ledger")
        except FileReadError as exc:
            if exc.kind != "missing":
                logger.warning("%s; starting a new ledger", exc)
            return cls()

    def write(self, files: TeacherFiles) -> None:
        atomic_write_json(files.restarts, self.model_dump(mode="json"), mode=FILE_MODE)

    def ready(self) -> RestartLedger:
        """A generation served: failures before it no longer count."""
        return self.model_copy(update={"consecutive_failures": 0})

    def ended(self, generation: str, outcome: Outcome, reason: str, node: str | None = None) -> RestartLedger:
        entry = GenerationOutcome(generation=generation, outcome=outcome, reason=reason[:2000], node=node,
                                  time=time.time())
        update: dict = {"outcomes": (*self.outcomes, entry)[-KEEP_OUTCOMES:]}
        if outcome == "failed":
            update["consecutive_failures"] = self.consecutive_failures + 1
        elif outcome in ("preempted", "time_limit"):
            update["requeues"] = self.requeues + 1
        return self.model_copy(update=update)


@dataclass(frozen=True)
class Decision:
    """What comes after a generation: ``requeue`` (after ``delay_s``), or nothing; ``final`` when
    the teacher has given up (a failure count or the requeue limit reached)."""

    requeue: bool
    final: bool
    delay_s: float
    why: str

    def to_json(self) -> dict:
        return {"requeue": self.requeue, "final": self.final, "delay_s": self.delay_s, "why": self.why}


def decide(ledger: RestartLedger, outcome: Outcome, settings: RestartSettings, *, can_requeue: bool) -> Decision:
    """The decision after a generation ended with ``outcome`` (``ledger`` already counts it)."""
    if outcome == "stopped":
        return Decision(False, False, 0.0, "stopped")
    if outcome == "time_limit" and settings.at_time_limit == "stop":
        return Decision(False, False, 0.0, "time limit reached: stopped (restart.at_time_limit=stop)")
    if not can_requeue:
        return Decision(False, outcome == "failed", 0.0, "this cluster kind does not requeue jobs")
    if outcome == "failed":
        n, limit = ledger.consecutive_failures, settings.max_consecutive_failures
        if n >= limit:
            return Decision(False, True, 0.0,
                            f"{n} consecutive failed generations (restart.max_consecutive_failures={limit})")
        delay = min(settings.backoff_s * 2 ** (n - 1), settings.max_backoff_s)
        return Decision(True, False, delay, f"failure {n} of at most {limit} in a row: requeued after {delay:.0f}s")
    max_requeues = settings.max_requeues
    if max_requeues is not None and ledger.requeues > max_requeues:
        return Decision(False, True, 0.0, f"{ledger.requeues} requeues (restart.max_requeues={max_requeues})")
    return Decision(True, False, 0.0, f"{outcome.replace('_', ' ')}: requeued (requeue {ledger.requeues})")


def excluded_after(ledger: RestartLedger, node: str | None, settings: RestartSettings) -> RestartLedger:
    """The ledger with ``node`` added to the nodes the next generations avoid (when configured)."""
    if node is None or not settings.exclude_lost_nodes or node in ledger.excluded_nodes:
        return ledger
    return ledger.model_copy(update={"excluded_nodes": (*ledger.excluded_nodes, node)})
