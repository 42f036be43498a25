"""Callers in threads that call until stopped: each call a function that raises when its answer is
wrong; answers counted, every exception recorded, for a test to assert on (the pinned-URL trainers
the front's tests run beside a teacher's faults)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


class CallLoops:
    """One thread per function in ``calls``, each calling it until :meth:`stop` (or the ``with``
    block's end); :attr:`answers` counts the calls that returned, :attr:`errors` says what the others
    raised. ``join_s``: how long :meth:`stop` waits for a call in flight."""

    def __init__(self, calls: Sequence[Callable[[], None]], join_s: float) -> None:
        self.answers, self.errors = 0, []
        self.join_s = join_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(call,), daemon=True) for call in calls]

    def _loop(self, call: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                call()
                with self._lock:
                    self.answers += 1
            except Exception as exc:  # asserted on by the test
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def start(self) -> CallLoops:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(self.join_s)

    def __enter__(self) -> CallLoops:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
