"""podium's client among hostile or broken neighbours (issue 20, the client's findings 5, 7 and 2).

Real endpoints and podium's client, stand-in groups:

- a plain ``http.server`` squatting on a dead teacher's port (its record still fresh and ready) gets
  no token and none of its answers is used; the next generation is followed; a probe answer that
  names no generation is not accepted (finding 5);
- a full queue (503 + ``Retry-After``) is not hammered: one 8 MB call against it for 5 s makes a few
  attempts, not dozens (finding 7), and a replica that said it is full gets no call while another
  can take it;
- a request that fails its own computation fails once with the server's cause; a request that
  kills every generation it is sent to is sent to at most ``1 + max_retries_after_crash`` of them
  (finding 2).
"""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.lifecycle import Teacher
from harness.poll import wait_for
from harness.run import TeacherDef, make_run
from harness.squatter import Squatter

import podium
from podium.client import TeacherRequestError, TeacherServerError, TeacherUnavailableError
from podium.client.transport import HTTPTransport
from podium.rendezvous import Generation, read_record

MATH = TeacherDef("d4d4d4d4d4d4", "math", ("math",))
FAST = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2, "refresh_s": 0.2,
        "return_type": "numpy"}
DATA = {"input_ids": [[5, 9, 2]], "input_lengths": [3]}


def until(predicate: Any, timeout_s: float = 60.0, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def infer_exchanges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, Any]]:
    """(url, bytes of the body, status or the exception's name) of every infer exchange the client makes."""
    seen: list[tuple[str, int, Any]] = []
    request = HTTPTransport.request

    def recording(self: HTTPTransport, method: str, path: str, body: Any = None, *args: Any, **kw: Any) -> Any:
        size = sum(memoryview(c).nbytes for c in body) if body is not None else 0
        try:
            resp = request(self, method, path, body, *args, **kw)
        except Exception as exc:
            if path.endswith("/infer"):
                seen.append((self.url, size, type(exc).__name__))
            raise
        if path.endswith("/infer"):
            seen.append((self.url, size, resp.status))
        return resp

    monkeypatch.setattr(HTTPTransport, "request", recording)
    return seen


# --------------------------------------------------------------------------- finding 5: who answers


def test_a_squatter_on_a_dead_teachers_port_gets_no_token_and_is_not_believed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    port = teacher.server.port
    # the teacher dies without a word: its record still says ready, heartbeat fresh (not stale yet)
    teacher.heartbeat.stop()
    teacher.server.stop(grace_s=1)
    squatter = Squatter(port, MATH.key)
    successor: Teacher | None = None
    client = podium.connect(layout.rendezvous_path, **FAST)
    try:
        record = read_record(layout.endpoint_path(MATH.name, MATH.key))
        assert record.url == teacher.url and not record.is_stale()
        with caplog.at_level(logging.WARNING, logger="podium.client"), \
                pytest.raises(TeacherUnavailableError) as info:
            client.get_logprobs("math", DATA, timeout_s=1.0)
        assert not any("Authorization" in headers or "authorization" in headers
                       for headers in squatter.headers_seen), squatter.headers_seen
        assert token not in json.dumps(squatter.headers_seen)
        assert not any(path.endswith("/infer") for path in squatter.paths), squatter.paths
        assert "did not prove it is generation 1000:0" in str(info.value)
        assert any(teacher.url in r.getMessage() and "no token sent" in r.getMessage() for r in caplog.records)
        # the next generation (another port, its record replacing the dead one's) is followed
        successor = Teacher(FakeGroup(), layout, MATH, token, generation=Generation(1000, 1),
                            port_range=(port + 1, port + 100)).start()
        out = client.get_logprobs("math", DATA, timeout_s=30)
        np.testing.assert_array_equal(out["logprobs"], fake_logprobs(np.array(DATA["input_ids"]),
                                                                     np.array(DATA["input_lengths"])))
        assert successor.group.calls == [5]
    finally:
        client.close()
        squatter.close()
        if successor is not None:
            successor.stop()


def test_a_probe_answer_that_names_no_generation_is_not_accepted() -> None:
    from podium.client.replicas import ReplicaSet
    from podium.client.transport import HTTPResponse

    class Answers:
        url = "http://127.0.0.1:1"

        def __init__(self, body: bytes) -> None:
            self.body = body

        def request(self, *args: Any, **kw: Any) -> HTTPResponse:
            return HTTPResponse(200, http.client.HTTPMessage(), bytearray(self.body))

    record = type("Record", (), {"generation": Generation(7, 1), "url": "http://127.0.0.1:1"})()
    probe = ReplicaSet._probe
    assert probe(record, Answers(b'{"ready": true, "generation": "7:1"}'), 1.0) is None
    for body in (b'{"ready": true}', b'{"ready": true, "generation": null}', b"ready",
                 b'{"ready": true, "generation": "7:0"}'):
        assert probe(record, Answers(body), 1.0) is not None, body


# --------------------------------------------------------------------------- finding 7: Retry-After


def test_a_full_queue_is_not_hammered(tmp_path: Path, infer_exchanges: list) -> None:
    """One 8 MB call against a full queue (Retry-After 1) for 5 s: a few attempts (Retry-After,
    doubled, jittered), not one every poll interval."""
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    group = FakeGroup(max_sequence_length=8192)
    gate = Gate()
    group.hold = gate
    teacher = Teacher(group, layout, MATH, token, server_settings={"max_queue": 1},
                      config_overrides={"retry_after_s": 1}).start()
    client = podium.connect(layout.rendezvous_path, **FAST)
    blocker = threading.Thread(target=lambda: client.get_logprobs("math", DATA, timeout_s=60))
    try:
        blocker.start()
        group.wait_for_calls(1)  # the queue's one slot is taken
        ids = np.ones((128, 8192), dtype=np.int64)  # 8 MiB of input ids
        started = time.monotonic()
        with pytest.raises(TeacherUnavailableError, match="queue is full"):
            client.get_logprobs("math", {"input_ids": ids, "input_lengths": np.full(128, 8192)}, timeout_s=5.0)
        took = time.monotonic() - started
        big = [(status, size) for _, size, status in infer_exchanges if size > 8 * 2**20]
        uploaded = sum(size for _, size in big)
        print(f"\nfull queue, one 8 MiB call for {took:.1f}s: {len(big)} attempts, {uploaded / 2**20:.0f} MiB uploaded")
        assert all(status == 503 for status, _ in big), big
        assert 2 <= len(big) <= 4, big  # at 0 s, >= 1 s, >= 3 s (then >= 7 s: past the deadline)
    finally:
        gate.release(10)
        blocker.join(60)
        client.close()
        teacher.stop()


def test_a_replica_whose_queue_is_full_is_skipped_for_another(tmp_path: Path, infer_exchanges: list) -> None:
    two = TeacherDef("e5e5e5e5e5e5", "math", ("math",), replicas=2)
    layout, token = make_run(tmp_path, [two], default_alias="math")
    full_group = FakeGroup()
    gate = Gate()
    full = Teacher(full_group, layout, two, token, generation=Generation(4000, 0), replica=0,
                   server_settings={"max_queue": 1}, config_overrides={"retry_after_s": 30}).start()
    free = Teacher(FakeGroup(), layout, two, token, generation=Generation(4001, 0), replica=1).start()
    client = podium.connect(layout.rendezvous_path, **FAST)
    blocker: threading.Thread | None = None
    try:
        client.get_logprobs("math", DATA)  # both replicas known
        until(lambda: len(client.teacher("math").replicas._replicas) == 2
              and all(r.connection is not None for r in client.teacher("math").replicas._replicas),
              what="both replicas")
        import requests

        full_group.hold = gate
        blocker = threading.Thread(target=lambda: requests.post(
            f"{full.url}/v2/models/math/infer", timeout=60, headers={"Authorization": f"Bearer {token}"},
            json={"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
                             {"name": "input_lengths", "datatype": "INT64", "shape": [1], "data": [2]}]}))
        blocker.start()
        full_group.wait_for_calls(1)
        infer_exchanges.clear()
        for _ in range(6):
            client.get_logprobs("math", DATA, timeout_s=10)
        to_full = [status for url, _, status in infer_exchanges if url == full.url]
        assert to_full in ([], [503]), infer_exchanges  # told once, then left alone for its Retry-After
        assert sum(1 for url, _, status in infer_exchanges if url == free.url and status == 200) == 6
    finally:
        gate.release(10)
        if blocker is not None:
            blocker.join(60)
        client.close()
        full.stop()
        free.stop()


# --------------------------------------------------------------------------- finding 2: killer requests


class FailingGroup(FakeGroup):
    """Fails any call whose first token is 13 (the group itself survives: the request's own failure)."""

    def get_logprobs(self, data: Any, *args: Any, **kw: Any) -> dict:
        out = super().get_logprobs(data, *args, **kw)
        if int(data.input_ids[0, 0]) == 13:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return out


def test_a_request_that_fails_its_computation_fails_once_with_the_cause(tmp_path: Path,
                                                                        infer_exchanges: list) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FailingGroup(), layout, MATH, token).start()
    try:
        with podium.connect(layout.rendezvous_path, **FAST) as client:
            with pytest.raises(TeacherServerError) as info:
                client.get_logprobs("math", {"input_ids": [[13, 4]], "input_lengths": [2]})
            assert client.get_logprobs("math", DATA)["logprobs"].shape == (1, 3)  # the teacher still serves
        assert isinstance(info.value, TeacherRequestError)  # not worth retrying, as a refusal
        text = str(info.value)
        assert "teacher 'math' (d4d4d4d4d4d4) (generation 1000:0) failed: HTTP 500" in text
        assert "CUDA out of memory (stand-in)" in text and "not sent again" in text
        assert [status for *_, status in infer_exchanges] == [500, 200]
    finally:
        teacher.stop()


class KilledGroup(FakeGroup):
    """A generation the request with first token 13 kills: the call never returns (``gate``) and the
    teacher's lifecycle replaces the generation (:func:`crash_loop`)."""

    def __init__(self, gate: Gate, killed: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.killed = killed

    def get_logprobs(self, data: Any, *args: Any, **kw: Any) -> dict:
        if int(data.input_ids[0, 0]) == 13:
            self.killed.set()
            self.gate()
        return super().get_logprobs(data, *args, **kw)


@pytest.fixture
def crash_loop(tmp_path: Path) -> Iterator[tuple[Path, list[Teacher]]]:
    """A teacher whose lifecycle restarts it (next generation, next port) each time a request kills
    it: the dying generation's connections are closed with the request in hand."""
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    gate, killed, stop = Gate(), threading.Event(), threading.Event()
    generations = [Teacher(KilledGroup(gate, killed), layout, MATH, token).start()]

    def lifecycle() -> None:
        while not stop.is_set():
            if not killed.wait(0.05):
                continue
            killed.clear()
            dead = generations[-1]
            dead.heartbeat.stop()
            dead.server.stop(grace_s=0.1)  # closes the connection of the request it was computing
            if not stop.is_set():
                generations.append(dead.successor(KilledGroup(gate, killed)))

    thread = threading.Thread(target=lifecycle, daemon=True)
    thread.start()
    yield layout.rendezvous_path, generations
    stop.set()
    gate.release(100)
    thread.join(30)
    for teacher in generations:
        teacher.stop()


def test_a_request_that_kills_every_generation_is_not_replayed_forever(
        crash_loop: tuple[Path, list[Teacher]], infer_exchanges: list) -> None:
    path, generations = crash_loop
    with podium.connect(path, **FAST) as client:
        assert client.get_logprobs("math", DATA)["logprobs"].shape == (1, 3)
        started = time.monotonic()
        with pytest.raises(TeacherServerError) as info:
            client.get_logprobs("math", {"input_ids": [[13, 4]], "input_lengths": [2]}, timeout_s=20)
        took = time.monotonic() - started
        killer = [status for _, size, status in infer_exchanges[1:]]
        text = str(info.value)
        assert "3 generations died under this request" in text and "max_retries_after_crash is 2" in text, text
        assert killer == ["TransportError"] * 3, infer_exchanges
        wait_for(lambda: len(generations) == 4, "the fourth generation")  # started after the third's death
        time.sleep(0.5)
        assert len(generations) == 4 and generations[-1].group.calls == []  # the request was not sent there
        print(f"\nkiller request: {len(killer)} attempts, 3 generations killed, failed after {took:.1f}s")
        until(lambda: generations[-1].server is not None, what="the fourth generation")
        assert client.get_logprobs("math", DATA)["logprobs"].shape == (1, 3)  # others' calls go on
