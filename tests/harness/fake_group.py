"""A stand-in worker group for the endpoint and client tests, where the model does not matter.

- :class:`FakeGroup`: the worker-group interface in numpy (deterministic formula, instant), for the
  protocol tests (bad requests, auth, draining, ordering). It records what each call received;
  ``wait_for_calls(n)`` waits until call ``n`` has arrived, and a test can hold calls in the group
  (``hold``: a :class:`Gate`, a ``threading.Barrier``) to make "this request is in the group now" or
  "both teachers are in a call at once" a fact, not a guess.
- :class:`Gate`: holds each call until the test lets it through.
- :func:`fake_logprobs`: the FakeGroup's answer, for a test to compare with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from podium.protocol.batch import Batch
from podium.protocol.query import Query
from podium.teacher.seam import BatchStats, GroupFacts, Liveness


def fake_logprobs(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The FakeGroup's answer: depends on the token and its predecessor, 0 at 0 and past the length."""
    ids = np.asarray(ids, dtype=np.int64)
    prev = np.zeros_like(ids)
    prev[:, 1:] = ids[:, :-1]
    out = -(((ids * 31 + prev * 7) % 97).astype(np.float32) / 10.0 + 0.125)
    pos = np.arange(ids.shape[1])[None, :]
    out[(pos == 0) | (pos >= np.asarray(lengths)[:, None])] = 0.0
    return out.astype(np.float32)


class Gate:
    """A ``FakeGroup.hold``: each call waits until the test lets it through (``release``).

    A call not let through within ``timeout_s`` raises, so a test that forgets cannot hang.
    """

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self._permits = threading.Semaphore(0)

    def __call__(self) -> None:
        if not self._permits.acquire(timeout=self.timeout_s):
            raise TimeoutError(f"the test did not let this call through within {self.timeout_s:.0f}s")

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self._permits.release()


class FakeGroup:
    """Numpy stand-in for ``TeacherWorkerGroup`` (records the order of calls and what they got)."""

    def __init__(self, vocab_size: int = 128, max_sequence_length: int | None = 4096, delay_s: float = 0.0,
                 **facts: Any) -> None:
        """``facts``: any other :class:`~podium.teacher.seam.GroupFacts` field (the DP size the
        endpoint publishes, the checkpoint whose tokenizer the lifecycle fingerprints, ...)."""
        self.facts = GroupFacts(vocab_size=vocab_size, max_sequence_length=max_sequence_length, **facts)
        self.broken: str | None = None
        self.last_batch: BatchStats | None = None
        self.liveness = Liveness()  # no watch
        self.delay_s = delay_s
        self.calls: list[Any] = []  # ids[0, 0] of each call, in the order the calls arrived
        self.received: list[dict[str, np.ndarray]] = []  # copies of each call's input_ids and input_lengths
        self.hold: Callable[[], None] | None = None  # called in each call once it is recorded
        self._busy = threading.Lock()
        self._arrived = threading.Condition()

    def answer(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The logprobs of the cut ids (the group's answer before it is padded to the width)."""
        return fake_logprobs(ids, lengths)

    def wait_for_calls(self, n: int, timeout_s: float = 120.0) -> None:
        """Wait until ``n`` calls have arrived in the group (a call held by ``hold`` counts)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.calls) >= n, timeout_s):
                raise AssertionError(f"{len(self.calls)} calls reached the group within {timeout_s:.0f}s, "
                                     f"not {n}: {self.calls}")

    @property
    def first_tokens(self) -> list[int]:
        """Every row's first token, in the order the group received the rows (a call may hold the
        rows of several requests)."""
        return [int(t) for got in self.received for t in got["input_ids"][:, 0]]

    def compute(self, data: Batch, query: Query) -> dict[str, Any]:
        """What the real group returns for a validated batch: ``[B, width]`` (zeros past the longest row);
        logprobs and the top-k logprobs only (the other outputs need a real model)."""
        assert isinstance(data, Batch), f"the endpoint hands the group a validated Batch, got {type(data).__name__}"
        assert isinstance(query, Query), f"the endpoint hands the group a checked Query, got {type(query).__name__}"
        top_k = query.top_k
        assert self._busy.acquire(blocking=False), "two calls at once reached the group"
        try:
            ids, lengths = data.input_ids, data.input_lengths
            with self._arrived:
                self.calls.append(int(ids[0, 0]))
                self.received.append({"input_ids": ids.copy(), "input_lengths": lengths.copy()})
                self._arrived.notify_all()
            if self.hold is not None:
                self.hold()
            if self.delay_s:
                time.sleep(self.delay_s)
            out = {"logprobs": self.answer(ids, lengths)}
            if top_k:
                b, s = ids.shape
                idx = (np.arange(top_k)[None, None, :] + ids[:, :, None]) % self.facts.vocab_size
                out["topk_indices"] = idx.astype(np.int64)
                out["topk_logprobs"] = -np.broadcast_to(np.arange(top_k, dtype=np.float32), (b, s, top_k)).copy()
            return {name: torch.from_numpy(data.pad(value)) for name, value in out.items()}
        finally:
            self._busy.release()

    def shutdown(self) -> bool:
        return True
