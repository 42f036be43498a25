"""podium's client against in-process servers with stand-in groups: routing, restarts, errors.

The model does not matter here (numpy stand-in groups with a known answer); the same client runs
against the real Megatron group in ``test_real_teacher.py``.
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
import torch
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
    TokenizerMismatchError,
    tokenizer_fingerprint,
)
from podium.client.transport import HTTPTransport
from podium.nemo_rl import RemoteTeacherWorkerGroup
from podium.protocol.tokenizer import fingerprint_from_pretrained
from podium.rendezvous import Generation, RecordWriter, RoutingError, Status, read_record

MATH = TeacherDef("a1a1a1a1a1a1", "math", ("math", "code"))
CHAT = TeacherDef("b2b2b2b2b2b2", "chat", ("chat",))
FAST = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}


class ShiftedGroup(FakeGroup):
    """A second teacher with another answer: the fake logprobs minus ``shift`` at valid positions."""

    def __init__(self, shift: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.shift = shift

    def compute(self, data: Any, query: Any) -> dict:
        out = super().compute(data, query)
        lp = out["logprobs"]
        out["logprobs"] = torch.where(lp != 0, lp - self.shift, lp)
        return out


def shifted(ids: np.ndarray, lengths: np.ndarray, shift: float) -> np.ndarray:
    lp = fake_logprobs(ids, lengths)
    return np.where(lp != 0, lp - shift, lp).astype(np.float32)


def batch(seed: int, rows: int = 4, seq: int = 16, vocab: int = 128) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq + 1, rows)
    ids = rng.integers(0, vocab, (rows, seq))
    ids[np.arange(seq)[None, :] >= lengths[:, None]] = 0
    return ids, lengths


@pytest.fixture
def two_teachers(tmp_path: Path) -> Iterator[tuple[Path, Teacher, Teacher]]:
    layout, token = make_run(tmp_path, [MATH, CHAT], default_alias="chat")
    math = Teacher(ShiftedGroup(0.0), layout, MATH, token).start()
    chat = Teacher(ShiftedGroup(100.0), layout, CHAT, token, generation=Generation(2000, 0)).start()
    yield layout.rendezvous_path, math, chat
    math.stop()
    chat.stop()


def test_routing_and_concurrent_multi_teacher_order(two_teachers: tuple[Path, Teacher, Teacher]) -> None:
    path, math, chat = two_teachers
    with podium.connect(path, **FAST) as client:
        assert client.resolve("code") == MATH.key and client.resolve("some_agent") == CHAT.key
        ids, lengths = batch(1, rows=9)
        agents = ["math", "chat", "code", "unlisted_agent", "math", "chat", "code", "math", "chat"]
        expected = np.stack([shifted(ids[i:i + 1], lengths[i:i + 1],
                                     100.0 if a in ("chat", "unlisted_agent") else 0.0)[0]
                             for i, a in enumerate(agents)])
        # Each teacher's call waits in its group until the other teacher's call is there too: only
        # calls in flight at the same time get through (one after the other, the first times out).
        both_in_a_call = threading.Barrier(2, timeout=120)
        math.group.hold = chat.group.hold = both_in_a_call.wait
        try:
            for _ in range(2):  # the first call also connects
                out = client.get_logprobs_by_agent({"input_ids": torch.from_numpy(ids),
                                                    "input_lengths": torch.from_numpy(lengths)}, agents)
                assert out["logprobs"].dtype == torch.float32 and out["logprobs"].shape == ids.shape
                np.testing.assert_array_equal(out["logprobs"].numpy(), expected)
            topk = client.get_logprobs_by_agent({"input_ids": ids, "input_lengths": lengths}, agents, top_k=3)
        finally:
            math.group.hold = chat.group.hold = None
        assert not both_in_a_call.broken
        assert len(math.group.calls) == len(chat.group.calls) == 3  # one call per teacher and batch
        # each teacher got its own rows only, in their original order
        math_rows = [i for i, a in enumerate(agents) if a in ("math", "code")]
        np.testing.assert_array_equal(math.group.received[0]["input_ids"], ids[math_rows])
        np.testing.assert_array_equal(chat.group.received[0]["input_ids"],
                                      ids[[i for i in range(len(agents)) if i not in math_rows]])
        assert topk["topk_indices"].shape == (9, 16, 3)
        np.testing.assert_array_equal(topk["topk_indices"][:, :, 0].numpy(), ids % 128)
        with pytest.raises(ValueError, match="2 agent names for a batch of 9"):
            client.get_logprobs_by_agent({"input_ids": ids, "input_lengths": lengths}, ["math", "chat"])


def test_strict_routing_refuses_unknown_agents(tmp_path: Path) -> None:
    layout, _ = make_run(tmp_path, [MATH, CHAT], default_alias="chat", strict=True)
    with podium.connect(layout.rendezvous_path) as client, \
            pytest.raises(RoutingError, match="'unlisted' has no teacher and strict"):
        client.get_logprobs("unlisted", {"input_ids": [[1]], "input_lengths": [1]})


def test_facade_has_nemo_rl_shape(two_teachers: tuple[Path, Teacher, Teacher]) -> None:
    path, _, _ = two_teachers
    client = podium.connect(path)
    group = RemoteTeacherWorkerGroup.from_client(client, "code")
    ids, lengths = batch(2)
    out = group.get_logprobs({"input_ids": torch.from_numpy(ids), "input_lengths": torch.from_numpy(lengths)},
                             micro_batch_size=2)
    assert set(out) == {"reference_logprobs"}
    np.testing.assert_array_equal(out["reference_logprobs"].numpy(), fake_logprobs(ids, lengths))
    with_topk = RemoteTeacherWorkerGroup.from_client(client, "math", top_k=2)
    topk = with_topk.get_logprobs({"input_ids": ids, "input_lengths": lengths})
    assert set(topk) == {"reference_logprobs", "reference_topk_logprobs", "reference_topk_indices"}
    connections = list(client.teacher("code").replicas.last.transport._all)
    assert connections and all(conn.sock is not None for conn in connections)
    group.shutdown()
    group.shutdown()  # harmless when repeated
    with pytest.raises(RuntimeError, match="shut down"):
        group.get_logprobs({"input_ids": ids, "input_lengths": lengths})
    # the client's connections are its owner's, used by its other callers: a facade leaves them open
    assert all(conn.sock is not None for conn in connections)
    another = RemoteTeacherWorkerGroup.from_client(client, "math")
    again = another.get_logprobs({"input_ids": ids, "input_lengths": lengths})
    np.testing.assert_array_equal(again["reference_logprobs"].numpy(), fake_logprobs(ids, lengths))
    client.close()
    assert all(conn.sock is None for conn in connections)


def test_refusal_is_raised_at_once_naming_teacher_and_generation(two_teachers: tuple[Path, Teacher, Teacher],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path, math, _ = two_teachers
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


def test_corrupt_record_is_reported_and_heals(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token, heartbeat_s=0.5).start()
    record_path = layout.endpoint_path(MATH.name, MATH.key)
    try:
        teacher.heartbeat.stop()
        full = record_path.read_bytes()
        record_path.write_bytes(full[: len(full) // 3])
        with pytest.raises(TeacherUnavailableError, match=r"record corrupt: not valid JSON"):
            podium.connect(layout.rendezvous_path, ready_timeout_s=0.3, poll_interval_s=0.05).get_logprobs(
                "math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        # the owner's next heartbeat rewrites the record whole; a waiting client then proceeds
        from podium.rendezvous import Heartbeat

        threading.Timer(0.4, teacher.writer.heartbeat).start()
        client = podium.connect(layout.rendezvous_path, **FAST)
        out = client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        np.testing.assert_array_equal(out["logprobs"].numpy(), fake_logprobs([[1, 2]], [2]))
        client.close()
        teacher.heartbeat = Heartbeat(teacher.writer, 0.5).start()
    finally:
        teacher.stop()


def test_stale_record_is_not_used_even_if_its_url_answers(tmp_path: Path) -> None:
    """A record whose heartbeat is stale is not used though something answers at its URL (issue 20:
    the writer may be gone and the port someone else's); a fresh heartbeat makes it usable again."""
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    try:
        teacher.heartbeat.stop()
        time.sleep(0.2)
        record = read_record(layout.endpoint_path(MATH.name, MATH.key))
        assert record.is_stale(0.1)
        client = podium.connect(layout.rendezvous_path, stale_after_s=0.1, **FAST)
        with pytest.raises(TeacherUnavailableError, match="stale: no heartbeat for"):
            client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]}, timeout_s=0.5)
        assert teacher.group.calls == []
        teacher.writer.heartbeat()
        out = client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        assert out["logprobs"].shape == (1, 2)
        client.close()
    finally:
        teacher.stop()


def test_tokenizer_fingerprint_check(tmp_path: Path, tokenizers: tuple[Any, Any, Path]) -> None:
    teacher_tok, other_tok, saved = tokenizers
    fp = tokenizer_fingerprint(teacher_tok)
    assert fp.startswith("vocab-sha256:") and fp != tokenizer_fingerprint(other_tok)
    assert fingerprint_from_pretrained(saved) == (fp, len(teacher_tok))  # same from files as in memory
    assert fingerprint_from_pretrained(tmp_path) == (None, None)
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(vocab_size=64), layout, MATH, token,
                      config_overrides={"tokenizer_fingerprint": fp, "tokenizer_vocab_size": len(teacher_tok)}).start()
    try:
        client = podium.connect(layout.rendezvous_path, **FAST)
        info = client.check_tokenizer("code", teacher_tok, vocab_size=64)
        assert info["tokenizer_fingerprint"] == fp
        with pytest.raises(TokenizerMismatchError, match=r"'math' .*generation 1000:0: tokenizer fingerprint"):
            client.check_tokenizer("code", other_tok)
        with pytest.raises(TokenizerMismatchError, match="vocab size 64 != trainer's vocab size 65"):
            client.check_tokenizer("code", teacher_tok, vocab_size=65)
        client.close()
        # given at connect, the tokenizer is checked when each teacher is first reached
        with pytest.raises(TokenizerMismatchError, match="fingerprint"):
            podium.connect(layout.rendezvous_path, tokenizer=other_tok, **FAST).get_logprobs(
                "math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        ok = podium.connect(layout.rendezvous_path, tokenizer=teacher_tok, **FAST)
        assert ok.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})["logprobs"].shape == (1, 2)
        ok.close()
    finally:
        teacher.stop()


_wait = functools.partial(wait_for, timeout_s=30.0)


class BreakingGroup(FakeGroup):
    """Fails the call whose ``input_ids[0, 0]`` is 13, after the hold (a worker dies under it)."""

    def compute(self, data: Any, query: Any) -> dict:
        out = super().compute(data, query)
        if int(data.input_ids[0, 0]) == 13:
            raise RuntimeError("worker 3 died")
        return out


@pytest.fixture
def exchanges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, Any]]:
    """(url, path, status or the exception's name) of every infer exchange the client makes."""
    seen: list[tuple[str, str, Any]] = []
    request = HTTPTransport.request

    def recording(self: HTTPTransport, method: str, url_path: str, *args: Any, **kw: Any) -> Any:
        try:
            resp = request(self, method, url_path, *args, **kw)
        except Exception as exc:
            if url_path.endswith("/infer"):
                seen.append((self.url, url_path, type(exc).__name__))
            raise
        if url_path.endswith("/infer"):
            seen.append((self.url, url_path, resp.status))
        return resp

    monkeypatch.setattr(HTTPTransport, "request", recording)
    return seen


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


def test_only_a_final_failure_ends_a_call(tmp_path: Path) -> None:
    """A ``failed`` record the launcher will retry keeps the call waiting (to its deadline here);
    one marked final raises TeacherFailedError at once."""
    layout, _ = make_run(tmp_path, [MATH], default_alias="math")
    writer = RecordWriter(layout.endpoint_path(MATH.name, MATH.key), teacher_key=MATH.key, teacher_name="math",
                          generation=Generation(1000, 0))
    record = writer.publish(Status.FAILED, reason="node n2 lost", will_retry=True)
    assert not record.failure_is_final()
    with podium.connect(layout.rendezvous_path, **FAST) as client:
        with pytest.raises(TeacherUnavailableError, match=r"generation 1000:0 failed \(node n2 lost\); the teacher "
                                                          r"will retry"):
            client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]}, timeout_s=0.3)
        record = writer.publish(Status.FAILED, reason="node n2 lost again", final=True)
        assert record.failure_is_final()
        with pytest.raises(TeacherFailedError, match="generation 1000:0 failed: node n2 lost again"):
            client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
    plain = writer.publish(Status.FAILED, reason="checkpoint not found", final=False)
    assert not plain.failure_is_final()  # final: false says it outright
    assert plain.model_copy(update={"final": None}).failure_is_final()  # no word either way: final
    assert not plain.model_copy(update={"status": Status.READY}).failure_is_final()


def test_client_sockets_have_tcp_keepalive(two_teachers: tuple[Path, Teacher, Teacher]) -> None:
    import socket

    path, _, _ = two_teachers
    with podium.connect(path, keepalive_idle_s=7, keepalive_interval_s=3, keepalive_count=4, **FAST) as client:
        client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        (conn,) = client.teacher("math").replicas.last.transport._all
        sock = conn.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
