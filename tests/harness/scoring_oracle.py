"""The scoring fronts' answers (vLLM's ``prompt_logprobs`` and echo forms, SGLang's ``/generate``)
checked against the HF ``transformers`` fp32 oracle, for every test that calls a real teacher
through them (a group in the test process, or a teacher brought up by ``podium up``).

- :func:`oracle`: each row's log-softmax ``[n, V]``; :func:`next_token_oracle`: the argmax after a row;
- :func:`check_prompt_logprobs`, :func:`check_echo_logprobs`, :func:`check_generate`: one answer
  against the oracle (logprobs within :data:`ATOL`, the top-k ids, the prompt tokens' ranks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from fixtures.checkpoints import hf_oracle_log_softmax

ATOL = 1e-4  # |logprob - transformers fp32| of an fp32 teacher


def oracle(checkpoint: Path, rows: list[list[int]], temperature: float) -> list[torch.Tensor]:
    """Each row's log-softmax ``[n, V]`` (row i: the distribution token i came from)."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, :len(row)] = torch.tensor(row)
    full = hf_oracle_log_softmax(checkpoint, ids, torch.tensor([len(r) for r in rows]), temperature)
    return [full[b, :len(row)] for b, row in enumerate(rows)]


def next_token_oracle(checkpoint: Path, row: list[int], temperature: float) -> int:
    """The argmax after ``row``: the distribution at the position of a token appended to it."""
    return int(oracle(checkpoint, [[*row, 0]], temperature)[0][len(row)].argmax())


def check_prompt_logprobs(got: list[Any], expected: torch.Tensor, row: list[int], k: int) -> None:
    """vLLM's ``prompt_logprobs`` of one prompt: ``null`` first, then per position the prompt's own
    token (its logprob and rank in the vocabulary) and the top ``k`` (by id, each with its value)."""
    assert len(got) == len(row) and got[0] is None
    for i in range(1, len(row)):
        entry = {int(t): v for t, v in got[i].items()}
        own = entry[row[i]]
        assert abs(own["logprob"] - float(expected[i, row[i]])) < ATOL
        assert own["rank"] == int((expected[i] > expected[i, row[i]]).sum()) + 1
        assert own["decoded_token"] == f"token_id:{row[i]}"  # the tiny checkpoints have no tokenizer
        values, ids = torch.topk(expected[i], k)
        for j in range(k):  # the top k by id (robust to near-ties in order), each with its value and rank
            tid = int(ids[j])
            assert tid in entry and abs(entry[tid]["logprob"] - float(values[j])) < ATOL
        assert sorted(v["rank"] for t, v in entry.items() if t != row[i] or v["rank"] <= k)[:k] == list(range(1, k + 1))


def check_echo_logprobs(lp: Any, expected: torch.Tensor, row: list[int], k: int) -> None:
    """The OpenAI legacy ``logprobs`` of an ``echo`` of ``row`` (``max_tokens: 0``)."""
    assert lp.tokens == [f"token_id:{t}" for t in row] and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    for i in range(1, len(row)):
        assert abs(lp.token_logprobs[i] - float(expected[i, row[i]])) < ATOL
        values, ids = torch.topk(expected[i], k)
        for value, tid in zip(values.tolist(), ids.tolist(), strict=True):
            assert abs(lp.top_logprobs[i][f"token_id:{tid}"] - value) < ATOL


def check_generate(result: dict[str, Any], expected: torch.Tensor, row: list[int], k: int) -> None:
    """SGLang's ``/generate`` answer for ``row`` with ``logprob_start_len: 0`` and ``top_logprobs_num: k``."""
    triples = result["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in triples] == row and triples[0][0] is None
    got = np.array([t[0] for t in triples[1:]])
    np.testing.assert_allclose(got, expected[np.arange(1, len(row)), row[1:]].numpy(), atol=ATOL)
    tops = result["meta_info"]["input_top_logprobs"]
    assert tops[0] is None
    for i in range(1, len(row)):
        values, ids = torch.topk(expected[i], k)
        np.testing.assert_allclose([t[0] for t in tops[i]], values.numpy(), atol=ATOL)
        assert {t[1] for t in tops[i]} == set(ids.tolist())
