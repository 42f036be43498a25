"""Many callers, one real teacher: the scheduler batches their rows into shared group calls.

The real Megatron group (fp32, CPU/gloo, the package's shared tiny Llama) behind the endpoint, with
a small token budget so that requests are split across micro-batches and calls:

- every request's answer is bit-identical whether it was computed alone or batched with other
  callers' rows, over several interleavings, and equal to the oracle;
- the calls really were shared (fewer group calls than requests) and stayed within the budget;
- ``/metrics`` parses with Prometheus' own parser and its counters add up to what was sent.

The fairness, splitting and ordering rules themselves are tested as logic in
``tests/teacher/test_batching.py`` and against the endpoint with a stand-in group in
``test_endpoint_queue.py``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from fixtures.checkpoints import hf_oracle_logprobs
from harness.lifecycle import Teacher
from harness.run import LLAMA, make_run
from prometheus_client.parser import text_string_to_metric_families

from podium.teacher.compute.microbatch import bucket_length
from podium.teacher.endpoint.metrics import summary

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

BUDGET = 96  # tokens per micro-batch: long rows run alone, short ones share
ATOL = 5e-5


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, llama_group: Any) -> Iterator[Teacher]:
    saved = llama_group.facts
    llama_group.facts = dataclasses.replace(saved, max_tokens_per_microbatch=BUDGET)  # for this module only
    layout, token = make_run(tmp_path_factory.mktemp("batching"), [LLAMA])
    served = Teacher(llama_group, layout, LLAMA, token, server_settings={"max_queue_delay_ms": 20.0}).start()
    try:
        yield served
    finally:
        served.stop()
        llama_group.facts = saved


def _requests(seed: int, n: int) -> list[dict[str, Any]]:
    """Ragged requests like rollouts: many short rows, a few long ones (up to 60 tokens)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        lengths = [min(60, max(2, int(rng.paretovariate(1.2) * 4))) for _ in range(rng.randint(1, 4))]
        width = max(lengths) + rng.randint(0, 3)
        ids = np.zeros((len(lengths), width), dtype=np.int64)
        for r, length in enumerate(lengths):
            ids[r, :length] = [rng.randrange(1, 256) for _ in range(length)]
        out.append({"id": f"q{k}", "ids": ids, "lengths": np.array(lengths, dtype=np.int64),
                    "top_k": 3 if k % 3 == 0 else None})
    return out


def _infer(teacher: Teacher, req: dict[str, Any], caller: str) -> dict[str, np.ndarray]:
    ids, lengths = req["ids"], req["lengths"]
    body: dict[str, Any] = {"id": req["id"], "inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": list(ids.shape), "data": ids.ravel().tolist()},
        {"name": "input_lengths", "datatype": "INT64", "shape": [len(lengths)], "data": lengths.tolist()},
    ]}
    if req["top_k"]:
        body["parameters"] = {"top_k": req["top_k"]}
    resp = requests.post(f"{teacher.url}/v2/models/llama/infer", data=json.dumps(body), timeout=300,
                         headers={"Authorization": f"Bearer {teacher.token}", "X-Podium-Caller": caller})
    assert resp.status_code == 200, resp.text
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in resp.json()["outputs"]}


def _metrics(teacher: Teacher) -> dict[str, float]:
    text = requests.get(f"{teacher.url}/metrics", timeout=60).text  # no auth, as scrapers expect
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "teacher")
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            values[key] = values.get(key, 0.0) + sample.value
    return values


def test_answers_are_bit_identical_batched_or_alone_and_metrics_add_up(teacher: Teacher,
                                                                       tiny_llama_checkpoint: Path) -> None:
    reqs = _requests(seed=5, n=18)
    before = _metrics(teacher)
    alone = [_infer(teacher, r, "solo") for r in reqs]  # one at a time: nothing to batch with
    for r, answer in zip(reqs[:6], alone[:6], strict=True):
        expected = hf_oracle_logprobs(tiny_llama_checkpoint, r["ids"], r["lengths"]).numpy()
        np.testing.assert_allclose(answer["logprobs"], expected, atol=ATOL)
    endpoint = teacher.server.server
    calls_before = endpoint._batcher.batches
    rounds = 3
    for round_ in range(rounds):
        order = list(range(len(reqs)))
        random.Random(round_).shuffle(order)
        got: dict[int, dict[str, np.ndarray]] = {}
        errors: list[str] = []
        callers = 6

        def caller(c: int, order: list[int] = order, got: dict[int, dict[str, np.ndarray]] = got,
                   errors: list[str] = errors, callers: int = callers) -> None:  # bound: this round's
            try:
                for i in order[c::callers]:
                    got[i] = _infer(teacher, reqs[i], f"caller-{c}")
            except Exception as exc:  # reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert not errors, errors
        for i, answer in got.items():
            assert answer.keys() == alone[i].keys()
            for name in answer:
                assert np.array_equal(answer[name], alone[i][name]), (round_, reqs[i]["id"], name)
    calls = endpoint._batcher.batches - calls_before
    assert calls < rounds * len(reqs), "no call was shared: nothing was batched"
    last = teacher.group.last_batch
    assert last is not None and last.computed_tokens >= last.tokens

    after = _metrics(teacher)
    sent = (1 + rounds) * len(reqs)
    rows = (1 + rounds) * sum(len(r["lengths"]) for r in reqs)
    tokens = (1 + rounds) * sum(int(r["lengths"].sum()) for r in reqs)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    assert delta["podium_requests_total{status=200}"] == sent
    assert delta["podium_rows_total"] == rows and delta["podium_tokens_total"] == tokens
    assert delta["podium_call_tokens_sum"] == tokens  # every real token went through a call once
    computed = delta["podium_computed_tokens_total"]
    bucketed = (1 + rounds) * sum(bucket_length(n) for r in reqs for n in r["lengths"])
    assert computed == bucketed  # a row costs its bucket length, whoever it shares a call with
    assert delta["podium_group_calls_total"] == calls + len(reqs)
    assert after["podium_queue_depth"] == 0 and after["podium_generation_info{job_id=1000,restart=0}"] == 1
    figures = summary(requests.get(f"{teacher.url}/metrics", timeout=60).text)
    assert 0 < figures["padding_share"] < 0.5 and figures["tokens_per_s_1m"] > 0
