"""``podium front`` in front of stand-in teachers (numpy groups behind real podium endpoints and
lifecycles, records in a real run dir): one fixed URL per alias through a generation change, a
replica added, the teacher stopped; auth as the teachers take it; bad input. The same front in
front of the real Megatron teacher: ``test_front_real.py``; on the Slurm cluster, beside the
client through a replica's preemption, ``podium scale`` and ``podium down``:
``tests/integration/test_replicas_slurm.py``.
"""

from __future__ import annotations

import base64
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from harness.call_loops import CallLoops
from harness.fake_group import FakeGroup, fake_logprobs
from harness.infer_requests import binary_body, infer_body
from harness.lifecycle import Teacher
from harness.poll import wait_for
from harness.run import TeacherDef, make_run

from podium.front.serve import FrontError, FrontThread
from podium.protocol import oip
from podium.rendezvous import (
    Generation,
    RecordWriter,
    RunLayout,
    Status,
    read_record,
    read_rendezvous,
    write_rendezvous,
)
from podium.rendezvous.fronts import FrontRecord, read_fronts
from podium.rendezvous.records import STOPPED_BY_DOWN

ROOT = Path(__file__).resolve().parents[2]
MATH = TeacherDef("c3c3c3c3c3c3", "math", ("math", "code"), replicas=2)
FAST = {"ready_timeout_s": 120.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2, "refresh_s": 0.2}
IDS = np.array([[5, 9, 2, 7], [3, 1, 0, 0]])
LENS = np.array([4, 2])
EXPECTED = fake_logprobs(IDS, LENS)

until = functools.partial(wait_for, timeout_s=120.0)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, str, list[Teacher]]]:
    """A run whose teacher lists two replicas; only replica 0 serves (the test starts replica 1)."""
    layout, token = make_run(tmp_path, [MATH])
    full = read_rendezvous(layout.rendezvous_path)
    entry = full.teachers[MATH.key]
    write_rendezvous(layout, full.with_replicas(MATH.key, entry.replicas[:1]))
    started = [Teacher(FakeGroup(), layout, MATH, token, generation=Generation(4000, 0)).start()]
    yield layout.rendezvous_path, token, started
    for teacher in started:
        teacher.stop()


def infer(url: str, token: str, *, binary: bool = True) -> requests.Response:
    if binary:
        body, header_len = binary_body(IDS, LENS)
        headers = {"Content-Type": oip.BINARY_CONTENT_TYPE, oip.HEADER_LENGTH: str(header_len)}
    else:
        body, headers = infer_body(IDS, LENS), {"Content-Type": oip.JSON_CONTENT_TYPE}
    return requests.post(f"{url}/v2/models/math/infer", data=body, timeout=120,
                         headers={**headers, "Authorization": f"Bearer {token}"})


def logprobs_of(resp: requests.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    length = resp.headers.get(oip.HEADER_LENGTH)
    decoded = oip.decode_response(resp.content, int(length) if length else None)
    return np.asarray(decoded.outputs["logprobs"]).reshape(IDS.shape)


def binary_callers(url: str, token: str, n: int = 4) -> CallLoops:
    """``n`` callers in threads, each posting binary infer requests through the front until stopped."""
    return CallLoops([lambda: np.testing.assert_array_equal(logprobs_of(infer(url, token)), EXPECTED)] * n,
                     join_s=120)


def test_one_url_answers_as_the_teacher_does_binary_and_json(run) -> None:
    path, token, _ = run
    with FrontThread(path, **FAST) as front:
        base = f"{front.url}/math"
        np.testing.assert_array_equal(logprobs_of(infer(base, token)), EXPECTED)
        np.testing.assert_array_equal(logprobs_of(infer(base, token, binary=False)), EXPECTED)
        np.testing.assert_array_equal(logprobs_of(infer(f"{front.url}/code", token)), EXPECTED)
        health = requests.get(f"{base}/health", timeout=30)  # open
        assert health.status_code == 200, health.text
        assert requests.get(f"{front.url}/health", timeout=30).status_code == 200
        models = requests.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert [m["id"] for m in models.json()["data"]] == ["math"], models.text
        root = requests.get(f"{front.url}/v1/models", headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert sorted(m["id"] for m in root.json()["data"]) == ["code", "math"]
        fronts = read_fronts(front.front.layout)
        assert [f.url for f in fronts] == [front.url] and fronts[0].aliases["math"] == base
    assert read_fronts(front.front.layout) == []  # its file goes when it stops


def test_the_token_as_the_teachers_take_it(run) -> None:
    path, token, started = run
    body = {"input_ids": [5, 9, 2, 7], "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0}}
    with FrontThread(path, **FAST) as front:
        none = requests.post(f"{front.url}/math/generate", json=body, timeout=60)
        assert none.status_code == 401 and "Authorization" in none.json()["error"]["message"]
        wrong = requests.post(f"{front.url}/math/generate", json=body, timeout=60,
                              headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        basic = base64.b64encode(f"podium:{token}".encode()).decode()
        for url, headers in ((f"{front.url}/math/generate", {"Authorization": f"Basic {basic}"}),
                             (f"{front.url}/math/token/{token}/generate", {}),
                             (f"{front.url}/token/{token}/math/generate", {})):
            answer = requests.post(url, json=body, headers=headers, timeout=60)
            assert answer.status_code == 200, (url.replace(token, "<token>"), answer.text)
            own = [entry[0] for entry in answer.json()["meta_info"]["input_token_logprobs"]]
            np.testing.assert_allclose(own[1:], EXPECTED[0, 1:], atol=1e-6)
        unknown = requests.post(f"{front.url}/physics/generate", json=body, timeout=60,
                                headers={"Authorization": f"Bearer {token}"})
        assert unknown.status_code == 404 and "['code', 'math']" in unknown.json()["error"]["message"]
        bad = requests.post(f"{front.url}/math/generate", json={**body, "stream": True}, timeout=60,
                            headers={"Authorization": f"Bearer {token}"})
        assert bad.status_code == 400 and "stream" in bad.text  # the teacher's own refusal, as it wrote it
        completion = {"model": "code", "prompt": [[5, 9, 2, 7]], "max_tokens": 1, "prompt_logprobs": 1}
        routed = requests.post(f"{front.url}/v1/completions", json=completion, timeout=60,
                               headers={"Authorization": f"Bearer {token}"})
        direct = requests.post(f"{started[0].url}/v1/completions", json=completion, timeout=60,
                               headers={"Authorization": f"Bearer {token}"})
        assert (routed.status_code, routed.json()["error"]) == (direct.status_code, direct.json()["error"])


def test_calls_follow_a_new_generation_and_spread_over_an_added_replica(run) -> None:
    path, token, started = run
    layout = started[0].layout
    with FrontThread(path, **FAST) as front, binary_callers(f"{front.url}/math", token) as callers:
        until(lambda: callers.answers >= 10, what="answers through the front")
        successor = started[0].successor()  # a requeue: the record names another port and generation
        started[0].adopt(successor)
        seen = len(successor.group.calls)
        until(lambda: len(successor.group.calls) >= seen + 10, what="calls on the new generation")
        second = Teacher(FakeGroup(), layout, MATH, token, generation=Generation(4100, 0), replica=1).start()
        started.append(second)
        listed = read_rendezvous(path)
        added = (*listed.teachers[MATH.key].replicas, layout.endpoint_relpath("math", MATH.key, 1))
        write_rendezvous(layout, listed.with_replicas(MATH.key, added))  # podium scale: a second replica
        until(lambda: len(second.group.calls) >= 10, what="calls on the added replica")
        before = len(successor.group.calls)
        until(lambda: len(successor.group.calls) >= before + 5, what="calls on both replicas")
    assert callers.errors == []


def test_a_call_is_held_through_a_restart_and_fails_at_once_after_down(run) -> None:
    path, token, started = run
    with FrontThread(path, **FAST) as front:
        base = f"{front.url}/math"
        np.testing.assert_array_equal(logprobs_of(infer(base, token)), EXPECTED)
        started[0].stop()  # preempted: it comes back
        record = started[0].writer.path
        RecordWriter.resume(record, read_record(record)).publish(Status.STOPPED, reason="preempted", will_retry=True,
                                                                 final=False)
        outcome: dict[str, Any] = {}
        held = threading.Thread(target=lambda: outcome.update(resp=infer(base, token)), daemon=True)
        held.start()
        assert requests.get(f"{base}/health", timeout=30).status_code == 503
        started[0].adopt(started[0].restart())
        held.join(120)
        np.testing.assert_array_equal(logprobs_of(outcome["resp"]), EXPECTED)
        started[0].stop()
        RecordWriter.resume(record, read_record(record)).publish(Status.STOPPED, reason=STOPPED_BY_DOWN)
        gone = infer(base, token)
        assert gone.status_code == 410, gone.text
        text = gone.json()["error"]
        assert "'math'" in text and "was stopped at" in text, text
        assert requests.get(f"{base}/health", timeout=30).status_code == 503


def test_bad_input_is_refused_plainly(tmp_path: Path, run) -> None:
    path, _, _ = run
    with pytest.raises(FrontError, match="no podium run here"):
        FrontThread(tmp_path / "nothing")
    with pytest.raises(FrontError, match="loopback"):
        FrontThread(path, host="0.0.0.0", auth=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        front = FrontThread(path, port=port)
        with pytest.raises(FrontError, match=f"cannot listen on 127.0.0.1:{port}"):
            front.start()


TRAIN = """
import os, sys, requests
assert os.environ["PODIUM_FRONT_URL_MATH"] == os.environ["PODIUM_FRONT_URL"] + "/math"
assert os.environ["PODIUM_FRONT_URL_CODE"] == os.environ["PODIUM_FRONT_URL"] + "/code"
print("health", requests.get(os.environ["PODIUM_FRONT_URL_MATH"] + "/health", timeout=60).status_code)
sys.exit(3)
"""


def podium_front(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "podium.cli", "front", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_exec_runs_the_command_with_the_urls_and_returns_its_code(run) -> None:
    path, _, _ = run
    proc = podium_front(str(path.parent), "--listen", "127.0.0.1:0", "--exec", "--", sys.executable, "-c", TRAIN)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 3, out
    assert "health 200" in out and "podium front: math: http://127.0.0.1:" in out, out
    assert read_fronts(RunLayout(path.parent)) == []


def test_sigterm_stops_the_front_and_status_shows_it_while_it_runs(run) -> None:
    path, _, _ = run
    layout = RunLayout(path.parent)
    proc = podium_front(str(path.parent))
    try:
        until(lambda: read_fronts(layout) != [], what="the front's file")
        status = subprocess.run([sys.executable, "-m", "podium.cli", "status", str(path.parent)], capture_output=True,
                                text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
        front = read_fronts(layout)[0]
        assert isinstance(front, FrontRecord)
        assert f"front: {front.url} pid {proc.pid}" in status.stdout and "(running)" in status.stdout, status.stdout
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert read_fronts(layout) == []
