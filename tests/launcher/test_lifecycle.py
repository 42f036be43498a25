"""The launcher's lifecycle around a served group, the one publisher of the endpoint record: ready
with the tokenizer's fingerprint, heartbeats, a stop request for this job (not an older one), the
drain, and how the generation ended; a teacher nobody calls stops after ``server.idle_stop_s``."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness.fake_group import FakeGroup, fake_logprobs
from harness.poll import wait_for
from harness.run import TeacherDef, make_run

import podium
from podium.client import tokenizer_fingerprint
from podium.config.launcher import TeacherLauncherSettings
from podium.config.spec import TeacherSpec
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.restarts import Decision, RestartLedger
from podium.launcher.common.stop_request import request_stop
from podium.launcher.job.lifecycle import IdleWatch, TeacherLifecycle
from podium.launcher.job.signals import Signals
from podium.rendezvous import Generation, Status, read_record

MATH = TeacherDef("a1a1a1a1a1a1", "math", ("math", "code"))
FAST = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}
_wait = functools.partial(wait_for, timeout_s=30.0)
SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                   num_nodes=1, gpus_per_node=1)


def test_lifecycle_publishes_ready_heartbeats_drains_and_says_stopped(tmp_path: Path,
                                                                      tokenizers: tuple[Any, Any, Path]) -> None:
    """The launcher's lifecycle around a served group: the one publisher of the endpoint record."""
    teacher_tok, _, saved = tokenizers
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    server = {"heartbeat_s": 0.1, "stale_after_s": 5, "port_range": [23000, 23999]}
    spec = TeacherSpec(key=MATH.key, name=MATH.name, aliases=MATH.aliases, model_name=str(saved), num_nodes=1,
                       gpus_per_node=1, launcher=TeacherLauncherSettings.model_validate({"server": server}))
    files = TeacherFiles.of(layout.run_dir, spec.name, spec.key)
    signals = Signals()
    lifecycle = TeacherLifecycle(spec, files, Generation(77, 2), signals)
    lifecycle.publish(Status.LOADING)
    group = FakeGroup(vocab_size=64, checkpoint_path=str(saved))  # the lifecycle finds its tokenizer there
    urls: list[str] = []
    thread = threading.Thread(target=lifecycle.serve, args=(group,),
                              kwargs=dict(host="127.0.0.1", token=token, on_ready=urls.append))
    thread.start()
    try:
        _wait(lambda: urls)
        record = read_record(files.endpoint)
        assert record.status is Status.READY and record.url == urls[0] and record.generation == Generation(77, 2)
        assert record.model.tokenizer_fingerprint == tokenizer_fingerprint(teacher_tok)
        assert record.stale_after_s == 5 and {"loading", "ready"} <= set(record.timings)
        with podium.connect(layout.rendezvous_path, tokenizer=teacher_tok, **FAST) as client:
            out = client.get_logprobs("math", {"input_ids": [[1, 2, 3]], "input_lengths": [3]})
            np.testing.assert_array_equal(out["logprobs"].numpy(), fake_logprobs([[1, 2, 3]], [3]))
        beat = record.heartbeat_at
        _wait(lambda: read_record(files.endpoint).heartbeat_at > beat)
        # A stop request left for another (older) job does not stop this one; one for this job does.
        request_stop(files, "76")
        lifecycle._check_stop_file()
        assert not signals.stop.is_set()
        request_stop(files, "77")
        thread.join(30)
        assert not thread.is_alive()
    finally:
        signals.request_stop("test over")
        thread.join(30)
    assert read_record(files.endpoint).status is Status.DRAINING  # serve drained; how it ended comes next
    lifecycle.end("stopped", signals.describe(), Decision(False, False, 0.0, "stopped"), RestartLedger())
    final = read_record(files.endpoint)
    assert final.status is Status.STOPPED and "stop.request" in (final.reason or "")
    assert final.final is False and final.will_retry is False
    assert final.timings["draining"] <= final.timings["stopped"]
    assert final.stopped_for_good()  # podium down: a caller fails at once


def test_a_job_the_scheduler_requeues_is_not_stopped_for_good(tmp_path: Path) -> None:
    """``scontrol requeue``: the generation asks for no requeue (Slurm does it), yet its teacher comes
    back, and the record says so; a caller waits for the next generation instead of failing."""
    layout, _ = make_run(tmp_path, [MATH], default_alias="math")
    files = TeacherFiles.of(layout.run_dir, MATH.name, MATH.key)
    spec = SPEC.model_copy(update={"key": MATH.key})
    lifecycle = TeacherLifecycle(spec, files, Generation(28, 1), Signals())
    lifecycle.publish(Status.LOADING)
    lifecycle.end("stopped", "requeued by Slurm (SIGTERM)", Decision(False, False, 0.0, "stopped"), RestartLedger(),
                  comes_back=True)
    record = read_record(files.endpoint)
    assert record.status is Status.STOPPED and record.will_retry is True and record.final is False
    assert not record.stopped_for_good()



class _Endpoint:
    """What the lifecycle reads of the endpoint: answers given, requests queued."""

    served = 0
    queue_depth = 0

    def model_info(self) -> dict:
        return {"served_name": "math", "vocab_size": 8}


class _ServerThread:
    def __init__(self, group, config) -> None:
        self.server = _Endpoint()

    def start(self) -> str:
        return "http://127.0.0.1:1"

    def set_ready(self, ready: bool, reason: str = "") -> None:
        pass

    def drain(self) -> None:
        pass

    def stop(self, grace_s: float = 0.0) -> None:
        pass


def test_a_teacher_nobody_calls_stops_after_idle_stop_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A teacher nobody calls stops after ``server.idle_stop_s``."""
    import podium.teacher.endpoint as endpoint

    monkeypatch.setattr(endpoint, "ServerThread", _ServerThread)
    files = TeacherFiles(tmp_path / "teachers" / "math-abcdef12")
    files.folder.mkdir(parents=True)
    spec = SPEC.model_copy(update={"launcher": SPEC.launcher.model_copy(update={
        "server": SPEC.launcher.server.model_copy(update={"idle_stop_s": 1.0})})})
    signals = Signals()
    served = threading.Thread(target=TeacherLifecycle(spec, files, Generation(5, 0), signals).serve,
                              args=(FakeGroup(),), kwargs={"host": "127.0.0.1", "token": "t"})
    t0 = time.monotonic()
    served.start()
    served.join(30)
    assert not served.is_alive() and 1.0 <= time.monotonic() - t0 < 10
    intent = signals.intent()
    assert intent is not None and intent.kind == "idle" and not intent.requeue and "idle_stop_s" in intent.why


def test_calls_keep_a_teacher_from_idling() -> None:
    now = [0.0]
    watch = IdleWatch(clock=lambda: now[0])
    now[0] = 50.0
    assert watch.idle_for(served=0, queued=0) == 0.0  # the first look starts the clock
    now[0] = 90.0
    assert watch.idle_for(served=0, queued=0) == 40.0
    assert watch.idle_for(served=0, queued=1) == 0.0  # a request computing
    now[0] = 200.0
    assert watch.idle_for(served=3, queued=0) == 0.0  # answered since
    now[0] = 260.0
    assert watch.idle_for(served=3, queued=0) == 60.0
