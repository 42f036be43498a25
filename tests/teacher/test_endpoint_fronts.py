"""The scoring fronts over HTTP, in front of a stand-in group: vLLM's ``/v1/completions`` (the real
``openai`` client and plain HTTP) and ``/v1/models``, SGLang's ``/generate``; auth, admission's
refusals, every bad field a 4xx naming it, and the answers' shapes and values against what the
group returned (the numbers against transformers: ``tests/client/test_scoring_fronts_real.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import requests
import torch
from harness.endpoint import AUTH, TOKEN, start_server
from harness.fake_group import FakeGroup, fake_logprobs

from podium.protocol.names import (
    CANDIDATE_LOGPROBS,
    OPENAI_COMPLETIONS,
    OPENAI_MODELS,
    SGLANG_GENERATE,
    TARGET_RANK,
    VLLM_TOKEN_GENERATE,
)

VOCAB = 50


class RankingGroup(FakeGroup):
    """FakeGroup that also answers ``target_rank`` (1 + id % 7) and ``candidate_logprobs`` (-id / 10):
    any deterministic numbers."""

    def compute(self, data: Any, query: Any) -> dict[str, Any]:
        out = super().compute(data, query)
        if query.wants(TARGET_RANK):
            ranks = (data.input_ids % 7 + 1) * (np.arange(data.input_ids.shape[1])[None, :] > 0)
            out[TARGET_RANK] = torch.from_numpy(data.pad(ranks.astype(np.int64)))
        if query.wants(CANDIDATE_LOGPROBS):
            out[CANDIDATE_LOGPROBS] = torch.from_numpy(data.pad(-data.candidate_ids.astype(np.float32) / 10))
        return out


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    server = start_server(RankingGroup(vocab_size=VOCAB, max_sequence_length=64), {"max_top_k": 8},
                          teacher_key="k1", aliases=("math",))
    yield server
    server.stop()


def post(server: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(server.url + path, json=body, headers=AUTH if headers is None else headers, timeout=60)


def test_openai_client_prompt_logprobs_batch(server: Any) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN)
    prompts = [[3, 4, 5, 6], [7, 8]]
    out = client.completions.create(model="math", prompt=prompts, max_tokens=1, temperature=1.0,
                                    extra_body={"prompt_logprobs": 2})
    assert [c.index for c in out.choices] == [0, 1]
    for choice, row in zip(out.choices, prompts, strict=True):
        got = choice.model_extra["prompt_logprobs"]
        assert len(got) == len(row) and got[0] is None
        expected = fake_logprobs(np.array([[*row, 0]]), np.array([len(row) + 1]))[0]
        for i in range(1, len(row)):
            entry = got[i]
            own = entry[str(row[i])]
            assert own["logprob"] == pytest.approx(expected[i]) and own["rank"] == row[i] % 7 + 1
            assert own["decoded_token"] == f"token_id:{row[i]}"
            tops = {int(t): v for t, v in entry.items() if int(t) != row[i]}  # FakeGroup's top-k: id, id+1
            assert set(tops) <= {row[i] % VOCAB, (row[i] + 1) % VOCAB}
        assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == 6 and out.usage.completion_tokens == 2


def test_echo_legacy_logprobs_and_next_token(server: Any) -> None:
    body = {"model": "m", "prompt": [3, 4, 5], "max_tokens": 1, "echo": True, "logprobs": 2}
    got = post(server, OPENAI_COMPLETIONS, body).json()["choices"][0]
    lp = got["logprobs"]
    # FakeGroup's top-1 at a position is the id there: at the placeholder after the prompt, 0
    assert lp["tokens"] == ["token_id:3", "token_id:4", "token_id:5", "token_id:0"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [0, 10, 20, 30]
    assert set(lp["top_logprobs"][1]) == {"token_id:4", "token_id:5"}
    score_only = post(server, OPENAI_COMPLETIONS, {**body, "max_tokens": 0}).json()["choices"][0]
    assert len(score_only["logprobs"]["tokens"]) == 3


def test_models_lists_every_name(server: Any) -> None:
    data = requests.get(server.url + OPENAI_MODELS, headers=AUTH, timeout=10).json()["data"]
    assert {"m", "math", "k1"} <= {m["id"] for m in data}
    assert data[0]["max_model_len"] == 64 and data[0]["vocab_size"] == VOCAB


def test_sglang_generate_single_and_batch(server: Any) -> None:
    body = {"input_ids": [3, 4, 5], "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            "sampling_params": {"temperature": 0, "max_new_tokens": 0}}
    one = post(server, SGLANG_GENERATE, body).json()
    expected = fake_logprobs(np.array([[3, 4, 5]]), np.array([3]))[0]
    triples = one["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in triples] == [3, 4, 5] and triples[0][0] is None and triples[0][2] is None
    assert [t[0] for t in triples[1:]] == pytest.approx(expected[1:].tolist())
    assert one["meta_info"]["input_top_logprobs"][0] is None and len(one["meta_info"]["input_top_logprobs"][1]) == 2
    many = post(server, SGLANG_GENERATE, {**body, "input_ids": [[3, 4, 5], [9, 8]], "logprob_start_len": 1,
                                          "token_ids_logprob": [1, 2, 3]}).json()
    assert isinstance(many, list) and len(many) == 2
    assert [t[1] for t in many[1]["meta_info"]["input_token_logprobs"]] == [8]
    # from logprob_start_len, SGLang answers null at the first position (its padding), then the lists
    first, support = many[0]["meta_info"]["input_token_ids_logprobs"]  # positions 1 and 2
    assert first is None and many[0]["meta_info"]["input_token_logprobs"][0][0] is None
    assert [t[1] for t in support] == [1, 2, 3] and [t[0] for t in support] == pytest.approx([-0.1, -0.2, -0.3])


BAD_FIELDS = [
    (OPENAI_COMPLETIONS, {"prompt": [1, 2], "max_tokens": 5}, 400, "max_tokens"),
    (OPENAI_COMPLETIONS, {"prompt": [1, 2]}, 400, "max_tokens"),
    (OPENAI_COMPLETIONS, {"prompt": [1, VOCAB], "max_tokens": 0}, 400, "prompt"),
    (OPENAI_COMPLETIONS, {"prompt": [1, 2], "max_tokens": 0, "prompt_logprobs": 9}, 413, "prompt_logprobs"),
    (OPENAI_COMPLETIONS, {"prompt": [1, 2], "max_tokens": 0, "prompt_logprobs": "3"}, 400, "prompt_logprobs"),
    (OPENAI_COMPLETIONS, {"prompt": [], "max_tokens": 0}, 400, "prompt"),
    (OPENAI_COMPLETIONS, {"prompt": [[1], []], "max_tokens": 0}, 400, "prompt"),
    (OPENAI_COMPLETIONS, {"prompt": "hello", "max_tokens": 0}, 400, "prompt"),
    (OPENAI_COMPLETIONS, {"prompt": [1, 2], "max_tokens": 0, "temperature": -1}, 400, "temperature"),
    (OPENAI_COMPLETIONS, {"prompt": [1, 2], "max_tokens": 0, "n": 2}, 400, "n"),
    (OPENAI_COMPLETIONS, {"prompt": [1, 2], "max_tokens": 0, "model": "other"}, 404, "model"),
    (SGLANG_GENERATE, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}}, 400,
     "sampling_params.max_new_tokens"),
    (SGLANG_GENERATE, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}, "top_logprobs_num": 20},
     413, "top_logprobs_num"),
    (SGLANG_GENERATE, {"input_ids": [1, -1], "sampling_params": {"max_new_tokens": 0}}, 400, "input_ids"),
    (SGLANG_GENERATE, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}, "logprob_start_len": 5},
     400, "logprob_start_len"),
    (SGLANG_GENERATE, {"input_ids": "1 2", "sampling_params": {"max_new_tokens": 0}}, 400, "input_ids"),
    (SGLANG_GENERATE, {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}, "retrun_logprob": True},
     400, "retrun_logprob"),
    (VLLM_TOKEN_GENERATE, {"token_ids": [1, 2], "sampling_params": {"max_tokens": 3}}, 400,
     "sampling_params.max_tokens"),
    (VLLM_TOKEN_GENERATE, {"token_ids": [1, 2, 3], "sampling_params": {
        "max_tokens": 1, "prompt_logprob_token_ids": [[1], [2], [3]]}}, 400,
     "sampling_params.prompt_logprob_token_ids"),
    (VLLM_TOKEN_GENERATE, {"token_ids": [1, 2, 3], "sampling_params": {
        "max_tokens": 1, "prompt_logprob_token_ids": [[1], [VOCAB]]}}, 400,
     "sampling_params.prompt_logprob_token_ids"),
    (VLLM_TOKEN_GENERATE, {"token_ids": [1, 2, 3], "sampling_params": {
        "max_tokens": 1, "prompt_logprob_token_ids": [list(range(9)), [1]]}}, 413,
     "sampling_params.prompt_logprob_token_ids"),
    (VLLM_TOKEN_GENERATE, {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1, "prompt_logprob_start": 1}},
     400, "sampling_params.prompt_logprob_start"),
    (OPENAI_COMPLETIONS, {"prompt": [1, 2, 3], "max_tokens": 0, "prompt_logprob_token_ids": [[1], [2]]}, 400,
     "prompt_logprob_token_ids"),
]


@pytest.mark.parametrize(("path", "body", "status", "field"), BAD_FIELDS)
def test_bad_fields_are_refused_by_name(server: Any, path: str, body: dict[str, Any], status: int, field: str) -> None:
    answer = post(server, path, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]  # OpenAI's error shape (what the openai client reads)
    assert field in error["message"] and error["code"] == status
    assert error["param"] == field  # carried by the error, not read back from its text
    assert post(server, OPENAI_COMPLETIONS, {"prompt": [1, 2], "max_tokens": 0}).status_code == 200  # still serving


def test_token_required_and_generation_refused_through_the_client(server: Any) -> None:
    for path in (OPENAI_COMPLETIONS, SGLANG_GENERATE, VLLM_TOKEN_GENERATE):
        assert post(server, path, {"prompt": [1, 2], "max_tokens": 0}, headers={}).status_code == 401
    assert requests.get(server.url + OPENAI_MODELS, timeout=10).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").completions.create(
            model="m", prompt=[1, 2], max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="does not generate"):
        openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN).completions.create(
            model="m", prompt=[1, 2], max_tokens=16)


def test_plain_health_is_open_and_says_whether_the_teacher_serves(server: Any) -> None:
    """``GET /health`` (vLLM's and SGLang's probe; TRL polls it without a token before its first call):
    200 while the teacher serves, 503 with Retry-After while it does not; never 401."""
    from podium.protocol.names import PLAIN_HEALTH

    assert requests.get(server.url + PLAIN_HEALTH, timeout=10).status_code == 200
    server.set_ready(False, "loading")
    try:
        answer = requests.get(server.url + PLAIN_HEALTH, timeout=10)
        assert answer.status_code == 503 and "Retry-After" in answer.headers
        assert "not ready (loading)" in answer.json()["error"]["message"]
    finally:
        server.set_ready(True)
    assert requests.get(server.url + PLAIN_HEALTH, timeout=10).status_code == 200


def test_token_in_generate_over_http(server: Any) -> None:
    """vLLM's ``/inference/v1/generate``: the group's logprobs at the prompt's own tokens, the next
    token; a refusal in OpenAI's error shape naming the sampling field."""
    row = [3, 4, 5, 6]
    answer = post(server, VLLM_TOKEN_GENERATE, {"model": "math", "token_ids": row,
                                                "sampling_params": {"max_tokens": 1, "prompt_logprobs": 1}})
    assert answer.status_code == 200, answer.text
    got = answer.json()
    expected = fake_logprobs(np.array([[*row, 0]]), np.array([len(row) + 1]))[0]
    assert got["prompt_logprobs"][0] is None
    for i in range(1, len(row)):
        assert got["prompt_logprobs"][i][str(row[i])]["logprob"] == pytest.approx(float(expected[i]))
    assert len(got["choices"][0]["token_ids"]) == 1
    bad = post(server, VLLM_TOKEN_GENERATE, {"token_ids": row, "sampling_params": {"prompt_logprobs": 1}})
    assert bad.status_code == 400 and "'sampling_params.max_tokens'" in bad.json()["error"]["message"]


def test_teacher_scoring_over_http(server: Any) -> None:
    """vLLM's teacher scoring on ``/inference/v1/generate``: the group's candidate logprobs (here
    -id/10) of each row's own ids as the base64 ``.npy`` ``prompt_token_id_logprobs``, -1 padding -inf."""
    import base64
    import io

    lists = [[7, 3], [-1, 11], [5]]
    answer = post(server, VLLM_TOKEN_GENERATE, {"model": "math", "token_ids": [3, 4, 5, 6, 8], "sampling_params": {
        "max_tokens": 1, "prompt_logprob_token_ids": lists, "prompt_logprob_start": 1}})
    assert answer.status_code == 200, answer.text
    got = answer.json()
    matrix = np.load(io.BytesIO(base64.b64decode(got["prompt_token_id_logprobs"])))
    expected = np.array([[-0.7, -0.3], [-np.inf, -1.1], [-0.5, -np.inf]], dtype=np.float32)
    assert matrix.dtype == np.float32 and np.array_equal(matrix, expected)
    assert got["prompt_logprobs"] is None and len(got["choices"][0]["token_ids"]) == 1


def test_text_prompts_through_the_checkpoints_tokenizer(tokenizers: tuple[Any, Any, Any]) -> None:
    """A teacher whose checkpoint has a tokenizer takes text: tokenized as the checkpoint's tokenizer
    does (batched texts one row each), its tokens named by their text in the answers of both fronts."""
    teacher_tok, _, saved = tokenizers
    served = start_server(RankingGroup(vocab_size=64, max_sequence_length=64, checkpoint_path=str(saved)),
                          teacher_key="k2", aliases=("chat",))
    try:
        texts = ["w3 w7 w9", "w11 w2"]
        rows = [teacher_tok(t)["input_ids"] for t in texts]
        assert rows == [[4, 8, 10], [12, 3]]  # [UNK] is id 0, w<i> is i + 1
        out = post(served, OPENAI_COMPLETIONS, {"prompt": texts, "max_tokens": 0, "prompt_logprobs": 1,
                                                "return_token_ids": True})
        assert out.status_code == 200, out.text
        for choice, row in zip(out.json()["choices"], rows, strict=True):
            assert choice["prompt_token_ids"] == row
            assert choice["prompt_logprobs"][1][str(row[1])]["decoded_token"] == f"w{row[1] - 1}"
        echo = post(served, OPENAI_COMPLETIONS, {"prompt": texts[0], "max_tokens": 0, "echo": True, "logprobs": 1})
        assert echo.json()["choices"][0]["logprobs"]["tokens"] == ["w3", "w7", "w9"]
        assert echo.json()["choices"][0]["text"] == texts[0]
        sglang = post(served, SGLANG_GENERATE, {"text": texts[1], "return_logprob": True, "logprob_start_len": 0,
                                                "return_text_in_logprobs": True,
                                                "sampling_params": {"max_new_tokens": 0}})
        assert [t[1:] for t in sglang.json()["meta_info"]["input_token_logprobs"]] == [[12, "w11"], [3, "w2"]]
    finally:
        served.stop()


def test_a_token_url_authenticates_clients_that_send_no_header(server: Any) -> None:
    """``<url>/token/<token>`` is a base URL for clients that send no Authorization header (TRL's
    VLLMClient, slime's reward function): every front's route under it, with the token in the path
    and no header; another token is a 401; the OIP routes are not under it; errors never echo it."""
    from podium.protocol.names import PLAIN_HEALTH, TOKEN_PATH

    base = f"{server.url}{TOKEN_PATH}/{TOKEN}"
    assert requests.get(base + PLAIN_HEALTH, timeout=10).status_code == 200
    assert requests.get(base + OPENAI_MODELS, timeout=10).json()["data"]
    body = {"model": "math", "prompt": [[3, 4, 5]], "max_tokens": 1, "prompt_logprobs": 2}
    answer = requests.post(base + OPENAI_COMPLETIONS, json=body, timeout=30)
    assert answer.status_code == 200 and len(answer.json()["choices"][0]["prompt_logprobs"]) == 3
    slime = {"input_ids": [3, 4, 5], "return_logprob": True, "logprob_start_len": 0,
             "sampling_params": {"max_new_tokens": 0}}
    assert requests.post(base + SGLANG_GENERATE, json=slime, timeout=30).status_code == 200
    prime = {"token_ids": [3, 4, 5], "sampling_params": {"max_tokens": 0, "prompt_logprobs": 1}}
    assert requests.post(base + VLLM_TOKEN_GENERATE, json=prime, timeout=30).status_code == 200
    wrong = requests.post(f"{server.url}{TOKEN_PATH}/not-the-token{OPENAI_COMPLETIONS}", json=body, timeout=30)
    assert wrong.status_code == 401 and "not-the-token" not in wrong.text
    oip = requests.post(f"{base}/v2/models/m/infer", json={}, timeout=30)
    assert oip.status_code == 401 and TOKEN not in oip.text  # no such route under a token URL: the header is asked
    missing = requests.post(f"{base}/v1/nothing", json={}, headers=AUTH, timeout=30)
    assert missing.status_code == 404 and TOKEN not in missing.text and "/token/<token>/v1/nothing" in missing.text


def basic_url(server: Any, token: str = TOKEN) -> str:
    """The teacher's URL with the token as HTTP Basic's password (``http://podium:<token>@host:port``)."""
    return server.url.replace("://", f"://podium:{token}@", 1)


def test_basic_auth_for_clients_that_send_no_header(server: Any) -> None:
    """``http://podium:<token>@host:port``: requests and aiohttp turn it into ``Authorization:
    Basic``, taken on every front's route (any user name), never on podium's own routes; a wrong
    password is a 401 that does not repeat it; aiohttp's error never shows the token."""
    base = basic_url(server)
    body = {"model": "math", "prompt": [[3, 4, 5]], "max_tokens": 1, "prompt_logprobs": 2}
    answer = requests.post(base + OPENAI_COMPLETIONS, json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert requests.get(base + OPENAI_MODELS, timeout=30).json()["data"]
    slime = {"input_ids": [3, 4, 5], "return_logprob": True, "logprob_start_len": 0,
             "sampling_params": {"max_new_tokens": 0}}
    other_user = server.url.replace("://", f"://anyone:{TOKEN}@", 1)
    assert requests.post(other_user + SGLANG_GENERATE, json=slime, timeout=30).status_code == 200
    prime = {"token_ids": [3, 4, 5], "sampling_params": {"max_tokens": 0, "prompt_logprobs": 1}}
    assert requests.post(base + VLLM_TOKEN_GENERATE, json=prime, timeout=30).status_code == 200
    wrong = requests.post(basic_url(server, "not-the-token") + OPENAI_COMPLETIONS, json=body, timeout=30)
    assert wrong.status_code == 401 and "not-the-token" not in wrong.text
    oip = requests.get(base + "/v2/models/m", timeout=30)
    assert oip.status_code == 401  # podium's own routes take the bearer header only
    malformed = requests.get(server.url + OPENAI_MODELS, headers={"Authorization": "Basic !!!"}, timeout=30)
    assert malformed.status_code == 401

    async def aiohttp_calls() -> str:
        async with aiohttp.ClientSession(raise_for_status=True) as session:
            async with session.post(base + SGLANG_GENERATE, json=slime) as resp:
                assert (await resp.json())["meta_info"]["input_token_logprobs"][1][1] == 4
            try:
                async with session.post(base + SGLANG_GENERATE, json={**slime, "input_ids": "3 4 5"}):
                    pass
            except aiohttp.ClientResponseError as exc:
                return str(exc)
        raise AssertionError("a string input_ids was answered")

    message = asyncio.run(aiohttp_calls())
    assert TOKEN not in message and "127.0.0.1" in message  # aiohttp drops the credentials from the URL it shows


def test_health_under_any_token_url_answers_as_health(server: Any) -> None:
    """TRL's readiness loop retries a 401 forever: ``/token/<any>/health`` is ``/health`` (it says no
    more than the open route does); the other routes under a wrong token are still 401."""
    from podium.protocol.names import PLAIN_HEALTH, TOKEN_PATH

    assert requests.get(f"{server.url}{TOKEN_PATH}/stale-token{PLAIN_HEALTH}", timeout=10).status_code == 200
    assert requests.get(f"{server.url}{TOKEN_PATH}/stale-token{OPENAI_MODELS}", timeout=10).status_code == 401
    server.set_ready(False, "loading")
    try:
        assert requests.get(f"{server.url}{TOKEN_PATH}/stale-token{PLAIN_HEALTH}", timeout=10).status_code == 503
    finally:
        server.set_ready(True)


async def aiohttp_refusal(method: str, url: str, *, headers: dict[str, str] | None = None, **kw: Any) -> str:
    """What a real aiohttp client (``raise_for_status=True``) says of a refused request: its
    ``ClientResponseError``'s text (``<status>, message='<reason phrase>', url=...``)."""
    async with aiohttp.ClientSession(raise_for_status=True, headers=headers) as session:
        try:
            async with session.request(method, url, **kw):
                pass
        except aiohttp.ClientResponseError as exc:
            return str(exc)
    raise AssertionError(f"{method} {url} was answered")


@pytest.mark.parametrize(("path", "body", "status", "field"), BAD_FIELDS)
def test_every_refusal_says_why_to_an_aiohttp_client(server: Any, path: str, body: dict[str, Any], status: int,
                                                     field: str) -> None:
    """aiohttp's ``ClientResponseError`` shows the status line only: the reason phrase carries the
    refusal's first words (the field at fault), on one latin-1 line."""
    message = asyncio.run(aiohttp_refusal("POST", server.url + path, headers=AUTH, json=body))
    assert message.startswith(f"{status}, message=") and repr(field) in message, message


def test_auth_routes_and_sizes_refused_in_openais_shape_with_a_reason(server: Any) -> None:
    """401, 404 and 413 on the OpenAI routes in OpenAI's error shape, each with its reason phrase
    as aiohttp shows it; podium's own routes keep ``{"error": message}``; a reason never holds the
    token nor a line break."""
    from podium.protocol.names import TOKEN_PATH

    url = server.url
    cases = [
        ("POST", url + OPENAI_COMPLETIONS, {}, 401, "missing Authorization"),
        ("POST", url + SGLANG_GENERATE, {"Authorization": "Bearer nope"}, 401, "invalid bearer token"),
        ("GET", url + OPENAI_MODELS, {"Authorization": "Basic bm9wZTpub3Bl"}, 401, "invalid token"),
        ("POST", f"{url}{TOKEN_PATH}/nope{OPENAI_COMPLETIONS}", {}, 401, "invalid token in the URL"),
        ("POST", url + "/v1/chat/completions", AUTH, 404, "no route POST /v1/chat/completions"),
        ("GET", url + OPENAI_COMPLETIONS, AUTH, 405, "not allowed"),
    ]
    for method, target, headers, status, reason in cases:
        message = asyncio.run(aiohttp_refusal(method, target, headers=headers, json={}))
        assert f"{status}, message=" in message and reason in message, message
        answer = requests.request(method, target, headers=headers, json={}, timeout=30)
        error = answer.json()["error"]
        assert error["code"] == status and reason in error["message"] and "nope" not in answer.reason
    small = start_server(RankingGroup(vocab_size=VOCAB), {"max_json_body_mb": 1})
    try:
        too_big = {"prompt": [1] * 400_000, "max_tokens": 0}  # over the JSON body limit of 1 MiB
        message = asyncio.run(aiohttp_refusal("POST", small.url + OPENAI_COMPLETIONS, headers=AUTH, json=too_big))
        assert "413, message=" in message and "larger than the limit" in message, message
        assert post(small, OPENAI_COMPLETIONS, too_big).json()["error"]["code"] == 413
    finally:
        small.stop()
    oip = requests.get(url + "/v2/models/other", headers=AUTH, timeout=30)
    assert oip.status_code == 404 and isinstance(oip.json()["error"], str) and "unknown model" in oip.reason


def test_refusals_are_logged_rate_limited_and_without_the_token(caplog: pytest.LogCaptureFixture) -> None:
    """The teacher logs each refused request (what, from whom, why), never the token, at most
    RefusalLog.limit lines a window and then how many it left out."""
    from podium.protocol.names import TOKEN_PATH
    from podium.teacher.endpoint.middleware import RefusalLog

    served = start_server(RankingGroup(vocab_size=VOCAB))  # its own: the module's has used its window
    try:
        with caplog.at_level("WARNING", logger="podium.teacher.endpoint.middleware"):
            post(served, SGLANG_GENERATE, {"input_ids": "1 2", "sampling_params": {"max_new_tokens": 0}})
            requests.get(f"{served.url}{TOKEN_PATH}/{TOKEN}/v1/nothing", timeout=30)
            post(served, OPENAI_COMPLETIONS, {"prompt": [1], "max_tokens": 0, "model": TOKEN})
    finally:
        served.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "podium.teacher.endpoint.middleware"]
    assert any("refused POST /generate" in line and "'input_ids'" in line for line in lines), lines
    assert any(f"{TOKEN_PATH}/<token>/v1/nothing" in line for line in lines), lines
    assert lines and all(TOKEN not in line for line in lines), lines

    log = RefusalLog("secret", limit=2, window_s=3600)
    request = type("R", (), {"method": "POST", "path": "/generate", "remote": "10.0.0.1",
                             "get": lambda self, key, default=None: "rid"})()
    caplog.clear()
    with caplog.at_level("WARNING", logger="podium.teacher.endpoint.middleware"):
        for _ in range(50):
            log.refused(request, 400, "field 'x': the secret is wrong")
        log._start -= 3600  # the window passes: the next refusal says how many were left out
        log.refused(request, 400, "field 'x': again")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and "48 more refused requests" in lines[2], lines
    assert all("secret" not in line for line in lines)


def test_a_reason_phrase_is_one_short_ascii_line() -> None:
    from podium.web.errors import REASON_CHARS, reason_phrase

    got = reason_phrase("request of 2 rows × 9 positions\n= 18 ≥ 10\tüber")
    assert got == "request of 2 rows x 9 positions = 18 >= 10 ?ber"
    long = reason_phrase("field 'prompt': " + "x" * 1000)
    assert len(long) == REASON_CHARS and long.endswith("...")
