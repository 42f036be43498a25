"""Helpers for the endpoint tests: stand-in groups, a run directory, teachers behind servers.

- ``FakeGroup``: the worker-group interface in numpy (deterministic formula, instant), for the
  protocol tests (bad requests, auth, draining, ordering) where the model does not matter. It
  records what each call received; ``wait_for_calls(n)`` waits until call ``n`` has arrived, and a
  test can hold calls in the group (``hold``: a ``Gate``, a ``threading.Barrier``) to make "this
  request is in the group now" or "both teachers are in a call at once" a fact, not a guess.
- ``Gate``: holds each call until the test lets it through.
- ``make_run``: a run dir with ``rendezvous.json`` and a 0600 token.
- ``LLAMA``/``QWEN`` and ``make_group``: the real groups ``conftest.py`` shares across modules.
- ``Teacher``: one group behind an ``EndpointServer`` with its endpoint record and heartbeat;
  ``restart()`` brings it back under the next generation on another port; ``successor()`` starts
  the next generation while this one still serves (a lifecycle that replaced a broken one); with
  ``replica=i`` it is replica ``i`` of its teacher (its own record, as ``TeacherDef.replicas`` lists).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from podium.config.launcher import ServerSettings
from podium.protocol.batch import Batch
from podium.rendezvous import (
    Generation,
    Heartbeat,
    RecordWriter,
    RunLayout,
    StaleGenerationError,
    Status,
    build_rendezvous,
    create_token,
    write_rendezvous,
)
from podium.teacher.endpoint import EndpointConfig, ServerThread

PORT_RANGE = (23000, 23999)


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
                 sequence_length_multiple: int = 1) -> None:
        self.vocab_size = vocab_size
        self.max_sequence_length = max_sequence_length
        self.sequence_length_multiple = sequence_length_multiple
        self.checkpoint_path = None
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

    def get_logprobs(self, data: Batch, micro_batch_size: int | None = None, top_k: int | None = None, *,
                     temperature: float | None = None, outputs: tuple[str, ...] | None = None) -> dict[str, Any]:
        """What the real group returns for a validated batch: ``[B, width]`` (zeros past the longest row);
        logprobs and the top-k logprobs only (the other outputs need a real model)."""
        assert isinstance(data, Batch), f"the endpoint hands the group a validated Batch, got {type(data).__name__}"
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
                idx = (np.arange(top_k)[None, None, :] + ids[:, :, None]) % self.vocab_size
                out["topk_indices"] = idx.astype(np.int64)
                out["topk_logprobs"] = -np.broadcast_to(np.arange(top_k, dtype=np.float32), (b, s, top_k)).copy()
            return {name: torch.from_numpy(data.pad(value)) for name, value in out.items()}
        finally:
            self._busy.release()

    def shutdown(self) -> bool:
        return True


@dataclass
class TeacherDef:
    key: str
    name: str
    aliases: tuple[str, ...]
    model_name: str | None = None  # the checkpoint the rendezvous names (None: not named)
    replicas: int = 1  # replicas the rendezvous lists (their records: layout.endpoint_path(name, key, i))


LLAMA = TeacherDef("11a11a11a11a", "llama", ("llama", "math"))
QWEN = TeacherDef("22b22b22b22b", "qwen", ("qwen", "chat"))


def make_group(checkpoint: Path, definition: TeacherDef, **fields: Any) -> Any:
    """A real one-worker ``TeacherWorkerGroup`` (fp32) on a tiny checkpoint."""
    from podium.config.spec import TeacherSpec
    from podium.teacher.group import TeacherWorkerGroup

    spec = TeacherSpec(key=definition.key, name=definition.name, aliases=definition.aliases,
                       model_name=str(checkpoint), num_nodes=1, gpus_per_node=1, precision="fp32", **fields)
    return TeacherWorkerGroup(spec)


def make_run(tmp_path: Path, teachers: Sequence[TeacherDef], *, default_alias: str | None = None,
             strict: bool = False, run_name: str = "test-run") -> tuple[RunLayout, str]:
    """A run dir with rendezvous.json and auth_token; returns (layout, token)."""
    layout = RunLayout(tmp_path / "run")
    rdv = build_rendezvous(run_name, [t.__dict__ for t in teachers], layout=layout,
                           default_alias=default_alias, strict=strict)
    write_rendezvous(layout, rdv)
    token = create_token(layout.auth_token_path)
    return layout, token


@dataclass
class Teacher:
    """One group served in-process and published in the run dir like a teacher's head process."""

    group: Any
    layout: RunLayout
    definition: TeacherDef
    token: str
    generation: Generation = field(default_factory=lambda: Generation(1000, 0))
    port_range: tuple[int, int] = PORT_RANGE
    heartbeat_s: float = 0.5
    config_overrides: dict[str, Any] = field(default_factory=dict)  # more EndpointConfig fields
    replica: int = 0  # which replica of the teacher this is (its record: the replica's)
    server_settings: dict[str, Any] = field(default_factory=dict)  # podium.server settings besides port_range
    server: ServerThread | None = None
    writer: RecordWriter | None = None
    heartbeat: Heartbeat | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self) -> Teacher:
        d = self.definition
        self.writer = RecordWriter(self.layout.endpoint_path(d.name, d.key, self.replica), teacher_key=d.key,
                                   teacher_name=d.name, aliases=d.aliases, generation=self.generation,
                                   replica=self.replica)
        self.writer.publish(Status.STARTING)
        config = EndpointConfig(served_name=d.name, token=self.token,
                                server=ServerSettings(port_range=self.port_range, **self.server_settings),
                                teacher_key=d.key, aliases=d.aliases, generation=self.generation,
                                **self.config_overrides)
        self.server = ServerThread(self.group, config)
        url = self.server.start()
        self.server.set_ready(True)
        self.writer.publish(Status.READY, url=url, model=self.server.server.model_info())
        self.heartbeat = Heartbeat(self.writer, self.heartbeat_s).start()
        return self

    def _publish(self, status: Status) -> None:
        if self.writer is not None and not self.writer.fenced:
            try:
                self.writer.publish(status)
            except StaleGenerationError:  # a successor's record is there: it is not ours to write
                pass

    def stop(self, status: Status = Status.STOPPED) -> None:
        self._publish(Status.DRAINING)
        if self.server is not None:
            self.server.stop(grace_s=10)
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self._publish(status)

    def successor(self, group: Any = None) -> Teacher:
        """The next generation (``group``, default this one's) started on another port while this
        one still serves; its record replaces this one's."""
        g = self.generation
        old_port = self.server.port if self.server else PORT_RANGE[0]
        nxt = Teacher(group if group is not None else self.group, self.layout, self.definition, self.token,
                      Generation(g.job_id, g.restart + 1), (old_port + 1, PORT_RANGE[1]), self.heartbeat_s,
                      self.config_overrides, self.replica, self.server_settings)
        return nxt.start()

    def restart(self, *, port_range: tuple[int, int] | None = None, gap_s: float = 0.0) -> Teacher:
        """Stop, then come back under the next generation (other port unless ``port_range`` says)."""
        old_port = self.server.port if self.server else None
        self.stop()
        if gap_s:
            time.sleep(gap_s)
        g = self.generation
        nxt = Teacher(self.group, self.layout, self.definition, self.token, Generation(g.job_id, g.restart + 1),
                      port_range or ((old_port + 1, PORT_RANGE[1]) if old_port else self.port_range),
                      self.heartbeat_s, self.config_overrides, self.replica, self.server_settings)
        return nxt.start()
