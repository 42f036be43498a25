"""podium's client transport against real endpoints: whom it sends the token to, and its sockets.

- a plain ``http.server`` squatting on a dead teacher's port (its record still fresh and ready) gets
  no token and none of its answers is used; the next generation is followed;
- the client's sockets have TCP keepalive on, as configured.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from harness.fake_group import FakeGroup, fake_logprobs
from harness.lifecycle import Teacher
from harness.run import TeacherDef, make_run
from harness.squatter import Squatter

import podium
from podium.client import TeacherUnavailableError
from podium.rendezvous import Generation, read_record

MATH = TeacherDef("d4d4d4d4d4d4", "math", ("math",))
FAST = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2, "refresh_s": 0.2,
        "return_type": "numpy"}
DATA = {"input_ids": [[5, 9, 2]], "input_lengths": [3]}


@pytest.fixture
def math_teacher(tmp_path: Path) -> Iterator[tuple[Path, Teacher]]:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    yield layout.rendezvous_path, teacher
    teacher.stop()


def test_a_squatter_on_a_dead_teachers_port_gets_no_token_and_is_not_believed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    port = teacher.server.port
    # the teacher dies without a word: its record still says ready, heartbeat fresh (not stale yet)
    teacher.heartbeat.stop()
    teacher.server.stop(grace_s=1)
    squatter = Squatter(port, MATH.key)
    successor: Teacher | None = None
    client = podium.connect(layout.rendezvous_path, **FAST)
    try:
        record = read_record(layout.endpoint_path(MATH.name, MATH.key))
        assert record.url == teacher.url and not record.is_stale()
        with caplog.at_level(logging.WARNING, logger="podium.client"), \
                pytest.raises(TeacherUnavailableError) as info:
            client.get_logprobs("math", DATA, timeout_s=1.0)
        assert not any("Authorization" in headers or "authorization" in headers
                       for headers in squatter.headers_seen), squatter.headers_seen
        assert token not in json.dumps(squatter.headers_seen)
        assert not any(path.endswith("/infer") for path in squatter.paths), squatter.paths
        assert "did not prove it is generation 1000:0" in str(info.value)
        assert any(teacher.url in r.getMessage() and "no token sent" in r.getMessage() for r in caplog.records)
        # the next generation (another port, its record replacing the dead one's) is followed
        successor = Teacher(FakeGroup(), layout, MATH, token, generation=Generation(1000, 1),
                            port_range=(port + 1, port + 100)).start()
        out = client.get_logprobs("math", DATA, timeout_s=30)
        np.testing.assert_array_equal(out["logprobs"], fake_logprobs(np.array(DATA["input_ids"]),
                                                                     np.array(DATA["input_lengths"])))
        assert successor.group.calls == [5]
    finally:
        client.close()
        squatter.close()
        if successor is not None:
            successor.stop()


def test_client_sockets_have_tcp_keepalive(math_teacher: tuple[Path, Teacher]) -> None:
    path, _ = math_teacher
    with podium.connect(path, keepalive_idle_s=7, keepalive_interval_s=3, keepalive_count=4, **FAST) as client:
        client.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        (conn,) = client.teacher("math").replicas.last.transport._all
        sock = conn.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 3
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
