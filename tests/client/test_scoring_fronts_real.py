"""The scoring fronts in front of the real Megatron teacher (the session's tiny Llama group, no
tokenizer), in the shapes trainers send, against the HF ``transformers`` fp32 oracle:

- the ``openai`` client's ``completions.create`` with vLLM's ``prompt_logprobs`` (verl, TRL,
  prime-rl), single and batched prompts, at T = 1 and T = 0.7: logprobs, top-k ids and ranks equal
  the oracle's; ``max_tokens: 1`` answers the oracle's argmax; the legacy ``echo`` form;
- vLLM's token-in ``/inference/v1/generate`` as prime-rl sends it (its ``AsyncOpenAI`` client's
  own ``post``, so with the token), at T = 1 and T = 0.7: the top-level ``prompt_logprobs`` and the
  next token;
- vLLM's teacher scoring on that route (``prompt_logprob_token_ids`` per scored row, ``-1``
  padding, ``prompt_logprob_start``) through the same client's ``post``: the base64 ``.npy``
  matrix equals the oracle at each row's own ids, ``-inf`` where padded; its refusals named;
- SGLang's ``/generate`` as slime sends it (plain aiohttp), input and top logprobs: unscaled at
  T = 0.7 as stock SGLang's, scaled with ``podium_temp_scaled_logprobs``;
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
from harness.lifecycle import Teacher
from harness.run import LLAMA, make_run
from harness.scoring_oracle import (
    ATOL,
    check_echo_logprobs,
    check_generate,
    check_prompt_logprobs,
    next_token_oracle,
    oracle,
)

from podium.protocol.names import OPENAI_BASE, SGLANG_GENERATE, VLLM_TOKEN_GENERATE

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

VOCAB = 256
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [12, 250, 33, 90], [1, 2]]
MAX_TOP_K = 8


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, llama_group: Any) -> Iterator[tuple[Teacher, str]]:
    layout, token = make_run(tmp_path_factory.mktemp("fronts"), [LLAMA])
    served = Teacher(llama_group, layout, LLAMA, token, server_settings={"max_top_k": MAX_TOP_K}).start()
    yield served, token
    served.stop()


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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_in_generate_as_prime_rl_sends_it(teacher: tuple[Teacher, str], tiny_llama_checkpoint: Path,
                                                temperature: float) -> None:
    """prime-rl's ``prefill_logprobs``: ``AsyncOpenAI.post`` of the base URL without ``/v1`` +
    ``/inference/v1/generate``, one sequence, ``max_tokens: 1``, ``top_p: 1``, ``prompt_logprobs: k``."""
    try:  # the HTTP package of the installed openai: httpx2 from openai 3, httpx before (prime-rl's)
        import httpx2 as httpx
    except ImportError:
        import httpx

    served, token = teacher
    client = openai.AsyncOpenAI(base_url=served.url + OPENAI_BASE, api_key=token, max_retries=0)
    url = str(client.base_url).rstrip("/").removesuffix(OPENAI_BASE) + VLLM_TOKEN_GENERATE
    k = 2

    async def post(row: list[int]) -> Any:
        body = {"model": "math", "token_ids": row,
                "sampling_params": {"max_tokens": 1, "temperature": temperature, "top_p": 1.0, "prompt_logprobs": k}}
        response = await client.post(url, cast_to=httpx.Response, body=body)
        return response.json()

    async def both() -> list[Any]:
        try:
            return list(await asyncio.gather(*(post(row) for row in PROMPTS)))
        finally:
            await client.close()

    expected = oracle(tiny_llama_checkpoint, PROMPTS, temperature)
    for answer, row, exp in zip(asyncio.run(both()), PROMPTS, expected, strict=True):
        check_prompt_logprobs(answer["prompt_logprobs"], exp, row, k)
        assert answer["choices"][0]["token_ids"] == [next_token_oracle(tiny_llama_checkpoint, row, temperature)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_teacher_scoring_through_the_openai_clients_post(teacher: tuple[Teacher, str], tiny_llama_checkpoint: Path,
                                                        temperature: float) -> None:
    """vLLM's "Prompt Token ID Logprobs (Teacher Scoring)": a prompt + response, the student's top-K
    ids per response position (ragged, ``-1`` padded) from ``prompt_logprob_start = len(prompt) - 1``;
    ``scores[i, j] = log p(ids[i][j] | prompt + response[:i])`` within 1e-4 of transformers fp32."""
    import base64
    import io

    try:
        import httpx2 as httpx
    except ImportError:
        import httpx

    served, token = teacher
    client = openai.AsyncOpenAI(base_url=served.url + OPENAI_BASE, api_key=token, max_retries=0)
    url = str(client.base_url).rstrip("/").removesuffix(OPENAI_BASE) + VLLM_TOKEN_GENERATE
    prompt, response = [5, 17, 99], [3, 200, 41, 7, 12]
    row = prompt + response
    topk = [[3, 200, 1, 0], [200, -1, -1, -1], [41, 7, 255, 9], [7, 12, -1, -1], [12, 5, 4, 3]]
    ragged = [[3, 200, 1, 0], [200], [41, 7, 255, 9], [7, 12, -1], [12, 5, 4, 3]]  # padded by the teacher

    async def post(lists: list[list[int]], start: int | None) -> Any:
        params: dict[str, Any] = {"max_tokens": 1, "temperature": temperature, "prompt_logprob_token_ids": lists}
        if start is not None:
            params["prompt_logprob_start"] = start
        answer = await client.post(url, cast_to=httpx.Response, body={"model": "math", "token_ids": row,
                                                                      "sampling_params": params})
        return answer.json()

    async def calls() -> list[Any]:
        full = [[i % VOCAB, (i * 7) % VOCAB] for i in range(len(row) - 1)]  # start 0 (absent): every row
        try:
            return list(await asyncio.gather(post(topk, len(prompt) - 1), post(ragged, len(prompt) - 1),
                                             post(full, None)))
        finally:
            await client.close()

    padded, ragged_answer, whole = asyncio.run(calls())
    expected = oracle(tiny_llama_checkpoint, [row], temperature)[0]  # [n, V], row i: the distribution of token i

    def check(answer: Any, lists: list[list[int]], start: int) -> None:
        scores = np.load(io.BytesIO(base64.b64decode(answer["prompt_token_id_logprobs"])))
        width = max(map(len, lists))
        assert scores.dtype == np.float32 and scores.shape == (len(row) - 1 - start, width)
        for i, ids in enumerate(lists):
            for j in range(width):
                if j >= len(ids) or ids[j] == -1:
                    assert scores[i, j] == -np.inf
                else:
                    assert abs(float(scores[i, j]) - float(expected[start + i + 1, ids[j]])) < ATOL, (i, j)

    check(padded, topk, len(prompt) - 1)
    check(ragged_answer, ragged, len(prompt) - 1)
    check(whole, [[i % VOCAB, (i * 7) % VOCAB] for i in range(len(row) - 1)], 0)
    assert padded["prompt_logprobs"] is None
    assert padded["choices"][0]["token_ids"] == [next_token_oracle(tiny_llama_checkpoint, row, temperature)]


def test_teacher_scoring_refusals(teacher: tuple[Teacher, str]) -> None:
    """vLLM's refusals, named: a row count other than the prompt's, an id past the vocabulary, a start
    without the lists (400); a row wider than max_top_k (413, podium's bound for vLLM's --max-logprobs)."""
    served, token = teacher
    row = [5, 17, 99, 3]
    bad = [({"prompt_logprob_token_ids": [[1], [2]]}, 400, "has 2 rows, but the prompt has 3 scored rows"),
           ({"prompt_logprob_token_ids": [[1], [VOCAB]], "prompt_logprob_start": 1}, 400, "outside the vocabulary"),
           ({"prompt_logprob_start": 1}, 400, "needs sampling_params.prompt_logprob_token_ids"),
           ({"prompt_logprob_token_ids": [list(range(MAX_TOP_K + 1))] * 3}, 413, "podium.server.max_top_k")]

    async def call(params: dict[str, Any]) -> tuple[int, Any]:
        body = {"token_ids": row, "sampling_params": {"max_tokens": 1, **params}}
        async with (aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session,
                    session.post(served.url + VLLM_TOKEN_GENERATE, json=body) as resp):
            return resp.status, await resp.json()

    for params, status, words in bad:
        got_status, error = asyncio.run(call(params))
        assert got_status == status and words in error["error"]["message"], error
        assert error["error"]["param"].startswith("sampling_params.prompt_logprob_")


def test_echo_form_equals_the_oracle(teacher: tuple[Teacher, str], tiny_llama_checkpoint: Path) -> None:
    served, token = teacher
    client = openai.OpenAI(base_url=served.url + OPENAI_BASE, api_key=token)
    out = client.completions.create(model="llama", prompt=PROMPTS[1], max_tokens=0, echo=True, logprobs=3)
    check_echo_logprobs(out.choices[0].logprobs, oracle(tiny_llama_checkpoint, [PROMPTS[1]], 1.0)[0], PROMPTS[1], 3)


def test_sglang_generate_as_slime_sends_it(teacher: tuple[Teacher, str], tiny_llama_checkpoint: Path) -> None:
    """slime at ``--rollout-temperature 0.7``: the input logprobs unscaled, as stock SGLang's are;
    scaled by that temperature only with podium's ``podium_temp_scaled_logprobs``."""
    served, token = teacher
    payload = {"input_ids": PROMPTS, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
               "sampling_params": {"temperature": 0.7, "max_new_tokens": 0, "skip_special_tokens": False}}

    async def call(body: dict[str, Any]) -> Any:
        async with (aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as session,
                    session.post(served.url + SGLANG_GENERATE, json=body) as resp):
            resp.raise_for_status()
            return await resp.json()

    for body, temperature in ((payload, 1.0), ({**payload, "podium_temp_scaled_logprobs": True}, 0.7)):
        results = asyncio.run(call(body))
        expected = oracle(tiny_llama_checkpoint, PROMPTS, temperature)
        for result, row, exp in zip(results, PROMPTS, expected, strict=True):
            check_generate(result, exp, row, 3)


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
