"""One teacher served by several replicas, as podium's client sees it: in-process servers with
stand-in groups (every replica gives the same answer, as the real, deterministic teacher does).

What is asserted: concurrent calls of unmeasured replicas spread by least outstanding requests; a replica that drains,
vanishes or fails is skipped and the call goes to another without an error; one that comes back
takes its share again; a change of the rendezvous (``podium scale``) is followed; a call fails only
when every replica has failed for good; a replica whose queue is full gets no request while another
can take it. How a replica's record is read (one replica): a corrupt record is reported and heals, a
stale one is not used though its URL answers, only a final failure ends a call, a probe answer that
names no generation is not accepted. A replica whose forwards are slowed 20 times is drained and
named, and the p99 of a trainer's calls stays within twice that of two healthy replicas; a call
held at one replica is answered by the other through a hedge. The same client against real
replicas on the Slurm test cluster, one of them preempted: ``tests/integration/test_replicas_slurm.py``.
"""

from __future__ import annotations

import functools
import http.client
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness.client_loop import ClientLoop
from harness.exchanges import record_infer_exchanges
from harness.fake_group import FakeGroup, Gate, fake_logprobs
from harness.lifecycle import Teacher
from harness.poll import wait_for
from harness.run import TeacherDef, make_run

import podium
from podium.client import TeacherFailedError, TeacherUnavailableError
from podium.launcher.login.status import TeacherStatus, mark_slow_replicas
from podium.protocol.metrics_text import summary
from podium.protocol.names import METRICS
from podium.rendezvous import Generation, RecordWriter, Status, read_record, read_rendezvous, write_rendezvous

MATH = TeacherDef("c3c3c3c3c3c3", "math", ("math", "code"), replicas=2)
ONE = TeacherDef("a1a1a1a1a1a1", "math", ("math", "code"))  # one replica: its record's states
POLLING = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}
FAST = {**POLLING, "refresh_s": 0.2, "return_type": "numpy"}
DATA = {"input_ids": [[5, 9, 2, 7], [3, 1, 0, 0]], "input_lengths": [4, 2]}
EXPECTED = fake_logprobs(np.array(DATA["input_ids"]), np.array(DATA["input_lengths"]))


until = functools.partial(wait_for, timeout_s=60.0)


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Path, list[Teacher]]]:
    layout, token = make_run(tmp_path, [MATH])
    started = [Teacher(FakeGroup(), layout, MATH, token, generation=Generation(3000 + i, 0), replica=i).start()
               for i in range(2)]
    yield layout.rendezvous_path, started
    for teacher in started:
        teacher.stop()


@pytest.fixture
def exchanges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, Any]]:
    """(url, bytes of the body, status or the exception's name) of every infer exchange the client makes."""
    return record_infer_exchanges(monkeypatch)


def in_flight(teacher: Teacher) -> int:
    """Requests the replica's server holds (reading, queued or computing)."""
    return teacher.server.server.queue_depth


class Loop:
    """A caller in a thread: ``get_logprobs`` until stopped, every answer checked."""

    def __init__(self, client: podium.PodiumClient) -> None:
        self.client, self.answers, self.errors = client, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                np.testing.assert_array_equal(self.client.get_logprobs("math", DATA)["logprobs"], EXPECTED)
                self.answers += 1
            except Exception as exc:  # asserted on by the test
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> Loop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()


def test_rendezvous_lists_every_replica_and_the_first_is_the_endpoint(replicas) -> None:
    path, started = replicas
    entry = read_rendezvous(path).teachers[MATH.key]
    assert entry.endpoint == entry.replicas[0] == "teachers/math-c3c3c3c3/endpoint.json"
    assert entry.replicas[1] == "teachers/math-c3c3c3c3-r1/endpoint.json"
    assert [t.writer.record.replica for t in started] == [0, 1]


def test_concurrent_calls_go_to_the_replica_with_fewest_outstanding(replicas) -> None:
    path, started = replicas
    gates = [Gate(), Gate()]
    for teacher, gate in zip(started, gates, strict=True):
        teacher.group.hold = gate
    with podium.connect(path, **FAST) as client:
        results: list[np.ndarray] = []
        threads = [threading.Thread(target=lambda: results.append(client.get_logprobs("math", DATA)["logprobs"]))
                   for _ in range(4)]
        # one at a time into the client, each held at its server: each picks the replica with fewer in flight
        for n, thread in enumerate(threads, start=1):
            thread.start()
            until(lambda n=n: sum(in_flight(t) for t in started) == n, what=f"call {n} at a server")
        assert [in_flight(t) for t in started] == [2, 2]
        for gate in gates:
            gate.release(2)
        for thread in threads:
            thread.join(30)
        for teacher in started:
            teacher.group.hold = None
        assert len(results) == 4 and all(np.array_equal(r, EXPECTED) for r in results)
        # one caller at a time: ties are taken in turn, so both replicas stay in use
        for _ in range(4):
            client.get_logprobs("math", DATA)
        assert [len(t.group.calls) for t in started] == [4, 4]


def test_a_draining_replica_is_skipped_without_an_error_and_taken_back_when_it_returns(replicas) -> None:
    path, started = replicas
    with podium.connect(path, **FAST) as client, Loop(client) as loop:
        until(lambda: all(t.group.calls for t in started), what="calls on both replicas")
        started[0].stop()  # draining (503 to new requests), then stopped
        calls_on_b = len(started[1].group.calls)
        until(lambda: len(started[1].group.calls) > calls_on_b + 20, what="calls going to replica 1 alone")
        assert started[0].writer.record.status is Status.STOPPED
        # replica 0 comes back as its next generation: within refresh_s the client takes it back
        back = Teacher(FakeGroup(), started[0].layout, MATH, started[0].token, generation=Generation(3000, 1),
                       replica=0).start()
        started[0] = back
        until(lambda: len(back.group.calls) >= 5, what="calls on the returned replica")
    assert loop.errors == [] and loop.answers > 0


def test_a_replica_that_vanishes_mid_call_costs_a_retry_not_an_error(replicas) -> None:
    path, started = replicas
    gate = Gate(timeout_s=5.0)
    with podium.connect(path, **FAST) as client:
        client.get_logprobs("math", DATA)  # connected: both replicas known ready
        client.get_logprobs("math", DATA)
        started[0].group.hold = gate  # the next call there is held in the group ...
        result: list[np.ndarray] = []
        thread = threading.Thread(target=lambda: result.append(client.get_logprobs("math", DATA)["logprobs"]))
        thread.start()
        until(lambda: len(started[0].group.calls) == 2, what="the call held on replica 0")
        # ... and its server goes away without a word in its record (a lost node)
        started[0].server.stop(grace_s=0)
        thread.join(60)
        assert result and np.array_equal(result[0], EXPECTED)
        assert client.teacher("math").retries == 1
        assert started[0].writer.record.status is Status.READY  # its record never said otherwise
        for _ in range(3):  # it is not used again: its probe fails until its record changes
            client.get_logprobs("math", DATA)
        assert len(started[0].group.calls) == 2


def test_a_change_of_the_rendezvous_is_followed(replicas) -> None:
    path, started = replicas
    full = read_rendezvous(path)
    entry = full.teachers[MATH.key]
    write_rendezvous(started[0].layout, full.with_replicas(MATH.key, entry.replicas[:1]))
    with podium.connect(path, **FAST) as client, Loop(client) as loop:
        until(lambda: len(started[0].group.calls) >= 5, what="calls on replica 0")
        assert started[1].group.calls == []
        write_rendezvous(started[0].layout, full)  # scaled up: replica 1 is listed
        until(lambda: len(started[1].group.calls) >= 5, what="calls on the newly listed replica 1")
        write_rendezvous(started[0].layout, full.with_replicas(MATH.key, entry.replicas[1:]))  # replica 0 removed
        assert client.teacher("math").replicas.paths  # (the client re-reads within refresh_s)
        until(lambda: client.teacher("math").replicas.paths == [path.parent / entry.replicas[1]],
              what="the client to read the new rendezvous")
        seen = len(started[0].group.calls)
        until(lambda: len(started[1].group.calls) >= 20, what="more calls on replica 1")
        assert len(started[0].group.calls) <= seen + 1  # at most the call in flight as the list changed
    assert loop.errors == []


def test_a_call_fails_only_when_every_replica_failed_for_good(replicas) -> None:
    path, started = replicas
    started[0].writer.publish(Status.FAILED, reason="out of memory", final=True)
    started[0].server.stop(grace_s=0)
    with podium.connect(path, **FAST) as client:
        for _ in range(3):  # replica 1 serves; replica 0's failure is not the call's
            np.testing.assert_array_equal(client.get_logprobs("math", DATA)["logprobs"], EXPECTED)
        started[1].writer.publish(Status.FAILED, reason="node n3 lost", final=True)
        started[1].server.stop(grace_s=0)
        with pytest.raises(TeacherFailedError, match=r"replica 1 generation 3001:0 failed: node n3 lost "
                                                     r"\(every one of its 2 replicas failed for good\)"):
            client.get_logprobs("math", DATA, timeout_s=30)


def still_open(conn: socket.socket) -> bool:
    """The peer has not closed this connection (what it sent is read and dropped)."""
    conn.setblocking(False)
    try:
        while conn.recv(65536):
            pass
        return False  # b"": closed by the peer
    except BlockingIOError:
        return True


def test_a_replica_that_hangs_its_probe_delays_no_call(replicas) -> None:
    """Replica 1's record says ready, but what listens at its URL takes connections and never
    answers (a suspended process): calls go on to replica 0 while its probe hangs aside."""
    path, started = replicas
    hung, held = socket.create_server(("127.0.0.1", 0)), []
    accepted = threading.Event()

    def hold() -> None:
        while True:
            try:
                conn, _ = hung.accept()
            except OSError:
                return
            held.append(conn)
            accepted.set()

    threading.Thread(target=hold, daemon=True).start()
    started[1].server.stop(grace_s=0)
    started[1].writer.publish(Status.READY, url=f"http://127.0.0.1:{hung.getsockname()[1]}")
    try:
        with podium.connect(path, **{**FAST, "connect_timeout_s": 30.0}) as client:
            client.get_logprobs("math", DATA)
            assert accepted.wait(30), "replica 1 was never probed"
            on_zero = len(started[0].group.calls)
            for _ in range(5):  # while the probe of replica 1 hangs (it is given 30 s)
                np.testing.assert_array_equal(client.get_logprobs("math", DATA)["logprobs"], EXPECTED)
            assert len(started[0].group.calls) == on_zero + 5
            assert still_open(held[0]), "the probe of replica 1 gave up before the calls were answered"
    finally:
        hung.close()
        for conn in held:
            conn.close()


def test_corrupt_record_is_reported_and_heals(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layout, token = make_run(tmp_path, [ONE], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, ONE, token, heartbeat_s=0.5).start()
    record_path = layout.endpoint_path(ONE.name, ONE.key)
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
        client = podium.connect(layout.rendezvous_path, **POLLING)
        out = client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        np.testing.assert_array_equal(out["logprobs"].numpy(), fake_logprobs([[1, 2]], [2]))
        client.close()
        teacher.heartbeat = Heartbeat(teacher.writer, 0.5).start()
    finally:
        teacher.stop()


def test_stale_record_is_not_used_even_if_its_url_answers(tmp_path: Path) -> None:
    """A record whose heartbeat is stale is not used though something answers at its URL (the
    writer may be gone and the port someone else's); a fresh heartbeat makes it usable again."""
    layout, token = make_run(tmp_path, [ONE], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, ONE, token).start()
    try:
        teacher.heartbeat.stop()
        time.sleep(0.2)
        record = read_record(layout.endpoint_path(ONE.name, ONE.key))
        assert record.is_stale(0.1)
        client = podium.connect(layout.rendezvous_path, stale_after_s=0.1, **POLLING)
        with pytest.raises(TeacherUnavailableError, match="stale: no heartbeat for"):
            client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]}, timeout_s=0.5)
        assert teacher.group.calls == []
        teacher.writer.heartbeat()
        out = client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        assert out["logprobs"].shape == (1, 2)
        client.close()
    finally:
        teacher.stop()


def test_only_a_final_failure_ends_a_call(tmp_path: Path) -> None:
    """A ``failed`` record the launcher will retry keeps the call waiting (to its deadline here);
    one marked final raises TeacherFailedError at once."""
    layout, _ = make_run(tmp_path, [ONE], default_alias="math")
    writer = RecordWriter(layout.endpoint_path(ONE.name, ONE.key), teacher_key=ONE.key, teacher_name="math",
                          generation=Generation(1000, 0))
    record = writer.publish(Status.FAILED, reason="node n2 lost", will_retry=True)
    assert not record.failure_is_final()
    with podium.connect(layout.rendezvous_path, **POLLING) as client:
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


def test_a_replica_whose_queue_is_full_is_skipped_for_another(tmp_path: Path, exchanges: list) -> None:
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
        exchanges.clear()
        for _ in range(6):
            client.get_logprobs("math", DATA, timeout_s=10)
        to_full = [status for url, _, status in exchanges if url == full.url]
        assert to_full in ([], [503]), exchanges  # told once, then left alone for its Retry-After
        assert sum(1 for url, _, status in exchanges if url == free.url and status == 200) == 6
    finally:
        gate.release(10)
        if blocker is not None:
            blocker.join(60)
        client.close()
        full.stop()
        free.stop()


HEALTHY_S, SLOW_S = 0.05, 1.0  # a stand-in forward, and the slowed replica's
CALLS = 500  # per phase: the p99 is the 5th slowest, so the few calls that meet the slow replica do not set it
# the client's: a probe of the drained replica every 30 s (a phase lasts ~30 s), hedged at 0.1 s at least
SLOW_OPTIONS = {"poll_interval_s": 0.05, "hedge_min_s": 0.1, "slow_probe_s": 30.0, "return_type": "numpy"}


def _p99(loop: ClientLoop) -> float:
    assert all(c.exception is None and c.error == 0 for c in loop.calls), [c for c in loop.calls if c.exception]
    return float(np.percentile([c.end - c.start for c in loop.calls], 99))


def _calls(path: Path, n: int) -> tuple[ClientLoop, list]:
    """A trainer's loop of ``n`` calls (at least) through a new client; what it found slow by then."""
    loop = ClientLoop(path.parent, "math", DATA, EXPECTED, **SLOW_OPTIONS).start()
    until(lambda: len(loop.calls) >= n, what=f"{n} calls", timeout_s=300)
    slow = loop.teacher.slow_replicas
    loop.stop()
    return loop, slow


def test_a_slowed_replica_is_drained_and_named_and_p99_stays_within_twice_two_healthy_ones(replicas) -> None:
    path, started = replicas
    for teacher in started:
        teacher.group.delay_s = HEALTHY_S
    healthy, none_slow = _calls(path, CALLS)
    assert none_slow == []
    started[1].group.delay_s = SLOW_S  # its every forward takes 20 times as long
    before = len(started[1].group.calls)
    slowed, slow = _calls(path, CALLS)
    p99_healthy, p99_slowed = _p99(healthy), _p99(slowed)
    print(f"p99 of {CALLS} calls: two healthy replicas {p99_healthy:.3f}s, one slowed {p99_slowed:.3f}s; "
          f"{slowed.teacher.hedges} hedged")
    assert [s.replica for s in slow] == [1] and slow[0].url == started[1].writer.record.url
    assert slow[0].others_s is not None and slow[0].latency_s > 4 * slow[0].others_s
    assert len(started[1].group.calls) - before < 10  # the first calls that measured it, and a probe
    assert p99_slowed <= 2 * p99_healthy, f"p99 {p99_slowed:.3f}s with a slowed replica, {p99_healthy:.3f}s without"
    # `podium status` names it too, from each replica's /metrics, by the client's rule
    rows = [TeacherStatus(name="math", key=MATH.key, aliases=("math",), replica=i, status="ready",
                          load=_metrics(teacher)) for i, teacher in enumerate(started)]
    mark_slow_replicas(rows)
    assert [r.replica for r in rows if r.slow] == [1], [r.load for r in rows]
    print(rows[1].slow)


def _metrics(teacher: Teacher) -> dict[str, float]:
    """The figures ``podium status`` reads of a replica's /metrics."""
    url = teacher.writer.record.url
    assert url is not None
    with urllib.request.urlopen(url + METRICS, timeout=10) as answer:
        return summary(answer.read().decode())


def test_a_call_held_at_one_replica_is_answered_by_the_other_through_a_hedge(replicas) -> None:
    path, started = replicas
    with podium.connect(path, **FAST, hedge_min_s=0.2, hedge_fraction=1.0) as client:
        for _ in range(4):
            client.get_logprobs("math", DATA)  # both replicas measured, hedges earned
        teacher = client.teacher("math")
        gate = Gate()
        started[0].group.hold = gate  # a call there is held in the group: unanswered until released
        try:
            for _ in range(10):  # calls go in turn: one reaches replica 0 and is held, then sent to replica 1
                np.testing.assert_array_equal(client.get_logprobs("math", DATA)["logprobs"], EXPECTED)
                if teacher.hedges:
                    break
            assert teacher.hedges == 1 and teacher.retries == 0
        finally:
            gate.release(10)
            started[0].group.hold = None
