"""One teacher's calls through podium's client, against in-process servers with stand-in groups:
restarts followed, a teacher not up yet waited for, and the retry rules (:mod:`podium.client.retry`)
end to end: a refusal and a request's own failure fail at once, a 5xx is retried only when its
generation is gone since, a 503 from a broken generation goes to the next, a request that kills
every generation is sent to at most ``1 + max_retries_after_crash`` of them, a full queue is not
hammered, and a call ends at its deadline saying what it saw.

The same rules on what one exchange produced, alone: ``test_retry_policy.py``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness.exchanges import record_infer_exchanges
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.lifecycle import Teacher
from harness.poll import wait_for
from harness.run import TeacherDef, make_run

import podium
from podium.client import (
    TeacherFailedError,
    TeacherRequestError,
    TeacherServerError,
    TeacherUnavailableError,
)
from podium.client.transport import HTTPTransport
from podium.rendezvous import Generation, RecordWriter, Status, read_record

MATH = TeacherDef("a1a1a1a1a1a1", "math", ("math", "code"))
FAST = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}
NUMPY = {**FAST, "refresh_s": 0.2, "return_type": "numpy"}
DATA = {"input_ids": [[5, 9, 2]], "input_lengths": [3]}

_wait = functools.partial(wait_for, timeout_s=30.0)
until = functools.partial(wait_for, timeout_s=60.0)


def batch(seed: int, rows: int = 4, seq: int = 16, vocab: int = 128) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq + 1, rows)
    ids = rng.integers(0, vocab, (rows, seq))
    ids[np.arange(seq)[None, :] >= lengths[:, None]] = 0
    return ids, lengths


@pytest.fixture
def math_teacher(tmp_path: Path) -> Iterator[tuple[Path, Teacher]]:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    yield layout.rendezvous_path, teacher
    teacher.stop()


@pytest.fixture
def exchanges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, Any]]:
    """(url, bytes of the body, status or the exception's name) of every infer exchange the client makes."""
    return record_infer_exchanges(monkeypatch)


def test_refusal_is_raised_at_once_naming_teacher_and_generation(math_teacher: tuple[Path, Teacher],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, math = math_teacher
    sent: list[tuple[str, str]] = []
    request = HTTPTransport.request

    def counting(self: HTTPTransport, method: str, url_path: str, *args: Any, **kw: Any) -> Any:
        sent.append((method, url_path))
        return request(self, method, url_path, *args, **kw)

    monkeypatch.setattr(HTTPTransport, "request", counting)
    with podium.connect(path, **FAST) as client:
        with pytest.raises(TeacherRequestError) as info:
            client.get_logprobs("math", {"input_ids": [[1, 500]], "input_lengths": [2]})
        # at once: one infer request, no retry and no waiting for another generation
        assert [s for s in sent if s[1].endswith("/infer")] == [("POST", "/v2/models/math/infer")], sent
        assert math.group.calls == []  # refused by the server's checks, before the group
        text = str(info.value)
        assert "'math' (a1a1a1a1a1a1)" in text and "generation 1000:0" in text and "HTTP 400" in text
        assert "outside the vocabulary" in text


def test_client_follows_a_restart_mid_loop(tmp_path: Path) -> None:
    """Stop the server while a loop calls it; it comes back under a new generation on another
    port; every call of the loop returns the right answer."""
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    first = Teacher(FakeGroup(delay_s=0.01), layout, MATH, token).start()
    client = podium.connect(layout.rendezvous_path, **FAST)
    done: list[Generation] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop() -> None:
        i = 0
        try:
            while not stop.is_set():
                ids, lengths = batch(i)
                out = client.get_logprobs("code", {"input_ids": ids, "input_lengths": lengths})
                np.testing.assert_array_equal(out["logprobs"].numpy(), fake_logprobs(ids, lengths))
                done.append(client.teacher("code").record.generation)
                i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    worker = threading.Thread(target=loop)
    worker.start()
    second: Teacher | None = None
    try:
        _wait(lambda: len(done) >= 10 or errors)
        second = first.restart(gap_s=0.5)  # stopped for 0.5 s, then generation 1000:1 on a higher port
        assert second.server.port != first.server.port
        n = len(done)
        _wait(lambda: len(done) >= n + 10 or errors)
    finally:
        stop.set()
        worker.join(60)
        client.close()
        if second is not None:
            second.stop()
    assert not errors, errors
    assert Generation(1000, 0) in done and done[-1] == Generation(1000, 1)
    assert read_record(layout.endpoint_path(MATH.name, MATH.key)).url == second.url


def test_client_waits_for_a_teacher_that_is_not_up_yet(tmp_path: Path) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    client = podium.connect(layout.rendezvous_path, **FAST)
    teacher: dict[str, Teacher] = {}
    later = threading.Timer(0.5, lambda: teacher.__setitem__("t", Teacher(FakeGroup(), layout, MATH, token).start()))
    later.start()
    try:
        ids, lengths = batch(3)
        out = client.get_logprobs("math", {"input_ids": ids, "input_lengths": lengths})
        np.testing.assert_array_equal(out["logprobs"].numpy(), fake_logprobs(ids, lengths))
    finally:
        later.join()
        client.close()
        teacher["t"].stop()


def test_timeout_says_which_teacher_generation_and_what_was_seen(tmp_path: Path) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    client = podium.connect(layout.rendezvous_path, ready_timeout_s=0.6, poll_interval_s=0.05)
    client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
    teacher.stop()  # record: stopped; nothing comes back
    with pytest.raises(TeacherUnavailableError) as info:
        client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
    text = str(info.value)
    assert "teacher 'math' (a1a1a1a1a1a1) unavailable after" in text and "\n" not in text
    assert "(not ready within ready_timeout_s 0.6s); last generation 1000:0; seen: " in text
    assert "generation 1000:0 at http://127.0.0.1:" in text and "generation 1000:0 stopped" in text
    assert info.value.generation == "1000:0" and info.value.waited_s >= 0.6 and isinstance(info.value, TimeoutError)
    # a record that says failed ends the wait at once, with its reason
    writer = RecordWriter(layout.endpoint_path(MATH.name, MATH.key), teacher_key=MATH.key, teacher_name="math",
                          generation=Generation(1000, 1))
    writer.publish(Status.FAILED, reason="checkpoint not found: /ckpt/x")
    with pytest.raises(TeacherFailedError, match=r"'math' .* generation 1000:1 failed: checkpoint not found"):
        client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
    client.close()


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fn()
        except BaseException as exc:  # reported by the test
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_hung_teacher_ends_the_call_at_its_deadline_and_leaves_no_copy_queued(
        tmp_path: Path, exchanges: list) -> None:
    """The group holds (another trainer's call is in it) while the teacher keeps answering ready:
    the call ends at its deadline with TeacherUnavailableError, and every copy of it the client
    sent left the server's queue when the client gave up; none reached the group."""
    import requests

    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    group = FakeGroup()
    gate = Gate()
    group.hold = gate
    teacher = Teacher(group, layout, MATH, token).start()
    endpoint = teacher.server.server
    blocker, blocked = _in_thread(lambda: requests.post(
        f"{teacher.url}/v2/models/math/infer", timeout=120, headers={"Authorization": f"Bearer {token}"},
        json={"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]},
                         {"name": "input_lengths", "datatype": "INT64", "shape": [1], "data": [2]}]}))
    client = podium.connect(layout.rendezvous_path, **FAST)
    try:
        group.wait_for_calls(1)  # the other trainer's call is in the group, held there
        with pytest.raises(TeacherUnavailableError) as info:
            client.get_logprobs("math", {"input_ids": [[2, 3]], "input_lengths": [2]}, timeout_s=1.0)
        text = str(info.value)
        assert "teacher 'math' (a1a1a1a1a1a1) unavailable after" in text and "(call deadline 1s)" in text
        assert "last generation 1000:0" in text and "timed out" in text and "\n" not in text
        assert info.value.generation == "1000:0" and info.value.waited_s >= 1.0
        sent = len(exchanges)
        assert sent >= 1 and all(status == "TransportError" for *_, status in exchanges), exchanges
        _wait(lambda: endpoint.abandoned == sent and endpoint.queue_depth == 1)  # only the held call is left
    finally:
        gate.release(10)
        blocker.join(120)
        client.close()
    try:
        assert blocked["result"].status_code == 200, blocked
        _wait(lambda: endpoint.queue_depth == 0)
        assert group.calls == [1]  # the client's request never reached the group
    finally:
        teacher.stop()


class BreakingGroup(FakeGroup):
    """Fails the call whose ``input_ids[0, 0]`` is 13, after the hold (a worker dies under it)."""

    def compute(self, data: Any, query: Any) -> dict:
        out = super().compute(data, query)
        if int(data.input_ids[0, 0]) == 13:
            raise RuntimeError("worker 3 died")
        return out


def test_a_5xx_from_a_generation_that_has_since_changed_is_retried_on_the_next(
        tmp_path: Path, exchanges: list) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    old_group = BreakingGroup()
    gate = Gate()
    old_group.hold = gate
    old = Teacher(old_group, layout, MATH, token).start()
    new: Teacher | None = None
    client = podium.connect(layout.rendezvous_path, **FAST)
    ids, lengths = np.array([[13, 4, 5]]), np.array([3])
    call, outcome = _in_thread(lambda: client.get_logprobs("math", {"input_ids": ids, "input_lengths": lengths}))
    try:
        old_group.wait_for_calls(1)  # in the old generation's group, which will fail it
        new = old.successor(FakeGroup())  # the lifecycle replaced it: the record names 1000:1
        gate.release()
        call.join(120)
        assert "error" not in outcome, outcome
        np.testing.assert_array_equal(outcome["result"]["logprobs"].numpy(), fake_logprobs(ids, lengths))
        assert [(url, status) for url, _, status in exchanges] == [(old.url, 500), (new.url, 200)]
        assert old_group.calls == [13] and new.group.calls == [13]
        assert client.teacher("math").record.generation == Generation(1000, 1)
    finally:
        gate.release(2)
        call.join(120)
        client.close()
        old.stop()
        if new is not None:
            new.stop()


def test_a_5xx_from_the_same_generation_is_raised_not_retried(tmp_path: Path, exchanges: list) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(BreakingGroup(), layout, MATH, token).start()
    try:
        with podium.connect(layout.rendezvous_path, **FAST) as client, \
                pytest.raises(TeacherServerError) as info:
            client.get_logprobs("math", {"input_ids": [[13, 4]], "input_lengths": [2]})
        text = str(info.value)
        assert "'math' (a1a1a1a1a1a1) (generation 1000:0) failed: HTTP 500" in text and "worker 3 died" in text
        assert [status for *_, status in exchanges] == [500]  # once: the same generation would fail it again
        assert teacher.group.calls == [13]
    finally:
        teacher.stop()


def test_a_503_from_a_teacher_broken_under_the_request_is_retried_on_the_next_generation(
        tmp_path: Path, exchanges: list) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    old_group = BreakingGroup()
    gate = Gate()
    old_group.hold = gate
    old = Teacher(old_group, layout, MATH, token).start()
    new: Teacher | None = None
    client = podium.connect(layout.rendezvous_path, **FAST)
    ids, lengths = np.array([[13, 7]]), np.array([2])
    call, outcome = _in_thread(lambda: client.get_logprobs("math", {"input_ids": ids, "input_lengths": lengths}))
    try:
        old_group.wait_for_calls(1)
        old.server.set_ready(False, "node n2 (rank 1) lost")  # the lifecycle finds the group broken
        gate.release()
        _wait(lambda: [status for *_, status in exchanges] == [503] or outcome)  # answered 503; the client waits
        assert not outcome, outcome
        new = old.successor(FakeGroup())
        call.join(120)
        assert "error" not in outcome, outcome
        np.testing.assert_array_equal(outcome["result"]["logprobs"].numpy(), fake_logprobs(ids, lengths))
        assert [(url, status) for url, _, status in exchanges] == [(old.url, 503), (new.url, 200)]
    finally:
        gate.release(2)
        call.join(120)
        client.close()
        old.stop()
        if new is not None:
            new.stop()


class FailingGroup(FakeGroup):
    """Fails any call whose first token is 13 (the group itself survives: the request's own failure)."""

    def compute(self, data: Any, query: Any) -> dict:
        out = super().compute(data, query)
        if int(data.input_ids[0, 0]) == 13:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return out


def test_a_request_that_fails_its_computation_fails_once_with_the_cause(tmp_path: Path,
                                                                        exchanges: list) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FailingGroup(), layout, MATH, token).start()
    try:
        with podium.connect(layout.rendezvous_path, **NUMPY) as client:
            with pytest.raises(TeacherServerError) as info:
                client.get_logprobs("math", {"input_ids": [[13, 4]], "input_lengths": [2]})
            assert client.get_logprobs("math", DATA)["logprobs"].shape == (1, 3)  # the teacher still serves
        assert isinstance(info.value, TeacherRequestError)  # not worth retrying, as a refusal
        text = str(info.value)
        assert "teacher 'math' (a1a1a1a1a1a1) (generation 1000:0) failed: HTTP 500" in text
        assert "CUDA out of memory (stand-in)" in text and "not sent again" in text
        assert [status for *_, status in exchanges] == [500, 200]
    finally:
        teacher.stop()


class KilledGroup(FakeGroup):
    """A generation the request with first token 13 kills: the call never returns (``gate``) and the
    teacher's lifecycle replaces the generation (:func:`crash_loop`)."""

    def __init__(self, gate: Gate, killed: threading.Event) -> None:
        super().__init__()
        self.gate = gate
        self.killed = killed

    def compute(self, data: Any, query: Any) -> dict:
        if int(data.input_ids[0, 0]) == 13:
            self.killed.set()
            self.gate()
        return super().compute(data, query)


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
        crash_loop: tuple[Path, list[Teacher]], exchanges: list) -> None:
    path, generations = crash_loop
    with podium.connect(path, **NUMPY) as client:
        assert client.get_logprobs("math", DATA)["logprobs"].shape == (1, 3)
        started = time.monotonic()
        with pytest.raises(TeacherServerError) as info:
            client.get_logprobs("math", {"input_ids": [[13, 4]], "input_lengths": [2]}, timeout_s=20)
        took = time.monotonic() - started
        killer = [status for _, size, status in exchanges[1:]]
        text = str(info.value)
        assert "3 generations died under this request" in text and "max_retries_after_crash is 2" in text, text
        assert killer == ["TransportError"] * 3, exchanges
        wait_for(lambda: len(generations) == 4, "the fourth generation")  # started after the third's death
        time.sleep(0.5)
        assert len(generations) == 4 and generations[-1].group.calls == []  # the request was not sent there
        print(f"\nkiller request: {len(killer)} attempts, 3 generations killed, failed after {took:.1f}s")
        until(lambda: generations[-1].server is not None, what="the fourth generation")
        assert client.get_logprobs("math", DATA)["logprobs"].shape == (1, 3)  # others' calls go on


def test_a_full_queue_is_not_hammered(tmp_path: Path, exchanges: list) -> None:
    """One 8 MB call against a full queue (Retry-After 1) for 5 s: a few attempts (Retry-After,
    doubled, jittered), not one every poll interval."""
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    group = FakeGroup(max_sequence_length=8192)
    gate = Gate()
    group.hold = gate
    teacher = Teacher(group, layout, MATH, token, server_settings={"max_queue": 1},
                      config_overrides={"retry_after_s": 1}).start()
    client = podium.connect(layout.rendezvous_path, **NUMPY)
    blocker = threading.Thread(target=lambda: client.get_logprobs("math", DATA, timeout_s=60))
    try:
        blocker.start()
        group.wait_for_calls(1)  # the queue's one slot is taken
        ids = np.ones((128, 8192), dtype=np.int64)  # 8 MiB of input ids
        started = time.monotonic()
        with pytest.raises(TeacherUnavailableError, match="queue is full"):
            client.get_logprobs("math", {"input_ids": ids, "input_lengths": np.full(128, 8192)}, timeout_s=5.0)
        took = time.monotonic() - started
        big = [(status, size) for _, size, status in exchanges if size > 8 * 2**20]
        uploaded = sum(size for _, size in big)
        print(f"\nfull queue, one 8 MiB call for {took:.1f}s: {len(big)} attempts, {uploaded / 2**20:.0f} MiB uploaded")
        assert all(status == 503 for status, _ in big), big
        assert 2 <= len(big) <= 4, big  # at 0 s, >= 1 s, >= 3 s (then >= 7 s: past the deadline)
    finally:
        gate.release(10)
        blocker.join(60)
        client.close()
        teacher.stop()
