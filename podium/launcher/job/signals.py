"""The stop signals of a node task, and what each one means for the generation (a
:class:`~podium.launcher.backends.base.StopIntent`, what the kind's job environment answers).

The handler only records the signal and sets ``stop``; what the stop *means* is asked once, from a
thread, of the teacher's backend (:meth:`Signals.intent`), because the same SIGTERM is a cancel, a
preemption or a time limit depending on what the scheduler is doing (on Slurm: ``scontrol show
job``, see :meth:`podium.launcher.backends.slurm.environment.SlurmEnvironment.stop_intent`):

==========================  ==============  =======  ===============================================
what happened               kind            requeue  drain
==========================  ==============  =======  ===============================================
SIGUSR1/SIGUSR2 (--signal)  ``signal``      yes      up to ``server.drain_s``, ending before the
                                                     job's end time
SIGTERM, preempted          ``preempt``     yes      until the grace time is nearly over
SIGTERM, time limit ahead   ``time_limit``  policy   until the end time is nearly there
                                                     (``restart.at_time_limit``; default: no)
SIGTERM, requeued by Slurm  ``requeued``    no       none: Slurm brings the next generation
SIGTERM/SIGINT otherwise    ``cancel``      no       none (``scancel``: KillWait follows)
the stop file               ``down``        no       up to ``server.drain_s``
a fault found by the head   ``fault``       policy   none: the generation is broken
==========================  ==============  =======  ===============================================

Signals that arrive before the handlers are installed wait, blocked, until they are
(:mod:`podium.launcher.common.procs`).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from podium.launcher.backends.base import URGENT_KINDS, StopIntent

Classifier = Callable[[str], StopIntent]


class Signals:
    """SIGTERM / SIGINT / SIGUSR1 / SIGUSR2, the stop file and faults -> one stop event and its intent."""

    HANDLED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGUSR1, signal.SIGINT)

    def __init__(self, classify: Classifier | None = None, drain_s: float = 10.0) -> None:
        self.stop = threading.Event()
        self.urgent = threading.Event()
        self.received: list[tuple[str, float]] = []
        self._classify = classify
        self._drain_s = drain_s
        self._intent: StopIntent | None = None
        self._lock = threading.Lock()

    def set_classifier(self, classify: Classifier, drain_s: float) -> None:
        """What stops mean, once the task knows its backend and settings (signals come earlier)."""
        self._classify, self._drain_s = classify, drain_s

    def install(self) -> None:
        for sig in self.HANDLED:
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.received.append((signal.Signals(signum).name, time.time()))
        self.stop.set()

    def request_stop(self, why: str, *, kind: str = "down", requeue: bool = False) -> None:
        """Stop for a reason of podium's own (the stop file, a fault the head found)."""
        drain = 0.0 if kind in URGENT_KINDS else self._drain_s
        self._set(StopIntent(kind, requeue, time.time() + drain, why))
        self.stop.set()

    def _set(self, intent: StopIntent) -> None:
        with self._lock:
            if self._intent is None:
                self._intent = intent
                if intent.urgent:
                    self.urgent.set()

    def intent(self) -> StopIntent | None:
        """What the stop means (None while no stop was asked for); classified once."""
        if not self.stop.is_set():
            return None
        if self._intent is None and self.received:
            name = self.received[0][0]
            try:
                intent = self._classify(name) if self._classify is not None else None
            except Exception as exc:  # the scheduler could not be asked: assume the safe reading
                intent = None
                why = f"{name}, not classified ({type(exc).__name__}: {exc})"
            else:
                why = name
            if intent is None:
                user = name in ("SIGUSR1", "SIGUSR2")
                intent = StopIntent("signal" if user else "cancel", user,
                                    time.time() + (self._drain_s if user else 0.0), f"stopped by {why}")
            self._set(intent)
        return self._intent

    @property
    def requeue(self) -> bool:
        intent = self.intent()
        return intent is not None and intent.requeue

    @property
    def first(self) -> tuple[str, float] | None:
        return self.received[0] if self.received else None

    def describe(self) -> str:
        """Why this generation stops, for the record's ``reason`` and the logs."""
        intent = self.intent()
        if intent is None:
            return "stop requested"
        names = " then ".join(dict.fromkeys(name for name, _ in self.received))
        return intent.why + (f" ({names})" if names and names not in intent.why else "") + (
            "; requeueing" if intent.requeue else "")
