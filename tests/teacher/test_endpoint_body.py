"""Reading an infer request's body (:mod:`podium.teacher.endpoint.body`): a stalled upload holds
no queue slot and no memory and is answered 408; a JSON body is capped far below a binary one; a
binary body that disagrees with its declared tensors is refused before room for it is allocated;
a large JSON request is decoded and its answer encoded off the event loop, so health answers
meanwhile.

The real endpoint, with the numpy stand-in group. Figures (memory held by stalled uploads, health
latency beside a large request) are printed (``-s``).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any

import numpy as np
import pytest
import requests
from harness.endpoint import AUTH, closed_within, health_s, in_thread, post, start_server, wait_until
from harness.fake_group import FakeGroup
from harness.infer_requests import GOOD_IDS, GOOD_LENS, MAX_BODY, binary_body, infer_body

from podium.protocol.names import ERROR_KIND_HEADER, ERROR_REFUSED


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _stalled_upload(port: int, declared: int) -> socket.socket:
    """A binary infer request whose header declares ``declared`` bytes of ids, of which 8 are sent."""
    rows = declared // 8
    head = json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, rows], "parameters": {"binary_data_size": rows * 8}},
        {"name": "input_lengths", "datatype": "INT64", "shape": [1], "parameters": {"binary_data_size": 8}},
    ]}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall((f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t0ken\r\n"
                  f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(head) + rows * 8 + 8}\r\n"
                  f"\r\n").encode() + head + b"\0" * 8)
    return sock


def test_stalled_uploads_hold_no_queue_slot_and_no_memory_and_are_answered_408() -> None:
    """Four uploads that announce 200 MB each and stall, with a queue of 4: the others are served
    meanwhile, the stalled ones cost what they sent, and each is answered 408 once its body has
    been silent for body_timeout_s."""
    server = start_server(FakeGroup(), {"max_queue": 4, "body_timeout_s": 2.0, "header_timeout_s": 60.0})
    try:
        before = _rss_bytes()
        stalled = [_stalled_upload(server.port, 200 * 1024 * 1024) for _ in range(4)]
        wait_until(lambda: server.server.metadata()["podium"]["reading"] == 4, "the four bodies being read")
        grown = _rss_bytes() - before
        ok = post(server, infer_body([[1, 2]], [2]), timeout=10)
        print(f"\n4 stalled uploads announcing 800 MB: memory grew by {grown / 2**20:.0f} MB; another caller: "
              f"HTTP {ok.status_code}")
        assert ok.status_code == 200, ok.text
        assert grown < 100 * 2**20
        started = time.monotonic()
        for sock in stalled:
            sock.settimeout(10)
            answer = sock.recv(65536).decode(errors="replace")
            assert answer.startswith("HTTP/1.1 408"), answer[:200]
            assert "podium.server.body_timeout_s" in answer and f"{ERROR_KIND_HEADER}: {ERROR_REFUSED}" in answer
            assert closed_within(sock, 5.0)
            sock.close()
        assert time.monotonic() - started < 5.0
        assert server.server.metadata()["podium"]["reading"] == 0
    finally:
        server.stop()


def test_a_json_body_is_capped_far_below_a_binary_one() -> None:
    server = start_server(FakeGroup(max_sequence_length=None), {"max_json_body_mb": 1})
    try:
        ids = np.full((1, 300_000), 100)
        resp = post(server, infer_body(ids, [300_000]))  # ~1.5 MB of JSON
        assert resp.status_code == 413 and "podium.server.max_json_body_mb" in resp.json()["error"], resp.text
        assert resp.headers[ERROR_KIND_HEADER] == ERROR_REFUSED
        body, header_len = binary_body(ids, np.array([300_000]))  # 2.4 MB binary: fine
        assert post(server, body, {"Inference-Header-Content-Length": str(header_len)}).status_code == 200
    finally:
        server.stop()


def test_a_body_that_disagrees_with_its_declared_tensors_is_refused_before_room_for_it_is_allocated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Content-Length announces the whole limit, the header declares 80 bytes of tensors, and only
    the header and those 80 bytes are sent: the answer comes at once (the server did not wait for the
    announced body) and the only buffer allocated is the header's."""
    from podium.teacher.endpoint import body as endpoint_body

    allocated: list[int] = []
    real = endpoint_body._buffer
    monkeypatch.setattr(endpoint_body, "_buffer", lambda size: allocated.append(size) or real(size))
    server = start_server(FakeGroup(), max_body_bytes=MAX_BODY)
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


def test_health_answers_while_a_large_json_request_is_decoded_and_encoded() -> None:
    """A ~6 MB JSON request (a ~20 MB JSON answer): the codec runs off the event loop, so liveness
    probes answer meanwhile."""
    group = FakeGroup(vocab_size=128, max_sequence_length=None)
    server = start_server(group, {"max_request_tokens": 4_000_000})
    try:
        ids = np.random.default_rng(0).integers(0, 128, (8, 200_000))
        body = infer_body(ids, [200_000] * 8)
        outcome: dict[str, Any] = {}
        worker = in_thread(lambda: post(server, body, timeout=300).status_code, outcome, "big")
        worst = 0.0
        while worker.is_alive():
            worst = max(worst, health_s(server.url))
            time.sleep(0.02)
        print(f"\n{len(body) / 2**20:.1f} MB JSON request: slowest /v2/health/live meanwhile {worst * 1000:.0f} ms")
        assert outcome["big"] == 200, outcome
        assert worst < 1.5  # before: 3.7 s for this request (the answer encoded on the event loop)
    finally:
        server.stop()
