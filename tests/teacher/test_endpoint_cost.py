"""What a request may ask, refused before anything is computed: a request over a cost bound
(:mod:`podium.teacher.endpoint.cost`: ``top_k``, positions, answer size) is a 413 naming the
``podium.server`` setting; a number a request cannot mean (an id of 5,000 digits, a temperature
past any float or below the smallest one accepted, a ``top_k`` past int64) is a 400
(:mod:`podium.teacher.endpoint.validation`), never a crash.

The real endpoint, with the numpy stand-in group.
"""

from __future__ import annotations

import json

import numpy as np
import requests
from harness.endpoint import AUTH, post, start_server
from harness.fake_group import FakeGroup
from harness.infer_requests import infer_body

from podium.protocol.names import ERROR_KIND_HEADER, ERROR_REFUSED


def test_costly_requests_are_refused_before_compute_naming_the_setting() -> None:
    group = FakeGroup(vocab_size=128, max_sequence_length=None)
    server = start_server(group, {"max_top_k": 4, "max_request_tokens": 10_000, "max_response_mb": 1})
    try:
        cases = [
            (infer_body([[1, 2]], [2], parameters={"top_k": 5}), "podium.server.max_top_k"),
            (infer_body(np.ones((2, 6000), int), [6000, 6000]), "podium.server.max_request_tokens"),
            (infer_body(np.ones((1, 9000), int), [9000], parameters={"top_k": 4},  # ~1.1 MB of JSON values
                        outputs=[{"name": "topk_logprobs"}, {"name": "topk_indices"}]),
             "podium.server.max_response_mb"),
            # 1 row × 5000 positions × 128 logits × 2 bytes (BF16) = 1.2 MiB, over 1 MiB
            (infer_body(np.ones((1, 5000), int), [5000], outputs=[{"name": "logits",
                                                                    "parameters": {"binary_data": True}}]),
             "podium.server.max_response_mb"),
        ]
        for body, setting in cases:
            resp = post(server, body)
            assert resp.status_code == 413 and setting in resp.json()["error"], (setting, resp.status_code,
                                                                                 resp.text[:300])
            assert resp.headers[ERROR_KIND_HEADER] == ERROR_REFUSED
        assert group.calls == []  # nothing was computed
        assert post(server, infer_body([[1, 2]], [2], parameters={"top_k": 4})).status_code == 200
    finally:
        server.stop()


def test_payload_requests_are_checked_before_compute() -> None:
    """A payload travels only as binary data; one per call; hidden_states refused where the
    teacher's logits are not output_layer(h), naming why; each a 400 before the group sees it."""
    group = FakeGroup(vocab_size=128, hidden_states_refusal="its logits are softcapped")
    server = start_server(group)
    try:
        binary = {"binary_data": True}
        for outputs, message in (
            ([{"name": "logits"}], "logits travels only as binary data"),
            ([{"name": "logits", "parameters": binary}, {"name": "hidden_states", "parameters": binary}],
             "one full-vocabulary payload at most"),
            ([{"name": "hidden_states", "parameters": binary}], "refused by this teacher: its logits are softcapped"),
        ):
            resp = post(server, infer_body([[1, 2]], [2], outputs=outputs))
            assert resp.status_code == 400 and message in resp.json()["error"], (message, resp.text[:300])
        assert group.calls == []
        meta = requests.get(f"{server.url}/v2/models/m", headers=AUTH, timeout=30).json()["podium"]["payloads"]
        assert meta == {"hidden_size": None, "hidden_states_refused": "its logits are softcapped"}
    finally:
        server.stop()


def test_malformed_numbers_are_4xx() -> None:
    server = start_server(FakeGroup(vocab_size=128))
    try:
        digits = "9" * 5000
        huge_id = (b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [' +
                   digits.encode() + b']}, {"name": "input_lengths", "datatype": "INT64", "shape": [1], "data": [1]}]}')
        body = json.loads(infer_body([[1, 2]], [2]))
        for raw, expected in [
            (huge_id, "malformed JSON"),
            (json.dumps({**body, "parameters": {"temperature": 10**400}}).encode(), "'temperature'"),
            (json.dumps({**body, "parameters": {"temperature": 1e-310}}).encode(), "0.001..1000"),
            (json.dumps({**body, "parameters": {"temperature": 5000.0}}).encode(), "MAX_TEMPERATURE"),
            (json.dumps({**body, "parameters": {"top_k": 10**400}}).encode(), "'top_k'"),
        ]:
            resp = post(server, raw)
            assert resp.status_code == 400 and expected in resp.json()["error"], (raw[:80], resp.status_code,
                                                                                  resp.text[:300])
            assert resp.headers[ERROR_KIND_HEADER] == ERROR_REFUSED
    finally:
        server.stop()
