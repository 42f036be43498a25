"""A request sent a second time when its answer is late (hedging): how, not when.

When and where are rules of their own (:func:`podium.client.routing.hedge_after_s`, the hedge
budget, :meth:`podium.client.replicas.ReplicaSet.acquire_hedge`). Here:

- :class:`Race`: one request's two copies, the first sent by the caller's thread (on its own
  keep-alive connection), the second by a sender thread (on that thread's). The first answer wins:
  a 2xx of the second cancels the first; an answer of the first, or the first bytes of its body
  arriving, cancel the second. A cancelled copy's connection is shut down and closed
  (:class:`~podium.client.transport.Cancel`), never read on or reused half-read. When the first
  copy fails (its replica went away) while the second runs, the caller waits for the second.
- :class:`Hedger`: one timer thread per teacher client that starts each due hedge on a few sender
  threads, so a call that is never hedged costs no thread, and the senders keep their connections.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from email.message import Message
from typing import Generic, TypeVar

from podium.client.transport import BodyWatch, Cancel

logger = logging.getLogger(__name__)

SENDER_THREADS = 8  # hedges in flight at once per teacher client (the budget keeps them few)

T = TypeVar("T")  # what the second copy's answer is handed over as


class Race(Generic[T]):
    """The two copies of one request (see the module doc); thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.first = Cancel()  # the caller's copy
        self.second = Cancel()  # the hedge
        self._over = False  # no second copy starts from now (the first answers, or failed)
        self._first_answered = False  # the first copy answered, or its answer is arriving
        self._second_running = False
        self._won: T | None = None  # the second copy's answer, when it won

    def start_second(self) -> bool:
        """Whether the second copy may go now (not once the first is over or answering)."""
        with self._cond:
            if self._over:
                return False
            self._second_running = True
            return True

    def second_answered(self, answer: T) -> bool:
        """The second copy answered (2xx): it wins (the first is cancelled) unless the first did."""
        with self._cond:
            self._second_running = False
            self._cond.notify_all()
            if self._first_answered:
                return False
            self._won = answer
        self.first.cancel()
        return True

    def second_failed(self) -> None:
        with self._cond:
            self._second_running = False
            self._cond.notify_all()

    def first_answering(self) -> None:
        """The first copy answers (its body arrives, or it is in): the second is cancelled."""
        with self._cond:
            if self._first_answered:
                return
            self._over = self._first_answered = True
            running = self._second_running
        if running:
            self.second.cancel()

    def watching(self, watch: BodyWatch | None) -> BodyWatch:
        """``watch`` for the first copy's body, which also says it is answering."""
        def on_body(body: memoryview, got: int, headers: Message) -> None:
            self.first_answering()
            if watch is not None:
                watch(body, got, headers)
        return on_body

    def first_failed(self, timeout_s: float) -> T | None:
        """The first copy failed or was cancelled: no second starts from now; the second's answer,
        waiting at most ``timeout_s`` while it runs (None: it did not answer)."""
        with self._cond:
            self._over = True
            self._cond.wait_for(lambda: not self._second_running, max(timeout_s, 0.0))
            return self._won


class Hedger:
    """Runs each scheduled hedge when it is due, on a sender thread (see the module doc)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, Callable[[], None]]] = []  # (monotonic, order, hedge)
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    def schedule(self, delay_s: float, hedge: Callable[[], None]) -> None:
        """Run ``hedge()`` on a sender thread ``delay_s`` from now (it checks whether it is still
        wanted: :meth:`Race.start_second`)."""
        with self._cond:
            if self._closed:
                return
            heapq.heappush(self._due, (time.monotonic() + delay_s, next(self._order), hedge))
            if self._thread is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(SENDER_THREADS, thread_name_prefix="podium-hedge")
                self._thread = threading.Thread(target=self._run, name=f"podium-hedger-{self._name}", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                if self._closed:
                    return
                _, _, hedge = heapq.heappop(self._due)
                pool = self._pool
            assert pool is not None
            try:
                pool.submit(hedge)
            except RuntimeError:  # shut down meanwhile
                return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._due.clear()
            pool, self._pool = self._pool, None
            self._cond.notify()
        if pool is not None:
            pool.shutdown(wait=False)
