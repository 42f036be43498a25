"""The endpoint's protocol behaviour, with a numpy stand-in group (the model does not matter here).

Every bad request answered, auth, metadata, request ids, readiness, draining, ports. The
bad-request table (``harness.infer_requests``) runs against the real Megatron group in
``tests/client/test_real_teacher.py`` too. What the server's parts do under load or failure is in
the modules named after them (``test_endpoint_connections.py``, ``test_endpoint_body.py``, ...).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from harness.endpoint import start_server
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.infer_requests import (
    GOOD_IDS,
    GOOD_LENS,
    MAX_BODY,
    check_bad_requests_then_good,
    infer_body,
)
from harness.lifecycle import Teacher
from harness.run import TeacherDef, make_run

from podium.config.launcher import ServerSettings
from podium.net import listen_on_free_port as bind_socket
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
                                                      "topk_logit_indices", "candidate_logprobs", "hidden_states",
                                                      "logits"}
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


def test_draining_answers_503_with_retry_after_and_finishes_queued_work() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, retry_after_s=3)
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
        server = start_server(FakeGroup(), settings={"port_range": (port, port + 20)})
        try:
            assert server.port > port
            assert requests.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
        finally:
            server.stop()
        with pytest.raises(OSError, match=f"no free port on 127.0.0.1 in {port}-{port}"):
            start_server(FakeGroup(), settings={"port_range": (port, port)})
    finally:
        busy.close()


def test_config_refuses_no_token() -> None:
    with pytest.raises(ValueError, match="token is required"):
        EndpointConfig(served_name="m", token="")
