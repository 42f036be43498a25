"""``podium front`` in front of the real Megatron teacher (the session's tiny Llama group, CPU/gloo),
called as trainers call it through one fixed URL: the real ``openai`` client's ``completions.create``
with ``prompt_logprobs`` (verl, TRL) and plain HTTP SGLang ``/generate`` (slime, miles), every answer
against the HF ``transformers`` fp32 oracle, while the run changes under the front:

(a) a requeue: the teacher's next generation comes up on another port and its record replaces this
one's; (b) ``podium scale``: a second replica is listed, and both get calls; (c) ``podium down``:
the record says stopped, and every call fails at once naming the teacher and when it stopped.
0 failed and 0 wrong calls before the stop.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
from harness.call_loops import CallLoops
from harness.lifecycle import Teacher
from harness.poll import wait_for
from harness.run import TeacherDef, make_run
from harness.scoring_oracle import check_generate, check_prompt_logprobs, oracle

from podium.front.serve import FrontThread
from podium.protocol.names import OPENAI_BASE
from podium.rendezvous import Generation, RecordWriter, Status, read_record, read_rendezvous, write_rendezvous
from podium.rendezvous.records import STOPPED_BY_DOWN

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

LLAMA2 = TeacherDef("11a11a11a11a", "llama", ("llama", "math"), replicas=2)
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [12, 250, 33, 90]]
K = 2
FAST = {"ready_timeout_s": 300.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2, "refresh_s": 0.2}

until = functools.partial(wait_for, timeout_s=300.0)


@pytest.fixture
def run(tmp_path: Path, llama_group: Any) -> Iterator[tuple[Path, str, list[Teacher]]]:
    layout, token = make_run(tmp_path, [LLAMA2])
    full = read_rendezvous(layout.rendezvous_path)
    write_rendezvous(layout, full.with_replicas(LLAMA2.key, full.teachers[LLAMA2.key].replicas[:1]))
    started = [Teacher(llama_group, layout, LLAMA2, token, generation=Generation(5000, 0),
                       server_settings={"max_top_k": 8}).start()]
    yield layout.rendezvous_path, token, started
    for teacher in started:
        teacher.stop()


def served(teacher: Teacher) -> int:
    """Requests the replica's endpoint answered."""
    assert teacher.server is not None
    return teacher.server.server._served


def pinned_trainers(base: str, token: str, expected: list[Any]) -> CallLoops:
    """Two callers through the front's fixed URL: the ``openai`` client and plain HTTP ``/generate``,
    each answer checked against the oracle (a wrong one is an error)."""

    def via_openai() -> None:
        client = openai.OpenAI(base_url=base + OPENAI_BASE, api_key=token, max_retries=0, timeout=600)
        out = client.completions.create(model="math", prompt=PROMPTS, max_tokens=1, extra_body={"prompt_logprobs": K})
        for choice, row, exp in zip(out.choices, PROMPTS, expected, strict=True):
            check_prompt_logprobs(choice.model_extra["prompt_logprobs"], exp, row, K)

    def via_generate() -> None:
        body = {"input_ids": PROMPTS[0], "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": K,
                "sampling_params": {"max_new_tokens": 0}}
        answer = requests.post(f"{base}/generate", json=body, timeout=600, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.text
        check_generate(answer.json(), expected[0], PROMPTS[0], K)

    return CallLoops([via_openai, via_generate], join_s=600)


def test_one_url_follows_a_requeue_a_new_replica_and_fails_at_once_after_down(
        run, llama_group: Any, tiny_llama_checkpoint: Path) -> None:
    path, token, started = run
    layout = started[0].layout
    expected = oracle(tiny_llama_checkpoint, PROMPTS, 1.0)
    with FrontThread(path, **FAST) as front:
        base = f"{front.url}/math"
        with pinned_trainers(base, token, expected) as trainers:
            until(lambda: trainers.answers >= 4, what="answers through the front")
            successor = started[0].successor()  # (a) the next generation, on another port
            started[0].adopt(successor)
            done = trainers.answers
            until(lambda: trainers.answers >= done + 4, what="answers from the next generation")
            second = Teacher(llama_group, layout, LLAMA2, token, generation=Generation(5100, 0), replica=1,
                             server_settings={"max_top_k": 8}).start()  # (b) podium scale: a second replica
            started.append(second)
            listed = read_rendezvous(path)
            write_rendezvous(layout, listed.with_replicas(
                LLAMA2.key, (*listed.teachers[LLAMA2.key].replicas, layout.endpoint_relpath("llama", LLAMA2.key, 1))))
            before = [served(t) for t in started]
            until(lambda: all(served(t) >= n + 3 for t, n in zip(started, before, strict=True)),
                  what="calls answered by both replicas")
        assert trainers.errors == [], trainers.errors[:3]
        for teacher in started:  # (c) podium down
            teacher.stop()
            record = teacher.writer.path
            RecordWriter.resume(record, read_record(record)).publish(Status.STOPPED, reason=STOPPED_BY_DOWN)
        body = {"input_ids": PROMPTS[0], "return_logprob": True, "sampling_params": {"max_new_tokens": 0}}
        gone = requests.post(f"{base}/generate", json=body, timeout=120, headers={"Authorization": f"Bearer {token}"})
        assert gone.status_code == 410, gone.text
        message = gone.json()["error"]["message"]
        assert "'llama'" in message and "was stopped at" in message, message
    started.clear()
