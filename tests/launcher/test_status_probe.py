"""``podium status``'s probe of a ready record: with the run's token it asks the server to prove it
is the record's generation before it sends the token, so a squatter on a dead teacher's port is
shown down and never sees the token, while the real teacher shows its load even when ``/metrics``
needs the token. Real endpoint (a stand-in group), real server proof."""

from __future__ import annotations

import json
from pathlib import Path

from harness.fake_group import FakeGroup
from harness.lifecycle import Teacher
from harness.run import TeacherDef, make_run
from harness.squatter import Squatter

from podium.launcher.login.status import _probe
from podium.rendezvous import read_record

MATH = TeacherDef("e5e5e5e5e5e5", "math", ("math",))


def test_status_shows_a_real_teacher_live_with_its_load_and_a_squatter_down_without_the_token(
        tmp_path: Path) -> None:
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(), layout, MATH, token, server_settings={"metrics_need_token": True}).start()
    port = teacher.server.port if teacher.server is not None else 0
    record = read_record(layout.endpoint_path(MATH.name, MATH.key))
    squatter: Squatter | None = None
    try:
        live, load = _probe(record, token)
        assert live and load is not None and set(load) >= {"tokens_per_s_1m", "queue_depth"}, load
        assert _probe(record, None) == (True, None)  # no token: live, but /metrics is the token's
        teacher.heartbeat.stop()
        teacher.server.stop(grace_s=1)
        squatter = Squatter(port, MATH.key)
        assert _probe(record, token) == (False, None)
        assert token not in json.dumps(squatter.headers_seen), squatter.headers_seen
        assert squatter.paths and all("proof" in path for path in squatter.paths), squatter.paths
    finally:
        if squatter is not None:
            squatter.close()
        if teacher.lifecycle is not None:
            teacher.stop()
