"""A teacher stopped for good fails a call at once, naming it and when it was stopped; a preempted one
(which comes back) is still waited for. Stand-in groups: the rule is the client's, not the model's.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from harness.fake_group import FakeGroup, fake_logprobs
from harness.lifecycle import Teacher
from harness.run import TeacherDef, make_run

import podium
from podium.client import TeacherStoppedError
from podium.rendezvous import Generation
from podium.rendezvous.records import STOPPED_BY_DOWN, RecordWriter, Status, read_record

MATH = TeacherDef("c3c3c3c3c3c3", "math", ("math",))
SLOW = {"ready_timeout_s": 600.0, "call_timeout_s": 600.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}
IDS = np.array([[5, 6, 7, 8], [9, 10, 0, 0]])
LENGTHS = np.array([4, 2])
DATA = {"input_ids": IDS, "input_lengths": LENGTHS}


@pytest.mark.parametrize("how", ["job verdict", "down's mark"])
def test_a_teacher_stopped_for_good_fails_a_call_at_once_naming_it(tmp_path: Path, how: str) -> None:
    layout, token = make_run(tmp_path, [MATH])
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    with podium.connect(layout.rendezvous_path, **SLOW) as client:
        np.testing.assert_array_equal(client.get_logprobs("math", DATA)["logprobs"],
                                      fake_logprobs(IDS, LENGTHS))
        teacher.stop()
        path = teacher.writer.path
        if how == "job verdict":  # what the job's head publishes when `podium down` stops it
            RecordWriter.resume(path, read_record(path)).publish(Status.STOPPED, reason="stop requested",
                                                                 will_retry=False, final=False)
        else:  # what `podium down` writes where the job could not
            RecordWriter.resume(path, read_record(path)).publish(Status.STOPPED, reason=STOPPED_BY_DOWN)
        started = time.monotonic()
        with pytest.raises(TeacherStoppedError) as err:
            client.get_logprobs("math", DATA)
        assert time.monotonic() - started < 30  # not call_timeout_s (600 s here)
    text = str(err.value)
    assert text.startswith("teacher 'math'"), text
    assert "was stopped at" in text and "podium up" in text, text
    assert err.value.stopped_at == pytest.approx(read_record(path).stopped_at())


def test_a_preempted_teacher_is_still_waited_for(tmp_path: Path) -> None:
    layout, token = make_run(tmp_path, [MATH])
    teacher = Teacher(FakeGroup(), layout, MATH, token).start()
    teacher.stop()
    path = teacher.writer.path
    RecordWriter.resume(path, read_record(path)).publish(Status.STOPPED, reason="preempted", will_retry=True,
                                                         final=False)
    with podium.connect(layout.rendezvous_path, **SLOW) as client:
        answers: list[np.ndarray] = []
        call = threading.Thread(target=lambda: answers.append(client.get_logprobs("math", DATA)["logprobs"]))
        call.start()
        time.sleep(1.0)
        assert call.is_alive() and not answers  # waiting for the next generation
        back = Teacher(FakeGroup(), layout, MATH, token, generation=Generation(teacher.generation.job_id, 1)).start()
        call.join(60)
        back.stop()
    assert answers and np.array_equal(answers[0], fake_logprobs(IDS, LENGTHS))
