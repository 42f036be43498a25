"""The endpoint's protocol behaviour, with a numpy stand-in group (the model does not matter here).

Bad requests, auth, draining, request ids, ordering, ports, health while busy. The bad-request table
(``harness.infer_requests``) runs against the real Megatron group in ``test_real_teacher.py`` too.
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import torch
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.infer_requests import (
    GOOD_IDS,
    GOOD_LENS,
    MAX_BODY,
    binary_body,
    check_bad_requests_then_good,
    infer_body,
)
from harness.lifecycle import Teacher
from harness.poll import wait_for
from harness.run import TeacherDef, make_run

from podium.config.launcher import ServerSettings
from podium.net import listen_on_free_port as bind_socket
from podium.protocol.query import Query
from podium.teacher.endpoint import EndpointConfig, ServerThread


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Teacher]:
    tmp = tmp_path_factory.mktemp("server")
    definition = TeacherDef("feedc0ffee0123", "math", ("math", "code"))
    layout, token = make_run(tmp, [definition], default_alias="math")
    teacher = Teacher(FakeGroup(vocab_size=128, max_sequence_length=64), layout, definition, token,
                      config_overrides={"max_body_bytes": MAX_BODY}).start()
    yield teacher
    teacher.stop()


def test_every_bad_request_gets_its_4xx_and_the_server_keeps_serving(served: Teacher) -> None:
    check_bad_requests_then_good(served.url, "math", served.token, 128, 64, MAX_BODY, fake_logprobs)


def test_auth(served: Teacher) -> None:
    url, token = served.url, served.token
    assert requests.get(f"{url}/v2/health/live", timeout=10).status_code == 200  # no token needed
    for path in ("/v2/health/ready", "/v2", "/v2/models/math", "/v2/models/math/ready"):
        missing = requests.get(url + path, timeout=10)
        assert missing.status_code == 401 and "missing Authorization" in missing.json()["error"], path
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        wrong = requests.get(url + path, headers={"Authorization": f"Bearer {token}x"}, timeout=10)
        assert wrong.status_code == 401 and "invalid bearer token" in wrong.json()["error"], path
        basic = requests.get(url + path, headers={"Authorization": f"Basic {token}"}, timeout=10)
        assert basic.status_code == 401
        assert requests.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code == 200
    resp = requests.post(f"{url}/v2/models/math/infer", data=infer_body(GOOD_IDS, GOOD_LENS), timeout=10)
    assert resp.status_code == 401
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(url.split("//", 1)[1])
    with pytest.raises(InferenceServerException, match="invalid bearer token"):
        client.get_model_metadata("math", headers={"Authorization": "Bearer nope"})


def test_metadata_names_the_teacher(served: Teacher) -> None:
    headers = {"Authorization": f"Bearer {served.token}"}
    for name in ("math", "code", "feedc0ffee0123"):
        meta = requests.get(f"{served.url}/v2/models/{name}", headers=headers, timeout=10).json()
        assert meta["name"] == "math"
        p = meta["podium"]
        assert p["teacher_key"] == "feedc0ffee0123" and p["aliases"] == ["math", "code"]
        assert p["generation"] == {"job_id": 1000, "restart": 0}
        assert p["vocab_size"] == 128 and p["max_sequence_length"] == 64 and p["sequence_length_multiple"] == 1
        assert "tokenizer_fingerprint" in p
        assert {i["name"] for i in meta["inputs"]} == {"input_ids", "input_lengths", "candidate_ids"}
        assert {o["name"] for o in meta["outputs"]} == {"logprobs", "topk_logprobs", "topk_indices", "topk_logits",
                                                      "topk_logit_indices", "candidate_logprobs"}
        assert (p["temperature"], p["data_parallel_size"]) == (1.0, 1)


def test_request_id_is_echoed(served: Teacher) -> None:
    headers = {"Authorization": f"Bearer {served.token}"}
    url = f"{served.url}/v2/models/math/infer"
    resp = requests.post(url, data=infer_body(GOOD_IDS, GOOD_LENS, id="req-42"), headers=headers, timeout=10)
    assert resp.json()["id"] == "req-42" and resp.headers["X-Request-ID"] == "req-42"
    resp = requests.post(url, data=infer_body(GOOD_IDS, GOOD_LENS), headers={**headers, "X-Request-ID": "hdr-7"},
                         timeout=10)
    assert resp.headers["X-Request-ID"] == "hdr-7"
    bad = requests.post(url, data=b"{", headers={**headers, "X-Request-ID": "bad-1"}, timeout=10)
    assert bad.status_code == 400 and bad.headers["X-Request-ID"] == "bad-1"
    assert resp.headers["X-Podium-Generation"] == "1000:0"
    generated = requests.post(url, data=infer_body(GOOD_IDS, GOOD_LENS), headers=headers, timeout=10)
    assert len(generated.headers["X-Request-ID"]) >= 16


def test_padding_values_do_not_matter() -> None:
    """Ids past a row's length (any value, even outside the vocabulary) are accepted and reach the
    group as 0; the ids before them and the lengths reach it unchanged; the answer is the group's."""
    group = FakeGroup(vocab_size=128, max_sequence_length=64)
    server = _server(group)
    try:
        ids = np.array([[5, 6, 7, 999], [9, 10, -100, -100], [1, 2, 3, 4]])
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(ids, [3, 2, 4]),
                             headers={"Authorization": "Bearer t0ken"}, timeout=60)
        assert resp.status_code == 200, resp.text
        (got,) = group.received
        np.testing.assert_array_equal(got["input_ids"], [[5, 6, 7, 0], [9, 10, 0, 0], [1, 2, 3, 4]])
        np.testing.assert_array_equal(got["input_lengths"], [3, 2, 4])
        out = np.asarray(resp.json()["outputs"][0]["data"], dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(out, fake_logprobs(got["input_ids"], got["input_lengths"]))
    finally:
        server.stop()


class UnmaskedGroup(FakeGroup):
    """Answers every position of the cut ids, padding included (no zeros past a row's length), so
    the zeros past the longest row in the response come from padding the answer to the width."""

    def answer(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        return fake_logprobs(ids, np.full(ids.shape[0], ids.shape[1]))


class NarrowGroup(FakeGroup):
    """A broken group: answers one column fewer than the batch it was given."""

    def compute(self, data: Any, query: Query) -> dict:
        return {"logprobs": torch.from_numpy(fake_logprobs(data.input_ids, data.input_lengths)[:, :-1].copy())}


def test_a_group_answer_of_the_wrong_shape_is_a_500_never_a_wrong_answer() -> None:
    server = _server(NarrowGroup(vocab_size=128))
    try:
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body([[1, 2, 3, 0]], [3]),
                             headers={"Authorization": "Bearer t0ken"}, timeout=60)
        assert resp.status_code == 500 and "of shape [1, 2] for a batch of 1 rows and width 3" in resp.json()["error"]
    finally:
        server.stop()


def test_columns_past_the_teacher_limit_are_cut_and_come_back_as_zeros() -> None:
    """A batch wider than max_sequence_length whose rows fit: the group gets only the columns up to
    the longest row, and the answer is padded back to the request's width with zeros."""
    group = UnmaskedGroup(vocab_size=128, max_sequence_length=16)
    server = _server(group)
    try:
        rng = np.random.default_rng(3)
        ids = rng.integers(1, 128, (2, 40))  # padding past the lengths is not zero either
        lengths = np.array([10, 4])
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(ids, lengths, parameters={"top_k": 2}),
                             headers={"Authorization": "Bearer t0ken"}, timeout=60)
        assert resp.status_code == 200, resp.text
        (got,) = group.received
        assert got["input_ids"].shape == (2, 10)  # cut at the longest row, not at the limit
        np.testing.assert_array_equal(got["input_ids"][0], ids[0, :10])
        np.testing.assert_array_equal(got["input_ids"][1], np.r_[ids[1, :4], np.zeros(6, int)])
        outputs = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in resp.json()["outputs"]}
        assert outputs["logprobs"].shape == (2, 40) and outputs["topk_indices"].shape == (2, 40, 2)
        answered = fake_logprobs(got["input_ids"], [10, 10])  # what the group returned, padding included
        assert np.all(answered[:, 1:] != 0)  # so any zero in the answer past column 10 is padding
        np.testing.assert_array_equal(outputs["logprobs"][:, :10], answered)
        for name in ("logprobs", "topk_logprobs", "topk_indices"):
            assert not outputs[name][:, 10:].any(), name
    finally:
        server.stop()


def _server(group: FakeGroup, token: str = "t0ken", settings: dict[str, Any] | None = None, **kw: Any) -> ServerThread:
    """A started, ready server (``settings``: ``podium.server`` settings; ``kw``: more EndpointConfig fields)."""
    server_settings = ServerSettings(**{"port_range": (23000, 23999), **(settings or {})})
    server = ServerThread(group, EndpointConfig(served_name="m", token=token, server=server_settings, **kw))
    server.start()
    server.set_ready(True)
    return server


_wait_until = functools.partial(wait_for, timeout_s=120.0, interval_s=0.005)


@pytest.mark.parametrize("batch_requests", [False, True], ids=["fifo", "batched"])
def test_requests_queue_in_order_behind_a_busy_group_and_none_is_dropped(batch_requests: bool) -> None:
    """Requests queue in arrival order behind a call the group holds; health answers meanwhile.
    Then, one request per call in arrival order (``batch_requests: false``), or the queued requests
    batched into fewer calls, their rows in arrival order (one caller)."""
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group, settings={"batch_requests": batch_requests})
    endpoint = server.server
    n = 12
    results: dict[int, np.ndarray] = {}
    errors: list[str] = []

    def call(i: int) -> None:
        try:
            ids = np.full((2, 8), 0) + np.arange(8)
            ids[0, 0] = i  # tags the request; the group records ids[0, 0] per call
            resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(ids, [8, 5]),
                                 headers={"Authorization": "Bearer t0ken"}, timeout=120)
            if resp.status_code != 200:
                errors.append(f"request {i}: HTTP {resp.status_code} {resp.text}")
                return
            out = np.asarray(resp.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 8)
            np.testing.assert_array_equal(out, fake_logprobs(ids, [8, 5]))
            results[i] = out
        except Exception as exc:  # reported below
            errors.append(f"request {i}: {exc!r}")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    try:
        for i, thread in enumerate(threads):
            thread.start()
            if i == 0:
                group.wait_for_calls(1)  # request 0 is in the group, held there
            # request i is queued (0 runs, 1..i wait) before request i + 1 is sent: arrival order 0, 1, 2, ...
            _wait_until(lambda i=i: endpoint.queue_depth == i + 1 or errors, f"request {i} in the queue")
            assert not errors, errors
        # health probes answer while the group is provably busy: call 0 is held, the rest queued
        assert requests.get(f"{server.url}/v2/health/live", timeout=60).status_code == 200
        assert requests.get(f"{server.url}/v2/health/ready", headers={"Authorization": "Bearer t0ken"},
                            timeout=60).status_code == 200
        assert group.calls == [0] and endpoint.queue_depth == n
    finally:
        gate.release(n)
        for thread in threads:
            thread.join(120)
        server.stop()
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert sorted(results) == list(range(n))
    # the group saw every request's rows once, in arrival order (FakeGroup asserts no overlap)
    assert group.first_tokens[0::2] == list(range(n))
    if batch_requests:
        assert group.calls[0] == 0 and len(group.calls) < n  # what queued behind call 0 went together
    else:
        assert group.calls == list(range(n))  # FIFO, one at a time


def test_draining_answers_503_with_retry_after_and_finishes_queued_work() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group, retry_after_s=3)
    headers = {"Authorization": "Bearer t0ken"}
    outcome: dict[str, Any] = {}

    def queued_call() -> None:
        try:
            outcome["status"] = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(GOOD_IDS, GOOD_LENS),
                                              headers=headers, timeout=120).status_code
        except Exception as exc:  # reported below
            outcome["error"] = repr(exc)

    queued = threading.Thread(target=queued_call)
    try:
        queued.start()
        group.wait_for_calls(1)  # the request is in the group now, held there
        server.drain()
        ready = requests.get(f"{server.url}/v2/health/ready", headers=headers, timeout=60)
        assert ready.status_code == 503 and "draining" in ready.json()["error"]
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(GOOD_IDS, GOOD_LENS), headers=headers,
                             timeout=60)
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "3" and "draining" in resp.json()["error"]
        assert requests.get(f"{server.url}/v2/health/live", timeout=60).status_code == 200
        assert server.server.queue_depth == 1 and queued.is_alive()  # still held: not answered, not dropped
    finally:
        gate.release()
        queued.join(120)
        server.stop()
    assert outcome == {"status": 200}  # accepted before draining: answered, not dropped
    assert group.calls == [int(GOOD_IDS[0, 0])]  # the request refused while draining never reached the group


def test_port_collision_takes_the_next_port() -> None:
    busy = bind_socket("127.0.0.1", (23000, 23999))
    port = busy.getsockname()[1]
    try:
        server = _server(FakeGroup(), settings={"port_range": (port, port + 20)})
        try:
            assert server.port > port
            assert requests.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
        finally:
            server.stop()
        with pytest.raises(OSError, match=f"no free port on 127.0.0.1 in {port}-{port}"):
            _server(FakeGroup(), settings={"port_range": (port, port)})
    finally:
        busy.close()


def test_group_error_is_a_json_500_and_the_server_keeps_serving() -> None:
    class Flaky(FakeGroup):
        def compute(self, data: Any, query: Query) -> dict:
            if int(data.input_ids[0, 0]) == 13:
                raise RuntimeError("worker 3 died")
            if int(data.input_ids[0, 0]) == 14:
                raise ValueError("sequence too long for this layout")
            return super().compute(data, query)

    server = _server(Flaky())
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


def test_config_refuses_no_token() -> None:
    with pytest.raises(ValueError, match="token is required"):
        EndpointConfig(served_name="m", token="")


def test_readiness_is_the_lifecycles_to_set_and_says_why_not() -> None:
    """A server answers ready only once its owner says so, and 503 names the reason otherwise."""
    server = ServerThread(FakeGroup(), EndpointConfig(served_name="m", token="t0ken",
                                                      server=ServerSettings(port_range=(23000, 23999))))
    server.start()
    headers = {"Authorization": "Bearer t0ken"}
    try:
        before = requests.get(f"{server.url}/v2/health/ready", headers=headers, timeout=5)
        assert before.status_code == 503 and "not ready (starting)" in before.json()["error"]
        refused = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(GOOD_IDS, GOOD_LENS),
                                headers=headers, timeout=10)
        assert refused.status_code == 503 and refused.headers["Retry-After"]
        server.set_ready(True)
        assert requests.get(f"{server.url}/v2/health/ready", headers=headers, timeout=5).status_code == 200
        server.set_ready(False, "node n2 (rank 1) lost")
        lost = requests.get(f"{server.url}/v2/health/ready", headers=headers, timeout=5)
        assert lost.status_code == 503 and "node n2 (rank 1) lost" in lost.json()["error"]
        assert requests.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
    finally:
        server.stop(grace_s=0)


# --------------------------------------------------------------------------- body, queue, disconnects, failures

AUTH = {"Authorization": "Bearer t0ken"}


def _tagged(tag: int) -> bytes:
    """A good JSON infer body whose ``input_ids[0, 0]`` is ``tag`` (what ``FakeGroup.calls`` records)."""
    ids = GOOD_IDS.copy()
    ids[0, 0] = tag
    return infer_body(ids, GOOD_LENS)


def _raw_infer(server: ServerThread, body: bytes) -> socket.socket:
    """An infer request sent whole on a raw connection the test closes when it wants (no answer read)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    head = (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t0ken\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def _post_in_thread(server: ServerThread, body: bytes, outcome: dict[int, Any], key: int) -> threading.Thread:
    def call() -> None:
        try:
            resp = requests.post(f"{server.url}/v2/models/m/infer", data=body, headers=AUTH, timeout=120)
            outcome[key] = (resp.status_code, resp.text)
        except Exception as exc:  # reported by the test
            outcome[key] = (None, repr(exc))

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_a_body_that_disagrees_with_its_declared_tensors_is_refused_before_room_for_it_is_allocated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Content-Length announces the whole limit, the header declares 80 bytes of tensors, and only
    the header and those 80 bytes are sent: the answer comes at once (the server did not wait for the
    announced body) and the only buffer allocated is the header's."""
    from podium.teacher.endpoint import body as endpoint_body

    allocated: list[int] = []
    real = endpoint_body._buffer
    monkeypatch.setattr(endpoint_body, "_buffer", lambda size: allocated.append(size) or real(size))
    server = _server(FakeGroup(), max_body_bytes=MAX_BODY)
    try:
        body, header_len = binary_body(GOOD_IDS, GOOD_LENS)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.putrequest("POST", "/v2/models/m/infer")
        for name, value in {**AUTH, "Content-Length": str(MAX_BODY),
                            "Inference-Header-Content-Length": str(header_len)}.items():
            conn.putheader(name, value)
        conn.endheaders()
        conn.send(body)  # the rest of the announced body never comes
        resp = conn.getresponse()
        error = json.loads(resp.read())["error"]
        conn.close()
        assert resp.status == 400, error
        assert (f"binary data sizes add up to 80 bytes but {MAX_BODY - header_len} bytes follow the JSON header "
                f"(Content-Length {MAX_BODY} = {header_len} bytes of JSON header") in error
        assert allocated == [header_len]  # never room for the announced body
        # a good binary request: header, then one buffer of exactly its tensors, which the group gets
        allocated.clear()
        ok = requests.post(f"{server.url}/v2/models/m/infer", data=body, timeout=60,
                           headers={**AUTH, "Inference-Header-Content-Length": str(header_len)})
        assert ok.status_code == 200 and allocated == [header_len, 80]
    finally:
        server.stop()


def test_a_full_queue_answers_503_with_retry_after_and_the_queued_requests_are_answered() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group, settings={"max_queue": 3}, retry_after_s=4)
    endpoint = server.server
    outcome: dict[int, Any] = {}
    threads: list[threading.Thread] = []
    try:
        for i in range(3):
            threads.append(_post_in_thread(server, _tagged(i), outcome, i))
            if i == 0:
                group.wait_for_calls(1)  # request 0 is in the group, held there
            _wait_until(lambda i=i: endpoint.queue_depth == i + 1 or outcome, f"request {i} in the queue")
        full = requests.post(f"{server.url}/v2/models/m/infer", data=_tagged(99), headers=AUTH, timeout=60)
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


def test_a_queued_request_whose_client_went_away_never_reaches_the_group() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group)
    endpoint = server.server
    outcome: dict[int, Any] = {}
    a = _post_in_thread(server, _tagged(1), outcome, 1)
    try:
        group.wait_for_calls(1)  # A is in the group, held there
        b = _raw_infer(server, _tagged(2))
        _wait_until(lambda: endpoint.queue_depth == 2, "B queued behind A")
        b.close()  # B's client goes away before B runs
        _wait_until(lambda: endpoint.abandoned == 1 and endpoint.queue_depth == 1, "B out of the queue")
        meta = requests.get(f"{server.url}/v2/models/m", headers=AUTH, timeout=60).json()["podium"]
        assert meta["abandoned"] == 1 and meta["queue_depth"] == 1
    finally:
        gate.release(2)  # enough for B too: a B that wrongly reached the group would not hang the test
        a.join(120)
    try:
        assert outcome[1][0] == 200, outcome
        _wait_until(lambda: endpoint.queue_depth == 0, "the queue empty")
        assert group.calls == [1] and endpoint.abandoned == 1 and endpoint.served == 1
    finally:
        server.stop()


def test_a_computing_request_whose_client_went_away_finishes_and_its_answer_is_not_sent() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group)
    endpoint = server.server
    try:
        a = _raw_infer(server, _tagged(1))
        group.wait_for_calls(1)  # A is in the group, held there
        a.close()
        _wait_until(lambda: endpoint.abandoned == 1, "A counted abandoned")
        assert endpoint.queue_depth == 1  # the group still computes it: it cannot be taken back
        gate.release()
        _wait_until(lambda: endpoint.queue_depth == 0, "A's group call finished")
        assert endpoint.served == 0  # computed, never answered
        gate.release()
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=_tagged(2), headers=AUTH, timeout=60)
        assert resp.status_code == 200 and group.calls == [1, 2] and endpoint.served == 1
    finally:
        gate.release(2)
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
    server = _server(group, retry_after_s=2)
    outcome: dict[int, Any] = {}
    try:
        call = _post_in_thread(server, _tagged(13), outcome, 13)
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
    server = _server(BreakingGroup(marks_broken=True, vocab_size=128))
    try:
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=_tagged(13), headers=AUTH, timeout=60)
        assert resp.status_code == 503 and resp.headers["Retry-After"]
        assert "unavailable (group broken: ActorDiedError: worker 3 died): RuntimeError" in resp.json()["error"]
        ready = requests.get(f"{server.url}/v2/health/ready", headers=AUTH, timeout=60)
        assert ready.status_code == 503 and "not ready (group broken: ActorDiedError" in ready.json()["error"]
    finally:
        server.stop()


def _rows_body(tag: int, rows: int, length: int = 8) -> bytes:
    """``rows`` rows of ``length`` tokens, every row's first token ``tag`` (what ``first_tokens`` shows)."""
    ids = np.tile(np.arange(length) + 1, (rows, 1))
    ids[:, 0] = tag
    return infer_body(ids, np.full(rows, length))


def test_a_huge_request_is_split_and_other_callers_take_turns_with_it() -> None:
    """Caller A's 40 rows need 10 calls of 32 tokens; B's one row, sent while A's first call is in
    the group, goes in the very next call (B's turn comes before A's), not after A's last row.
    Calls hold at most 32 tokens (rows counted at their bucket length: 8 here)."""
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group, settings={"max_queue_delay_ms": 0}, batch_tokens=32)
    outcome: dict[int, Any] = {}
    threads = []
    try:
        threads.append(_post_in_thread(server, _rows_body(1, 40), outcome, 1))  # caller: this host
        group.wait_for_calls(1)
        body = _rows_body(2, 1)
        def call_b() -> None:
            resp = requests.post(f"{server.url}/v2/models/m/infer", data=body, timeout=120,
                                 headers={**AUTH, "X-Podium-Caller": "trainer-b"})
            outcome[2] = (resp.status_code, resp.text)
        threads.append(threading.Thread(target=call_b))
        threads[-1].start()
        _wait_until(lambda: server.server.queue_depth == 2, "B queued behind A's first call")
        gate.release(40)
        for t in threads:
            t.join(120)
    finally:
        gate.release(40)
        server.stop()
    assert outcome[1][0] == 200 and outcome[2][0] == 200, outcome
    calls = [got["input_ids"][:, 0].tolist() for got in group.received]
    assert all(len(c) * 8 <= 32 for c in calls), calls  # the call budget
    assert calls[0] == [1] * 4 and calls[1][0] == 2, calls  # B's turn right after A's first call
    assert sum(c.count(1) for c in calls) == 40 and len(calls) == 11  # A split over 10 calls, no row twice


def test_a_request_whose_client_went_away_mid_way_sends_no_more_rows() -> None:
    """A's 40 rows need 10 calls; its client goes away while the first is in the group: the rest
    never reach it, and the next request is served."""
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group, settings={"max_queue_delay_ms": 0}, batch_tokens=32)
    endpoint = server.server
    try:
        a = _raw_infer(server, _rows_body(1, 40))
        group.wait_for_calls(1)
        a.close()
        _wait_until(lambda: endpoint.abandoned == 1, "A counted abandoned")
        gate.release()
        _wait_until(lambda: endpoint.queue_depth == 0, "A's call finished and its rows left the queue")
        gate.release()
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=_tagged(2), headers=AUTH, timeout=60)
        assert resp.status_code == 200
        assert group.first_tokens.count(1) == 4 and group.first_tokens[-2:] == [2, 9]  # one call of A, then B
    finally:
        gate.release(40)
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
    server = _server(FakeGroup(vocab_size=128))
    try:
        first = requests.post(f"{server.url}/v2/models/m/infer", data=_tagged(1), headers=AUTH, timeout=60)
        assert first.status_code == 500 and "IndexError: a bug in join_rows" in first.json()["error"], first.text
        second = requests.post(f"{server.url}/v2/models/m/infer", data=_tagged(2), headers=AUTH, timeout=60)
        assert second.status_code == 200, second.text
    finally:
        server.stop()
