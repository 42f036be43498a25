"""The stop signals of a node task, turned into events the task's threads wait on.

==========================  ==================================================================
what arrives                meaning
==========================  ==================================================================
SIGUSR1 / SIGUSR2           ``--signal`` (the time limit ahead) or a preemption with
                            ``preempt_send_user_signal``: drain, then requeue
SIGTERM / SIGINT            ``scancel``, ``scontrol requeue``, the end of a preemption's grace
                            time: ``urgent``, tear down now
the stop file               ``podium down`` for a job that cannot be signalled (local)
==========================  ==================================================================

The handler only records and sets events: everything else happens in the threads that wait on
them. Signals that arrive before the handlers are installed wait, blocked, until they are
(:mod:`podium.launcher.procs`).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Optional


class Signals:
    """SIGTERM / SIGINT / SIGUSR1 / SIGUSR2 (and the stop file) -> one stop event."""

    HANDLED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGUSR1, signal.SIGINT)

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.urgent = threading.Event()
        self.requeue = False
        self.received: list[tuple[str, float]] = []
        self.stop_requested_by: Optional[str] = None  # the stop file (``podium down``, local)

    def install(self) -> None:
        for sig in self.HANDLED:
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.received.append((signal.Signals(signum).name, time.time()))
        if signum in (signal.SIGUSR1, signal.SIGUSR2):
            self.requeue = True
        else:
            self.urgent.set()
        self.stop.set()

    def request_stop(self, why: str) -> None:
        self.stop_requested_by = why
        self.stop.set()

    @property
    def first(self) -> Optional[tuple[str, float]]:
        return self.received[0] if self.received else None

    def describe(self) -> str:
        """Why this generation stops, for the record's ``reason`` and the logs."""
        if self.received:
            names = " then ".join(dict.fromkeys(name for name, _ in self.received))
            what = "preempted or near its time limit" if self.requeue else "stopped by Slurm"
            return f"{what} ({names})" + ("; requeueing" if self.requeue else "")
        return self.stop_requested_by or "stop requested"
