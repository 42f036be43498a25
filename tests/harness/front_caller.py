"""A trainer that pins one URL, in a thread: SGLang ``/generate`` through ``podium front``'s base URL
for an alias until stopped, every answer checked against the HF oracle (what slime and miles send)."""

from __future__ import annotations

import numpy as np
import requests

from harness.call_loops import CallLoops
from harness.client_loop import COMEBACK_S

ROW = [5, 17, 99, 3, 200, 41, 7]


def generate_caller(base: str, token: str, expected: np.ndarray) -> CallLoops:
    """A caller of SGLang ``/generate`` through the front's ``base`` URL, each answer against the
    oracle's ``expected`` logprobs (started by the caller: ``.start()``)."""
    body = {"input_ids": ROW, "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0}}

    def call() -> None:
        answer = requests.post(f"{base}/generate", json=body, timeout=COMEBACK_S,
                               headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.text
        got = [t[0] for t in answer.json()["meta_info"]["input_token_logprobs"][1:]]
        np.testing.assert_allclose(got, expected, atol=1e-4)

    return CallLoops([call], join_s=COMEBACK_S)
