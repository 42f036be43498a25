"""What a failure is answered with: a group's error is a JSON 500 (a ``ValueError``, the group
rejecting the request, is a 400) and the server keeps serving; a request whose computation fails (an
out-of-memory) fails alone, the requests batched with it answered; a group that is broken, or
fails once the teacher is not ready, is a 503 (``group-broken``, ``Retry-After``) for the client
to retry elsewhere, never a 400; a bug in forming a batch fails that request and the batcher goes
on; a full queue is a 503 ``queue-full`` with ``Retry-After``, its queued requests answered.

The real endpoint, with numpy stand-in groups that fail on the tokens a test sends.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
import requests
import torch
from harness.endpoint import AUTH, in_thread, post, post_in_thread, start_server, tagged_body, wait_until
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.infer_requests import infer_body

from podium.protocol.names import (
    ERROR_GROUP_BROKEN,
    ERROR_KIND_HEADER,
    ERROR_QUEUE_FULL,
    ERROR_REQUEST_FAILED,
    ERROR_UNAVAILABLE,
)
from podium.protocol.query import Query


def test_group_error_is_a_json_500_and_the_server_keeps_serving() -> None:
    class Flaky(FakeGroup):
        def compute(self, data: Any, query: Query) -> dict:
            if int(data.input_ids[0, 0]) == 13:
                raise RuntimeError("worker 3 died")
            if int(data.input_ids[0, 0]) == 14:
                raise ValueError("sequence too long for this layout")
            return super().compute(data, query)

    server = start_server(Flaky())
    headers = {"Authorization": "Bearer t0ken"}
    try:
        url = f"{server.url}/v2/models/m/infer"
        resp = requests.post(url, data=infer_body([[13, 1]], [2]), headers=headers, timeout=10)
        assert resp.status_code == 500 and "worker 3 died" in resp.json()["error"]
        resp = requests.post(url, data=infer_body([[14, 1]], [2]), headers=headers, timeout=10)
        assert resp.status_code == 400 and "rejected by the teacher: sequence too long" in resp.json()["error"]
        assert requests.post(url, data=infer_body([[12, 1]], [2]), headers=headers, timeout=10).status_code == 200
    finally:
        server.stop()


class Poisoned(FakeGroup):
    """A group whose computation fails (out of memory) for any call holding a row that starts
    with token 13, and that still works afterwards; ``broken_by`` marks it broken by a
    ValueError instead (a worker that died while refusing)."""

    def __init__(self, *args: Any, broken_by: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broken_by = broken_by

    def compute(self, data: Any, query: Query) -> dict:
        out = super().compute(data, query)
        if self.broken_by is not None and self.broken_by in data.input_ids[:, 0]:
            self.broken = "worker 1 died"
            raise ValueError("worker 1 died while refusing")
        if 13 in data.input_ids[:, 0]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 58.00 GiB")
        return out


def test_a_request_whose_computation_fails_fails_alone_and_the_group_keeps_serving() -> None:
    group = Poisoned(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, {"max_queue_delay_ms": 0.0})
    outcome: dict[int, Any] = {}
    try:
        first = in_thread(lambda: post(server, infer_body([[1, 2]], [2])), outcome, 1)
        group.wait_for_calls(1)  # held in the group: the next three queue and share one call
        threads = [in_thread(lambda t=t: post(server, infer_body([[t, 5, 6]], [3]), {"X-Podium-Caller": f"c{t}"}),
                              outcome, t) for t in (12, 13, 14)]
        wait_until(lambda: server.server.queue_depth == 4, "three requests queued behind the first")
        gate.release(10)
        for t in (first, *threads):
            t.join(60)
        assert [outcome[t].status_code for t in (1, 12, 14)] == [200, 200, 200]
        for t in (12, 14):
            got = np.asarray(outcome[t].json()["outputs"][0]["data"]).reshape(1, 3)
            np.testing.assert_allclose(got, fake_logprobs(np.array([[t, 5, 6]]), [3]))
        poisoned = outcome[13]
        assert poisoned.status_code == 500 and "out of memory" in poisoned.json()["error"]
        assert poisoned.headers[ERROR_KIND_HEADER] == ERROR_REQUEST_FAILED
        assert any(len(got["input_ids"]) == 3 for got in group.received)  # they were batched, then split
        assert post(server, infer_body([[7, 8]], [2])).status_code == 200  # the group stays usable
        assert requests.get(f"{server.url}/v2/health/ready", headers=AUTH, timeout=10).status_code == 200
    finally:
        gate.release(10)
        server.stop()


def test_a_broken_group_is_503_group_broken_never_400() -> None:
    server = start_server(Poisoned(vocab_size=128, broken_by=21))
    try:
        resp = post(server, infer_body([[21, 2]], [2]))
        assert resp.status_code == 503 and resp.headers[ERROR_KIND_HEADER] == ERROR_GROUP_BROKEN, resp.text
        assert "Retry-After" in resp.headers
        again = post(server, infer_body([[1, 2]], [2]))  # not computed: unavailable, no crash to count
        assert again.status_code == 503 and again.headers[ERROR_KIND_HEADER] == ERROR_UNAVAILABLE
    finally:
        server.stop()


class BreakingGroup(FakeGroup):
    """A group whose call for tag 13 fails after the hold (a worker dies under it); ``marks_broken``:
    it then says it is broken, as ``TeacherWorkerGroup`` does."""

    def __init__(self, marks_broken: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.marks_broken = marks_broken

    def compute(self, data: Any, query: Query) -> dict:
        out = super().compute(data, query)
        if int(data.input_ids[0, 0]) == 13:
            if self.marks_broken:
                self.broken = "ActorDiedError: worker 3 died"
            raise RuntimeError("worker 3 died")
        return out


def test_a_failure_after_the_teacher_was_marked_not_ready_is_a_503_to_retry_elsewhere() -> None:
    group = BreakingGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, retry_after_s=2)
    outcome: dict[int, Any] = {}
    try:
        call = post_in_thread(server, tagged_body(13), outcome, 13)
        group.wait_for_calls(1)
        server.set_ready(False, "node n2 (rank 1) lost")  # the lifecycle finds the group broken
        gate.release()
        call.join(120)
        status, text = outcome[13]
        assert status == 503, text
        error = json.loads(text)["error"]
        assert "teacher 'm' is unavailable (node n2 (rank 1) lost): RuntimeError: worker 3 died" in error
        assert requests.get(f"{server.url}/v2/health/live", timeout=60).status_code == 200
    finally:
        gate.release(2)
        server.stop()


def test_a_group_that_says_it_is_broken_makes_the_failure_a_503_and_the_teacher_not_ready() -> None:
    server = start_server(BreakingGroup(marks_broken=True, vocab_size=128))
    try:
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=tagged_body(13), headers=AUTH, timeout=60)
        assert resp.status_code == 503 and resp.headers["Retry-After"]
        assert "unavailable (group broken: ActorDiedError: worker 3 died): RuntimeError" in resp.json()["error"]
        ready = requests.get(f"{server.url}/v2/health/ready", headers=AUTH, timeout=60)
        assert ready.status_code == 503 and "not ready (group broken: ActorDiedError" in ready.json()["error"]
    finally:
        server.stop()


def test_a_bug_in_forming_a_batch_fails_that_request_and_the_batcher_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from podium.teacher.endpoint import batching

    real = batching.join_rows
    calls = {"n": 0}

    def once_broken(segments: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise IndexError("a bug in join_rows")
        return real(segments)

    monkeypatch.setattr(batching, "join_rows", once_broken)
    server = start_server(FakeGroup(vocab_size=128))
    try:
        first = requests.post(f"{server.url}/v2/models/m/infer", data=tagged_body(1), headers=AUTH, timeout=60)
        assert first.status_code == 500 and "IndexError: a bug in join_rows" in first.json()["error"], first.text
        second = requests.post(f"{server.url}/v2/models/m/infer", data=tagged_body(2), headers=AUTH, timeout=60)
        assert second.status_code == 200, second.text
    finally:
        server.stop()


def test_a_full_queue_says_queue_full() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, {"max_queue": 1})
    outcome: dict[int, Any] = {}
    try:
        held = in_thread(lambda: post(server, infer_body([[1, 2]], [2])).status_code, outcome, 1)
        group.wait_for_calls(1)
        full = post(server, infer_body([[2, 2]], [2]))
        assert full.status_code == 503 and full.headers[ERROR_KIND_HEADER] == ERROR_QUEUE_FULL
        assert full.headers["Retry-After"]
        gate.release(2)
        held.join(60)
        assert outcome == {1: 200}
    finally:
        gate.release(2)
        server.stop()


def test_a_full_queue_answers_503_with_retry_after_and_the_queued_requests_are_answered() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, settings={"max_queue": 3}, retry_after_s=4)
    endpoint = server.server
    outcome: dict[int, Any] = {}
    threads: list[threading.Thread] = []
    try:
        for i in range(3):
            threads.append(post_in_thread(server, tagged_body(i), outcome, i))
            if i == 0:
                group.wait_for_calls(1)  # request 0 is in the group, held there
            wait_until(lambda i=i: endpoint.queue_depth == i + 1 or outcome, f"request {i} in the queue")
        full = requests.post(f"{server.url}/v2/models/m/infer", data=tagged_body(99), headers=AUTH, timeout=60)
        assert full.status_code == 503 and full.headers["Retry-After"] == "4"
        assert "queue is full: 3 requests queued or running (max_queue 3)" in full.json()["error"]
        meta = requests.get(f"{server.url}/v2/models/m", headers=AUTH, timeout=60).json()["podium"]
        assert meta["queue_depth"] == 3 and meta["max_queue"] == 3
        assert requests.get(f"{server.url}/v2/health/ready", headers=AUTH, timeout=60).status_code == 200
    finally:
        gate.release(4)
        for thread in threads:
            thread.join(120)
        server.stop()
    assert {i: status for i, (status, _) in outcome.items()} == {0: 200, 1: 200, 2: 200}, outcome
    assert group.first_tokens[0::2] == [0, 1, 2]  # the refused request (99) never reached the group
