"""A trainer that pins one URL, in a thread: SGLang ``/generate`` through ``podium front``'s base URL
for an alias until stopped, every answer checked against the HF oracle (what slime and miles send)."""

from __future__ import annotations

import threading

import numpy as np
import requests

from harness.client_loop import COMEBACK_S

ROW = [5, 17, 99, 3, 200, 41, 7]


class Caller:
    """SGLang ``/generate`` through the front until stopped; each answer against the oracle."""

    def __init__(self, base: str, token: str, expected: np.ndarray) -> None:
        self.base, self.token, self.expected = base, token, expected
        self.answers, self.errors = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"input_ids": ROW, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0}}
        while not self._stop.is_set():
            try:
                answer = requests.post(f"{self.base}/generate", json=body, timeout=COMEBACK_S,
                                       headers={"Authorization": f"Bearer {self.token}"})
                assert answer.status_code == 200, answer.text
                got = [t[0] for t in answer.json()["meta_info"]["input_token_logprobs"][1:]]
                np.testing.assert_allclose(got, self.expected, atol=1e-4)
                self.answers += 1
            except Exception as exc:  # asserted on by the test
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def start(self) -> Caller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(COMEBACK_S)
