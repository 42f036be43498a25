"""The scoring fronts in front of the real Megatron teacher (the session's tiny Llama group, no
tokenizer), in the shapes trainers send, against the HF ``transformers`` fp32 oracle:

- the ``openai`` client's ``completions.create`` with vLLM's ``prompt_logprobs`` (verl, TRL,
  prime-rl), single and batched prompts, at T = 1 and T = 0.7: logprobs, top-k ids and ranks equal
  the oracle's; ``max_tokens: 1`` answers the oracle's argmax; the legacy ``echo`` form;
- SGLang's ``/generate`` as slime sends it (plain aiohttp), input and top logprobs;
- 401 without the token, a 4xx for generation, ids past the vocabulary and k past max_top_k.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import torch
from fixtures.checkpoints import hf_oracle_log_softmax
from harness.lifecycle import Teacher
from harness.run import LLAMA, make_run

from podium.protocol.names import OPENAI_BASE, SGLANG_GENERATE

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

ATOL = 1e-4
VOCAB = 256
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [12, 250, 33, 90], [1, 2]]
MAX_TOP_K = 8


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, llama_group: Any) -> Iterator[tuple[Teacher, str]]:
    layout, token = make_run(tmp_path_factory.mktemp("fronts"), [LLAMA])
    served = Teacher(llama_group, layout, LLAMA, token, server_settings={"max_top_k": MAX_TOP_K}).start()
    yield served, token
    served.stop()


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
    assert len(got) == len(row) and got[0] is None
    for i in range(1, len(row)):
        entry = {int(t): v for t, v in got[i].items()}
        own = entry[row[i]]
        assert abs(own["logprob"] - float(expected[i, row[i]])) < ATOL
        assert own["rank"] == int((expected[i] > expected[i, row[i]]).sum()) + 1
        assert own["decoded_token"] == f"token_id:{row[i]}"  # the tiny checkpoint has no tokenizer
        values, ids = torch.topk(expected[i], k)
        for j in range(k):  # the top k by id (robust to near-ties in order), each with its value and rank
            tid = int(ids[j])
            assert tid in entry and abs(entry[tid]["logprob"] - float(values[j])) < ATOL
        assert sorted(v["rank"] for t, v in entry.items() if t != row[i] or v["rank"] <= k)[:k] == list(range(1, k + 1))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_openai_client_prompt_logprobs_equal_the_oracle(teacher: tuple[Teacher, str], tiny_llama_checkpoint: Path,
                                                       temperature: float) -> None:
    served, token = teacher
    client = openai.OpenAI(base_url=served.url + OPENAI_BASE, api_key=token)
    k = 4
    batched = client.completions.create(model="math", prompt=PROMPTS, max_tokens=1, temperature=temperature,
                                        extra_body={"prompt_logprobs": k})
    expected = oracle(tiny_llama_checkpoint, PROMPTS, temperature)
    for choice, row, exp in zip(batched.choices, PROMPTS, expected, strict=True):
        check_prompt_logprobs(choice.model_extra["prompt_logprobs"], exp, row, k)
    single = client.completions.create(model="math", prompt=PROMPTS[0], max_tokens=1, temperature=temperature,
                                       logprobs=1, extra_body={"prompt_logprobs": k, "return_token_ids": True})
    check_prompt_logprobs(single.choices[0].model_extra["prompt_logprobs"], expected[0], PROMPTS[0], k)
    assert single.choices[0].model_extra["token_ids"] == [next_token_oracle(tiny_llama_checkpoint, PROMPTS[0],
                                                                            temperature)]


def test_echo_form_equals_the_oracle(teacher: tuple[Teacher, str], tiny_llama_checkpoint: Path) -> None:
    served, token = teacher
    client = openai.OpenAI(base_url=served.url + OPENAI_BASE, api_key=token)
    out = client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=0, echo=True, logprobs=3)
    lp = out.choices[0].logprobs
    expected = oracle(tiny_llama_checkpoint, [PROMPTS[1]], 1.0)[0]
    assert lp.tokens == [f"token_id:{t}" for t in PROMPTS[1]] and lp.token_logprobs[0] is None
    for i in range(1, len(PROMPTS[1])):
        assert abs(lp.token_logprobs[i] - float(expected[i, PROMPTS[1][i]])) < ATOL
        values, ids = torch.topk(expected[i], 3)
        for value, tid in zip(values.tolist(), ids.tolist(), strict=True):
            assert abs(lp.top_logprobs[i][f"token_id:{tid}"] - value) < ATOL


def test_sglang_generate_as_slime_sends_it(teacher: tuple[Teacher, str], tiny_llama_checkpoint: Path) -> None:
    served, token = teacher
    payload = {"input_ids": PROMPTS, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
               "sampling_params": {"temperature": 0, "max_new_tokens": 0, "skip_special_tokens": False}}

    async def call() -> Any:
        async with (aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session,
                    session.post(served.url + SGLANG_GENERATE, json=payload) as resp):
            resp.raise_for_status()
            return await resp.json()

    results = asyncio.run(call())
    expected = oracle(tiny_llama_checkpoint, PROMPTS, 1.0)  # temperature 0: greedy, logits unscaled
    for result, row, exp in zip(results, PROMPTS, expected, strict=True):
        triples = result["meta_info"]["input_token_logprobs"]
        assert [t[1] for t in triples] == row and triples[0][0] is None
        got = np.array([t[0] for t in triples[1:]])
        np.testing.assert_allclose(got, exp[np.arange(1, len(row)), row[1:]].numpy(), atol=ATOL)
        tops = result["meta_info"]["input_top_logprobs"]
        for i in range(1, len(row)):
            values, ids = torch.topk(exp[i], 3)
            np.testing.assert_allclose([t[0] for t in tops[i]], values.numpy(), atol=ATOL)
            assert {t[1] for t in tops[i]} == set(ids.tolist())


def test_refusals(teacher: tuple[Teacher, str]) -> None:
    served, token = teacher
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.url + OPENAI_BASE, api_key="not-the-token").completions.create(
            model="math", prompt=PROMPTS[0], max_tokens=1)
    client = openai.OpenAI(base_url=served.url + OPENAI_BASE, api_key=token, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="does not generate"):
        client.completions.create(model="math", prompt=PROMPTS[0], max_tokens=8)
    with pytest.raises(openai.BadRequestError, match=r"prompt.*outside the vocabulary"):
        client.completions.create(model="math", prompt=[1, VOCAB], max_tokens=0)
    with pytest.raises(openai.APIStatusError, match=r"prompt_logprobs.*max_top_k") as caught:
        client.completions.create(model="math", prompt=PROMPTS[0], max_tokens=0,
                                  extra_body={"prompt_logprobs": MAX_TOP_K + 1})
    assert caught.value.status_code == 413
    models = client.models.list()
    assert "math" in {m.id for m in models.data}
