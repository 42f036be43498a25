"""The endpoint's connections (:mod:`podium.teacher.endpoint.connections`) against careless or
hostile callers: a half-sent request or a silent connection is closed within seconds, connections
are capped per peer and in all (the idle ones closed to make room), and the process's open-files
limit is raised, so that a flood of them leaves health, metrics and callers answered.

The real endpoint, with the numpy stand-in group. The flood's figures (health latency under it,
connections held and closed) are printed (``-s``).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import requests
from harness.endpoint import closed_within, health_s, in_thread, post, start_server, wait_until
from harness.fake_group import FakeGroup
from harness.infer_requests import infer_body


def test_an_incomplete_request_or_a_silent_connection_is_closed_within_seconds() -> None:
    server = start_server(FakeGroup(), {"header_timeout_s": 1.0})
    try:
        half = socket.create_connection(("127.0.0.1", server.port))
        half.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bea")  # never finished
        silent = socket.create_connection(("127.0.0.1", server.port))
        started = time.monotonic()
        assert closed_within(half, 5.0) and closed_within(silent, 5.0)
        assert time.monotonic() - started < 4.0
        assert post(server, infer_body([[1, 2]], [2])).status_code == 200  # a whole request is served
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
        server = start_server(FakeGroup(), {"header_timeout_s": 60.0})
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(server.port), "2000", "8"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert flood.stdout is not None
        sent = int(flood.stdout.readline())  # the connections still open when the flood wrote to them
        guard = server.server.connections
        health = [health_s(server.url) for _ in range(5)]
        print(f"\nhealth: {[round(h * 1000, 1) for h in health]} ms")
        print(f"\nflood: 2000 connections, {sent} half-sent requests; the endpoint holds {guard.open} connections "
              f"(cap {guard.max_connections}), closed {guard.evicted} idle ones to make room; "
              f"/v2/health/live in {max(health) * 1000:.1f} ms (worst of 5)")
        assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 200
        outcome: dict[int, Any] = {}
        threads = [in_thread(lambda i=i: post(server, infer_body([[i + 1, 2, 3]], [3]), timeout=30).status_code,
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
    server = start_server(FakeGroup(), {"max_connections_per_peer": 4, "header_timeout_s": 60.0})
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
        wait_until(lambda: server.server.connections.open <= 4, "the oldest idle connections closed")
        assert closed_within(idle[0], 5.0)
        assert post(server, infer_body([[1, 2]], [2])).status_code == 200
        for sock in idle:
            sock.close()
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
