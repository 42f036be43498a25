"""The endpoint against hostile or careless callers: connections, costs, containment, stalled and
large bodies, malformed numbers, fairness across options, what /metrics shows.

The real endpoint, with numpy stand-in groups (a group's failure, an out-of-memory included, is
simulated by one). Two figures (health latency under the flood, a caller's wait behind another's
long run) are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import requests
import torch
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.infer_requests import binary_body, infer_body

from podium.config.launcher import ServerSettings
from podium.protocol.names import (
    ERROR_GROUP_BROKEN,
    ERROR_KIND_HEADER,
    ERROR_QUEUE_FULL,
    ERROR_REFUSED,
    ERROR_REQUEST_FAILED,
    ERROR_UNAVAILABLE,
)
from podium.teacher.endpoint import EndpointConfig, ServerThread

AUTH = {"Authorization": "Bearer t0ken"}


def _server(group: Any, settings: dict[str, Any] | None = None, **kw: Any) -> ServerThread:
    server_settings = ServerSettings(**{"port_range": (23000, 23999), **(settings or {})})
    server = ServerThread(group, EndpointConfig(served_name="m", token="t0ken", server=server_settings, **kw))
    server.start()
    server.set_ready(True)
    return server


def _post(server: ServerThread, body: bytes, headers: dict[str, str] | None = None,
          timeout: float = 60) -> requests.Response:
    return requests.post(f"{server.url}/v2/models/m/infer", data=body, headers={**AUTH, **(headers or {})},
                         timeout=timeout)


def _in_thread(fn: Callable[[], Any], outcome: dict[Any, Any], key: Any) -> threading.Thread:
    def run() -> None:
        try:
            outcome[key] = fn()
        except Exception as exc:  # reported by the test
            outcome[key] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_until(cond: Callable[[], Any], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _health_s(url: str, timeout_s: float = 10.0) -> float:
    started = time.perf_counter()
    assert requests.get(f"{url}/v2/health/live", timeout=timeout_s).status_code == 200
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------ connections

def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes ``sock`` within ``seconds`` (no answer expected)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_an_incomplete_request_or_a_silent_connection_is_closed_within_seconds() -> None:
    server = _server(FakeGroup(), {"header_timeout_s": 1.0})
    try:
        half = socket.create_connection(("127.0.0.1", server.port))
        half.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bea")  # never finished
        silent = socket.create_connection(("127.0.0.1", server.port))
        started = time.monotonic()
        assert _closed_within(half, 5.0) and _closed_within(silent, 5.0)
        assert time.monotonic() - started < 4.0
        assert _post(server, infer_body([[1, 2]], [2])).status_code == 200  # a whole request is served
    finally:
        server.stop()


FLOOD = textwrap.dedent("""
    import resource, socket, sys, time
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port, count, sources = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    socks = []
    for i in range(count):
        s = socket.socket()
        s.bind((f"127.0.0.{2 + i % sources}", 0))
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    time.sleep(2)  # the handshakes complete (or not: an endpoint that stopped accepting)
    sent = 0
    for s in socks:
        try:
            s.send(b"GET /v2/health/live HTTP/1.1\\r\\nHost: x\\r\\n")  # headers never finished
            sent += 1
        except OSError:
            pass
    print(sent, flush=True)
    sys.stdin.read()  # hold them until the test is done
""")


def test_a_flood_of_idle_connections_leaves_health_metrics_and_callers_answered() -> None:
    """2,000 half-sent requests from 8 addresses, while the process's soft open-files limit is 1,024
    (a common default): the endpoint raises it, caps its connections (closing the idle ones) and
    answers health, metrics and 16 real callers."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.fail(f"this test needs a hard open-files limit of 4096 or more (it is {hard})")
    # a soft limit the flood exceeds (1,024, or what this process holds already and a margin)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(1024, len(os.listdir("/proc/self/fd")) + 128), hard))
    server = None
    flood = None
    try:
        server = _server(FakeGroup(), {"header_timeout_s": 60.0})
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(server.port), "2000", "8"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert flood.stdout is not None
        sent = int(flood.stdout.readline())  # the connections still open when the flood wrote to them
        guard = server.server.connections
        health = [_health_s(server.url) for _ in range(5)]
        print(f"\nhealth: {[round(h * 1000, 1) for h in health]} ms")
        print(f"\nflood: 2000 connections, {sent} half-sent requests; the endpoint holds {guard.open} connections "
              f"(cap {guard.max_connections}), closed {guard.evicted} idle ones to make room; "
              f"/v2/health/live in {max(health) * 1000:.1f} ms (worst of 5)")
        assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 200
        outcome: dict[int, Any] = {}
        threads = [_in_thread(lambda i=i: _post(server, infer_body([[i + 1, 2, 3]], [3]), timeout=30).status_code,
                              outcome, i) for i in range(16)]
        for t in threads:
            t.join(60)
        assert outcome == dict.fromkeys(range(16), 200), outcome
        assert guard.open <= guard.max_connections
    finally:
        if flood is not None:
            flood.kill()
            flood.wait()
        if server is not None:
            server.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connections_per_peer_are_capped_by_closing_the_idle_ones() -> None:
    server = _server(FakeGroup(), {"max_connections_per_peer": 4, "header_timeout_s": 60.0})
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
        _wait_until(lambda: server.server.connections.open <= 4, "the oldest idle connections closed")
        assert _closed_within(idle[0], 5.0)
        assert _post(server, infer_body([[1, 2]], [2])).status_code == 200
        for sock in idle:
            sock.close()
    finally:
        server.stop()


# --------------------------------------------------------------------------------------- stalled bodies

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
    server = _server(FakeGroup(), {"max_queue": 4, "body_timeout_s": 2.0, "header_timeout_s": 60.0})
    try:
        before = _rss_bytes()
        stalled = [_stalled_upload(server.port, 200 * 1024 * 1024) for _ in range(4)]
        _wait_until(lambda: server.server.metadata()["podium"]["reading"] == 4, "the four bodies being read")
        grown = _rss_bytes() - before
        ok = _post(server, infer_body([[1, 2]], [2]), timeout=10)
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
            assert _closed_within(sock, 5.0)
            sock.close()
        assert time.monotonic() - started < 5.0
        assert server.server.metadata()["podium"]["reading"] == 0
    finally:
        server.stop()


def test_a_json_body_is_capped_far_below_a_binary_one() -> None:
    server = _server(FakeGroup(max_sequence_length=None), {"max_json_body_mb": 1})
    try:
        ids = np.full((1, 300_000), 100)
        resp = _post(server, infer_body(ids, [300_000]))  # ~1.5 MB of JSON
        assert resp.status_code == 413 and "podium.server.max_json_body_mb" in resp.json()["error"], resp.text
        assert resp.headers[ERROR_KIND_HEADER] == ERROR_REFUSED
        body, header_len = binary_body(ids, np.array([300_000]))  # 2.4 MB binary: fine
        assert _post(server, body, {"Inference-Header-Content-Length": str(header_len)}).status_code == 200
    finally:
        server.stop()


def test_health_answers_while_a_large_json_request_is_decoded_and_encoded() -> None:
    """A ~6 MB JSON request (a ~20 MB JSON answer): the codec runs off the event loop, so liveness
    probes answer meanwhile."""
    group = FakeGroup(vocab_size=128, max_sequence_length=None)
    server = _server(group, {"max_request_tokens": 4_000_000})
    try:
        ids = np.random.default_rng(0).integers(0, 128, (8, 200_000))
        body = infer_body(ids, [200_000] * 8)
        outcome: dict[str, Any] = {}
        worker = _in_thread(lambda: _post(server, body, timeout=300).status_code, outcome, "big")
        worst = 0.0
        while worker.is_alive():
            worst = max(worst, _health_s(server.url))
            time.sleep(0.02)
        print(f"\n{len(body) / 2**20:.1f} MB JSON request: slowest /v2/health/live meanwhile {worst * 1000:.0f} ms")
        assert outcome["big"] == 200, outcome
        assert worst < 1.5  # before: 3.7 s for this request (the answer encoded on the event loop)
    finally:
        server.stop()


# --------------------------------------------------------------------------------- admission by cost

def test_costly_requests_are_refused_before_compute_naming_the_setting() -> None:
    group = FakeGroup(vocab_size=128, max_sequence_length=None)
    server = _server(group, {"max_top_k": 4, "max_request_tokens": 10_000, "max_response_mb": 1})
    try:
        cases = [
            (infer_body([[1, 2]], [2], parameters={"top_k": 5}), "podium.server.max_top_k"),
            (infer_body(np.ones((2, 6000), int), [6000, 6000]), "podium.server.max_request_tokens"),
            (infer_body(np.ones((1, 9000), int), [9000], parameters={"top_k": 4},  # ~1.1 MB of JSON values
                        outputs=[{"name": "topk_logprobs"}, {"name": "topk_indices"}]),
             "podium.server.max_response_mb"),
        ]
        for body, setting in cases:
            resp = _post(server, body)
            assert resp.status_code == 413 and setting in resp.json()["error"], (setting, resp.status_code,
                                                                                 resp.text[:300])
            assert resp.headers[ERROR_KIND_HEADER] == ERROR_REFUSED
        assert group.calls == []  # nothing was computed
        assert _post(server, infer_body([[1, 2]], [2], parameters={"top_k": 4})).status_code == 200
    finally:
        server.stop()


def test_malformed_numbers_are_4xx() -> None:
    server = _server(FakeGroup(vocab_size=128))
    try:
        digits = "9" * 5000
        huge_id = (b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [' +
                   digits.encode() + b']}, {"name": "input_lengths", "datatype": "INT64", "shape": [1], "data": [1]}]}')
        body = json.loads(infer_body([[1, 2]], [2]))
        for raw, expected in [
            (huge_id, "malformed JSON"),
            (json.dumps({**body, "parameters": {"temperature": 10**400}}).encode(), "'temperature'"),
            (json.dumps({**body, "parameters": {"temperature": 1e-310}}).encode(), "0.001..1000"),
            (json.dumps({**body, "parameters": {"temperature": 5000.0}}).encode(), "MAX_TEMPERATURE"),
            (json.dumps({**body, "parameters": {"top_k": 10**400}}).encode(), "'top_k'"),
        ]:
            resp = _post(server, raw)
            assert resp.status_code == 400 and expected in resp.json()["error"], (raw[:80], resp.status_code,
                                                                                  resp.text[:300])
            assert resp.headers[ERROR_KIND_HEADER] == ERROR_REFUSED
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------- containment

class Poisoned(FakeGroup):
    """A group whose computation fails (out of memory) for any call holding a row that starts
    with token 13, and that still works afterwards; ``broken_by`` marks it broken by a
    ValueError instead (a worker that died while refusing)."""

    def __init__(self, *args: Any, broken_by: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.broken: str | None = None
        self.broken_by = broken_by

    def get_logprobs(self, data: Any, micro_batch_size: int | None = None, top_k: int | None = None,
                     **kw: Any) -> dict:
        out = super().get_logprobs(data, micro_batch_size, top_k, **kw)
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
    server = _server(group, {"max_queue_delay_ms": 0.0})
    outcome: dict[int, Any] = {}
    try:
        first = _in_thread(lambda: _post(server, infer_body([[1, 2]], [2])), outcome, 1)
        group.wait_for_calls(1)  # held in the group: the next three queue and share one call
        threads = [_in_thread(lambda t=t: _post(server, infer_body([[t, 5, 6]], [3]), {"X-Podium-Caller": f"c{t}"}),
                              outcome, t) for t in (12, 13, 14)]
        _wait_until(lambda: server.server.queue_depth == 4, "three requests queued behind the first")
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
        assert _post(server, infer_body([[7, 8]], [2])).status_code == 200  # the group stays usable
        assert requests.get(f"{server.url}/v2/health/ready", headers=AUTH, timeout=10).status_code == 200
    finally:
        gate.release(10)
        server.stop()


def test_a_broken_group_is_503_group_broken_never_400() -> None:
    server = _server(Poisoned(vocab_size=128, broken_by=21))
    try:
        resp = _post(server, infer_body([[21, 2]], [2]))
        assert resp.status_code == 503 and resp.headers[ERROR_KIND_HEADER] == ERROR_GROUP_BROKEN, resp.text
        assert "Retry-After" in resp.headers
        again = _post(server, infer_body([[1, 2]], [2]))  # not computed: unavailable, no crash to count
        assert again.status_code == 503 and again.headers[ERROR_KIND_HEADER] == ERROR_UNAVAILABLE
    finally:
        server.stop()


def test_a_full_queue_says_queue_full() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = _server(group, {"max_queue": 1})
    outcome: dict[int, Any] = {}
    try:
        held = _in_thread(lambda: _post(server, infer_body([[1, 2]], [2])).status_code, outcome, 1)
        group.wait_for_calls(1)
        full = _post(server, infer_body([[2, 2]], [2]))
        assert full.status_code == 503 and full.headers[ERROR_KIND_HEADER] == ERROR_QUEUE_FULL
        assert full.headers["Retry-After"]
        gate.release(2)
        held.join(60)
        assert outcome == {1: 200}
    finally:
        gate.release(2)
        server.stop()


# ------------------------------------------------------------------------------------------ fairness

def test_a_caller_with_other_options_takes_turns_with_a_long_run() -> None:
    """Caller A's long run (many calls' worth of rows, no top-k) is queued first; B asks with
    ``top_k`` (which cannot share A's calls) and C with another ``micro_batch_size`` (which can).
    B is served within a few calls, not after A's run; C's rows share A's calls."""
    group = FakeGroup(vocab_size=128, delay_s=0.01)
    gate = Gate()
    group.hold = gate
    server = _server(group, {"max_queue_delay_ms": 0.0}, call_tokens=64)
    outcome: dict[str, Any] = {}
    try:
        long_ids = np.full((128, 16), 1)
        a = _in_thread(lambda: _post(server, infer_body(long_ids, [16] * 128), {"X-Podium-Caller": "a"}), outcome,
                       "a")
        group.wait_for_calls(1)
        started = time.perf_counter()
        b = _in_thread(lambda: (_post(server, infer_body([[2, 3]], [2], parameters={"top_k": 2}),
                                      {"X-Podium-Caller": "b"}), time.perf_counter() - started), outcome, "b")
        c = _in_thread(lambda: _post(server, infer_body(np.full((2, 16), 3), [16, 16],
                                                        parameters={"micro_batch_size": 7}), {"X-Podium-Caller": "c"}),
                       outcome, "c")
        _wait_until(lambda: server.server.queue_depth == 3, "B and C queued behind A's first call")
        gate.release(1000)
        for t in (a, b, c):
            t.join(120)
        b_resp, b_wait = outcome["b"]
        assert outcome["a"].status_code == 200 and b_resp.status_code == 200 and outcome["c"].status_code == 200
        firsts = [int(got["input_ids"][0, 0]) for got in group.received]
        b_call = firsts.index(2)
        print(f"\nB (other top_k) answered after {b_wait * 1000:.0f} ms, in call {b_call + 1} of {len(firsts)}")
        assert len(firsts) > 20 and b_call <= 3, firsts
        assert any({1, 3} <= set(got["input_ids"][:, 0].tolist()) for got in group.received)  # C shares A's calls
    finally:
        gate.release(1000)
        server.stop()


# ----------------------------------------------------------------------------------------------- metrics

def test_metrics_show_no_caller_and_need_the_token_when_the_site_says_so() -> None:
    group = FakeGroup(vocab_size=128)
    server = _server(group)
    try:
        assert _post(server, infer_body([[1, 2]], [2]), {"X-Podium-Caller": "secret-host:4242"}).status_code == 200
        text = requests.get(f"{server.url}/metrics", timeout=10).text
        assert "secret-host" not in text and "podium_requests_total" in text
    finally:
        server.stop()
    server = _server(group, {"metrics_need_token": True})
    try:
        assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 401
        assert requests.get(f"{server.url}/metrics", headers=AUTH, timeout=10).status_code == 200
        assert requests.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
    finally:
        server.stop()


def test_the_open_files_limit_is_raised_to_the_hard_limit() -> None:
    from podium.fds import raise_nofile_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert raise_nofile_limit() == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] in (hard, 1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
