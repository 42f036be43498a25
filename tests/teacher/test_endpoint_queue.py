"""The endpoint's queue and batcher (:mod:`podium.teacher.endpoint.batching`) with a stand-in
group: requests queue in arrival order behind a busy group and none is dropped (one per call, or
batched); callers take turns, with a long run, with other options, with a request split over many
calls; a request whose client went away leaves the queue (queued), is not answered (computing), or
sends no more rows (split).

The same rules as logic: ``tests/teacher/test_batching.py``; with the real group:
``test_endpoint_batching.py``. A caller's wait behind another's long run is printed (``-s``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import requests
from harness.endpoint import (
    AUTH,
    in_thread,
    post,
    post_in_thread,
    raw_infer,
    rows_body,
    start_server,
    tagged_body,
    wait_until,
)
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.infer_requests import infer_body


@pytest.mark.parametrize("batch_requests", [False, True], ids=["fifo", "batched"])
def test_requests_queue_in_order_behind_a_busy_group_and_none_is_dropped(batch_requests: bool) -> None:
    """Requests queue in arrival order behind a call the group holds; health answers meanwhile.
    Then, one request per call in arrival order (``batch_requests: false``), or the queued requests
    batched into fewer calls, their rows in arrival order (one caller)."""
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, settings={"batch_requests": batch_requests})
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
            wait_until(lambda i=i: endpoint.queue_depth == i + 1 or errors, f"request {i} in the queue")
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


def test_a_caller_with_other_options_takes_turns_with_a_long_run() -> None:
    """Caller A's long run (many calls' worth of rows, no top-k) is queued first; B asks with
    ``top_k`` (which cannot share A's calls) and C with another ``micro_batch_size`` (which can).
    B is served within a few calls, not after A's run; C's rows share A's calls."""
    group = FakeGroup(vocab_size=128, delay_s=0.01)
    gate = Gate()
    group.hold = gate
    server = start_server(group, {"max_queue_delay_ms": 0.0}, batch_tokens=64)
    outcome: dict[str, Any] = {}
    try:
        long_ids = np.full((128, 16), 1)
        a = in_thread(lambda: post(server, infer_body(long_ids, [16] * 128), {"X-Podium-Caller": "a"}), outcome,
                       "a")
        group.wait_for_calls(1)
        started = time.perf_counter()
        b = in_thread(lambda: (post(server, infer_body([[2, 3]], [2], parameters={"top_k": 2}),
                                      {"X-Podium-Caller": "b"}), time.perf_counter() - started), outcome, "b")
        c = in_thread(lambda: post(server, infer_body(np.full((2, 16), 3), [16, 16],
                                                        parameters={"micro_batch_size": 7}), {"X-Podium-Caller": "c"}),
                       outcome, "c")
        wait_until(lambda: server.server.queue_depth == 3, "B and C queued behind A's first call")
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


def test_a_huge_request_is_split_and_other_callers_take_turns_with_it() -> None:
    """Caller A's 40 rows need 10 calls of 32 tokens; B's one row, sent while A's first call is in
    the group, goes in the very next call (B's turn comes before A's), not after A's last row.
    Calls hold at most 32 tokens (rows counted at their bucket length: 8 here)."""
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, settings={"max_queue_delay_ms": 0}, batch_tokens=32)
    outcome: dict[int, Any] = {}
    threads = []
    try:
        threads.append(post_in_thread(server, rows_body(1, 40), outcome, 1))  # caller: this host
        group.wait_for_calls(1)
        body = rows_body(2, 1)
        def call_b() -> None:
            resp = requests.post(f"{server.url}/v2/models/m/infer", data=body, timeout=120,
                                 headers={**AUTH, "X-Podium-Caller": "trainer-b"})
            outcome[2] = (resp.status_code, resp.text)
        threads.append(threading.Thread(target=call_b))
        threads[-1].start()
        wait_until(lambda: server.server.queue_depth == 2, "B queued behind A's first call")
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


def test_a_queued_request_whose_client_went_away_never_reaches_the_group() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group)
    endpoint = server.server
    outcome: dict[int, Any] = {}
    a = post_in_thread(server, tagged_body(1), outcome, 1)
    try:
        group.wait_for_calls(1)  # A is in the group, held there
        b = raw_infer(server, tagged_body(2))
        wait_until(lambda: endpoint.queue_depth == 2, "B queued behind A")
        b.close()  # B's client goes away before B runs
        wait_until(lambda: endpoint.abandoned == 1 and endpoint.queue_depth == 1, "B out of the queue")
        meta = requests.get(f"{server.url}/v2/models/m", headers=AUTH, timeout=60).json()["podium"]
        assert meta["abandoned"] == 1 and meta["queue_depth"] == 1
    finally:
        gate.release(2)  # enough for B too: a B that wrongly reached the group would not hang the test
        a.join(120)
    try:
        assert outcome[1][0] == 200, outcome
        wait_until(lambda: endpoint.queue_depth == 0, "the queue empty")
        assert group.calls == [1] and endpoint.abandoned == 1 and endpoint.served == 1
    finally:
        server.stop()


def test_a_computing_request_whose_client_went_away_finishes_and_its_answer_is_not_sent() -> None:
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group)
    endpoint = server.server
    try:
        a = raw_infer(server, tagged_body(1))
        group.wait_for_calls(1)  # A is in the group, held there
        a.close()
        wait_until(lambda: endpoint.abandoned == 1, "A counted abandoned")
        assert endpoint.queue_depth == 1  # the group still computes it: it cannot be taken back
        gate.release()
        wait_until(lambda: endpoint.queue_depth == 0, "A's group call finished")
        assert endpoint.served == 0  # computed, never answered
        gate.release()
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=tagged_body(2), headers=AUTH, timeout=60)
        assert resp.status_code == 200 and group.calls == [1, 2] and endpoint.served == 1
    finally:
        gate.release(2)
        server.stop()


def test_a_request_whose_client_went_away_mid_way_sends_no_more_rows() -> None:
    """A's 40 rows need 10 calls; its client goes away while the first is in the group: the rest
    never reach it, and the next request is served."""
    group = FakeGroup(vocab_size=128)
    gate = Gate()
    group.hold = gate
    server = start_server(group, settings={"max_queue_delay_ms": 0}, batch_tokens=32)
    endpoint = server.server
    try:
        a = raw_infer(server, rows_body(1, 40))
        group.wait_for_calls(1)
        a.close()
        wait_until(lambda: endpoint.abandoned == 1, "A counted abandoned")
        gate.release()
        wait_until(lambda: endpoint.queue_depth == 0, "A's call finished and its rows left the queue")
        gate.release()
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=tagged_body(2), headers=AUTH, timeout=60)
        assert resp.status_code == 200
        assert group.first_tokens.count(1) == 4 and group.first_tokens[-2:] == [2, 9]  # one call of A, then B
    finally:
        gate.release(40)
        server.stop()
