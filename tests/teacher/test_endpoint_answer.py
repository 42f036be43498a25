"""What reaches the group and what comes back (:mod:`podium.teacher.endpoint.answer`): ids past a
row's length reach the group as 0, whatever they were; columns past the teacher's limit are cut at
the longest row and come back as zeros; a group answer of the wrong shape is a 500, never a wrong
answer.

The real endpoint, with numpy stand-in groups.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import requests
import torch
from harness.endpoint import start_server
from harness.fake_group import FakeGroup, fake_logprobs
from harness.infer_requests import infer_body

from podium.protocol.query import Query


def test_padding_values_do_not_matter() -> None:
    """Ids past a row's length (any value, even outside the vocabulary) are accepted and reach the
    group as 0; the ids before them and the lengths reach it unchanged; the answer is the group's."""
    group = FakeGroup(vocab_size=128, max_sequence_length=64)
    server = start_server(group)
    try:
        ids = np.array([[5, 6, 7, 999], [9, 10, -100, -100], [1, 2, 3, 4]])
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(ids, [3, 2, 4]),
                             headers={"Authorization": "Bearer t0ken"}, timeout=60)
        assert resp.status_code == 200, resp.text
        (got,) = group.received
        np.testing.assert_array_equal(got["input_ids"], [[5, 6, 7, 0], [9, 10, 0, 0], [1, 2, 3, 4]])
        np.testing.assert_array_equal(got["input_lengths"], [3, 2, 4])
        out = np.asarray(resp.json()["outputs"][0]["data"], dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(out, fake_logprobs(got["input_ids"], got["input_lengths"]))
    finally:
        server.stop()


class UnmaskedGroup(FakeGroup):
    """Answers every position of the cut ids, padding included (no zeros past a row's length), so
    the zeros past the longest row in the response come from padding the answer to the width."""

    def answer(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        return fake_logprobs(ids, np.full(ids.shape[0], ids.shape[1]))


def test_columns_past_the_teacher_limit_are_cut_and_come_back_as_zeros() -> None:
    """A batch wider than max_sequence_length whose rows fit: the group gets only the columns up to
    the longest row, and the answer is padded back to the request's width with zeros."""
    group = UnmaskedGroup(vocab_size=128, max_sequence_length=16)
    server = start_server(group)
    try:
        rng = np.random.default_rng(3)
        ids = rng.integers(1, 128, (2, 40))  # padding past the lengths is not zero either
        lengths = np.array([10, 4])
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body(ids, lengths, parameters={"top_k": 2}),
                             headers={"Authorization": "Bearer t0ken"}, timeout=60)
        assert resp.status_code == 200, resp.text
        (got,) = group.received
        assert got["input_ids"].shape == (2, 10)  # cut at the longest row, not at the limit
        np.testing.assert_array_equal(got["input_ids"][0], ids[0, :10])
        np.testing.assert_array_equal(got["input_ids"][1], np.r_[ids[1, :4], np.zeros(6, int)])
        outputs = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in resp.json()["outputs"]}
        assert outputs["logprobs"].shape == (2, 40) and outputs["topk_indices"].shape == (2, 40, 2)
        answered = fake_logprobs(got["input_ids"], [10, 10])  # what the group returned, padding included
        assert np.all(answered[:, 1:] != 0)  # so any zero in the answer past column 10 is padding
        np.testing.assert_array_equal(outputs["logprobs"][:, :10], answered)
        for name in ("logprobs", "topk_logprobs", "topk_indices"):
            assert not outputs[name][:, 10:].any(), name
    finally:
        server.stop()


class NarrowGroup(FakeGroup):
    """A broken group: answers one column fewer than the batch it was given."""

    def compute(self, data: Any, query: Query) -> dict:
        return {"logprobs": torch.from_numpy(fake_logprobs(data.input_ids, data.input_lengths)[:, :-1].copy())}


def test_a_group_answer_of_the_wrong_shape_is_a_500_never_a_wrong_answer() -> None:
    server = start_server(NarrowGroup(vocab_size=128))
    try:
        resp = requests.post(f"{server.url}/v2/models/m/infer", data=infer_body([[1, 2, 3, 0]], [3]),
                             headers={"Authorization": "Bearer t0ken"}, timeout=60)
        assert resp.status_code == 500 and "of shape [1, 2] for a batch of 1 rows and width 3" in resp.json()["error"]
    finally:
        server.stop()
