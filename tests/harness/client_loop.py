"""A trainer's view in a thread: :class:`ClientLoop` calls ``get_logprobs`` in a loop through one
client and checks every answer against the expected logprobs; each :class:`Call` records its start,
end, error and exception, so a test asks how many calls answered after a moment and which waited.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

COMEBACK_S = 180.0  # requeue + cred_expire + Ray + model load, on a loaded 2-core machine


@dataclass
class Call:
    start: float
    end: float
    error: float | None = None  # max |logprob - oracle|
    exception: str | None = None


class ClientLoop:
    """A trainer's view: one client, ``get_logprobs`` in a loop, every answer checked."""

    def __init__(self, run_dir: Path, alias: str, data: dict, expected: np.ndarray,
                 patience_s: float = COMEBACK_S + 60, **options: Any) -> None:
        """``patience_s``: how long a call waits for a ready generation (podium's own default is 30
        minutes; a test bounds it by how long its teacher may be away); ``options``: more client
        options."""
        self.run_dir, self.alias, self.data, self.expected = run_dir, alias, data, expected
        self.patience_s = patience_s
        self.options = options
        self.teacher: Any = None  # the client's TeacherClient for the alias, once connected (to ask it)
        self.calls: list[Call] = []
        self.retries = 0  # requests the client sent again (the teacher was restarting)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="client-loop", daemon=True)

    def start(self) -> ClientLoop:
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout_s if timeout_s is not None else self._call_timeout_s() + 30)
        assert not self._thread.is_alive(), "the client loop did not end"

    def _run(self) -> None:
        import podium.client as pc

        # A call in flight when the loop is told to stop may wait for a restarting teacher: bounded.
        with pc.connect(self.run_dir / "rendezvous.json", ready_timeout_s=self.patience_s,
                        call_timeout_s=self._call_timeout_s(), **self.options) as client:
            self.teacher = client.teacher(self.alias)
            while not self._stop.is_set():
                t0 = time.time()
                try:
                    got = np.asarray(client.get_logprobs(self.alias, self.data)["logprobs"])
                    self.calls.append(Call(t0, time.time(), error=float(np.abs(got - self.expected).max())))
                except Exception as exc:  # recorded, asserted on by the test
                    self.calls.append(Call(t0, time.time(), exception=f"{type(exc).__name__}: {exc}"))
                self.retries = client.teacher(self.alias).retries

    def _call_timeout_s(self) -> float:
        return max(2 * COMEBACK_S, self.patience_s)

    def answered_after(self, t: float) -> int:
        return sum(1 for c in self.calls if c.start > t and c.exception is None)

    def waited(self, t0: float, t1: float, threshold_s: float = 1.0) -> list[Call]:
        """Calls that started in [t0, t1) and took longer than ``threshold_s``."""
        return [c for c in self.calls if t0 <= c.start < t1 and c.end - c.start > threshold_s]
