"""The scoring fronts' parsing and shaping, without a server (:mod:`podium.protocol.scoring`,
:mod:`podium.protocol.openai_scoring`, :mod:`podium.protocol.vllm_generate`,
:mod:`podium.protocol.sglang_scoring`):

- every bad field is a :class:`~podium.protocol.scoring.FieldError` naming that field;
- the answers in the shapes vLLM and SGLang write them: vLLM's ``prompt_logprobs`` (``null``, then
  per position a map from the token id as a JSON string key to ``{logprob, rank, decoded_token}``,
  the prompt's own token first, the top k after it, once each) read by the real ``openai``
  client's types; the legacy echo form; vLLM's token-in generate answer as prime-rl reads it;
  SGLang's ``meta_info`` triples ``[logprob, id, text]``
  whose first answered position is ``null`` whatever ``logprob_start_len`` (SGLang pads it so),
  ``-1`` answering the last prompt position only, ``input_top_logprobs`` only for
  ``top_logprobs_num > 0``;
- the logprobs written round-trip to the float32 values the teacher computed; ``-inf`` is vLLM's
  floor ``-9999.0``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import openai.types
import pytest

from podium.protocol.names import CANDIDATE_LOGPROBS, LOGPROBS, TARGET_RANK, TOPK_INDICES, TOPK_LOGPROBS
from podium.protocol.openai_scoring import completion_response, parse_completion
from podium.protocol.scoring import MIN_JSON_LOGPROB, FieldError, ScoringCall, TokenNames, row_answers
from podium.protocol.sglang_scoring import generate_response, parse_generate
from podium.protocol.vllm_generate import parse_token_generate, token_generate_response

VOCAB = 64


def refused(parse: Any, body: Any, field: str) -> str:
    with pytest.raises(FieldError) as caught:
        parse(body)
    assert caught.value.field == field and repr(field) in str(caught.value), str(caught.value)
    return str(caught.value)


def completion(body: Any) -> Any:
    return parse_completion(body, None)


def generate(body: Any) -> Any:
    return parse_generate(body, None)


OK = {"prompt": [1, 2, 3], "max_tokens": 0}


@pytest.mark.parametrize(("body", "field"), [
    ([1, 2], "body"),
    ({**OK, "model": 3}, "model"),
    ({**OK, "max_tokens": 2}, "max_tokens"),
    ({"prompt": [1, 2]}, "max_tokens"),
    ({**OK, "max_tokens": "1"}, "max_tokens"),
    ({**OK, "max_tokens": -1}, "max_tokens"),
    ({**OK, "n": 2}, "n"),
    ({**OK, "best_of": 3}, "best_of"),
    ({**OK, "stream": True}, "stream"),
    ({**OK, "suffix": "x"}, "suffix"),
    ({**OK, "logit_bias": {"1": 5}}, "logit_bias"),
    ({**OK, "echo": "yes"}, "echo"),
    ({**OK, "return_tokens_as_token_ids": 1}, "return_tokens_as_token_ids"),
    ({**OK, "return_token_ids": "no"}, "return_token_ids"),
    ({**OK, "add_special_tokens": 0}, "add_special_tokens"),
    ({"max_tokens": 0}, "prompt"),
    ({**OK, "prompt": []}, "prompt"),
    ({**OK, "prompt": [[1], []]}, "prompt"),
    ({**OK, "prompt": [1, 2.5]}, "prompt"),
    ({**OK, "prompt": [[1], [2, True]]}, "prompt"),
    ({**OK, "prompt": {"ids": [1]}}, "prompt"),
    ({**OK, "prompt": "text, and no tokenizer"}, "prompt"),
    ({**OK, "prompt_logprobs": -1}, "prompt_logprobs"),
    ({**OK, "prompt_logprobs": "3"}, "prompt_logprobs"),
    ({**OK, "logprobs": -2}, "logprobs"),
    ({**OK, "prompt_logprob_token_ids": [[1], [2]]}, "prompt_logprob_token_ids"),
    ({**OK, "prompt_logprob_start": 0}, "prompt_logprob_start"),
    ({**OK, "logprobs": 1.5}, "logprobs"),
])
def test_completion_refusals_name_the_field(body: Any, field: str) -> None:
    refused(completion, body, field)


def test_completion_refusals_say_why() -> None:
    assert "OpenAI default" in refused(completion, {"prompt": [1]}, "max_tokens")
    assert "does not generate" in refused(completion, {**OK, "max_tokens": 5}, "max_tokens")
    assert "send token ids" in refused(completion, {**OK, "prompt": "hi"}, "prompt")
    assert "prompt 1 is empty" in refused(completion, {**OK, "prompt": [[1], []]}, "prompt")


def checked(form: Any) -> Any:
    return form.call.ask(vocab_size=VOCAB, max_sequence_length=32)


@pytest.mark.parametrize(("body", "field"), [
    ({**OK, "prompt": [1, VOCAB]}, "prompt"),
    ({**OK, "prompt": [1, -1]}, "prompt"),
    ({**OK, "prompt": list(range(33))}, "prompt"),
    ({**OK, "temperature": -1}, "temperature"),
    ({**OK, "temperature": "hot"}, "temperature"),
    ({**OK, "prompt_logprobs": VOCAB + 1}, "prompt_logprobs"),
    ({**OK, "prompt_logprobs": 1, "logprobs": VOCAB + 1}, "logprobs"),
])
def test_the_batch_and_query_checks_name_the_front_field(body: Any, field: str) -> None:
    refused(lambda b: checked(completion(b)), body, field)


def test_temperature_zero_is_greedy_and_absent_is_the_teachers() -> None:
    _, query = checked(completion({**OK, "temperature": 0}))
    assert query.temperature == 1.0
    _, query = checked(completion(OK))
    assert query.temperature is None
    _, query = checked(completion({**OK, "temperature": 0.7}))
    assert query.temperature == pytest.approx(0.7)


GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 0}}


@pytest.mark.parametrize(("body", "field"), [
    ("ids", "body"),
    ({**GEN, "stream": True}, "stream"),
    ({**GEN, "image_data": "x.png"}, "image_data"),
    ({**GEN, "sampling_params": {"max_new_tokens": 8}}, "sampling_params.max_new_tokens"),
    ({"input_ids": [1, 2]}, "sampling_params.max_new_tokens"),
    ({**GEN, "sampling_params": {"max_new_tokens": "0"}}, "sampling_params.max_new_tokens"),
    ({**GEN, "sampling_params": {"max_new_tokens": 0, "n": 2}}, "sampling_params.n"),
    ({**GEN, "input_ids": "1 2 3"}, "input_ids"),  # SGLang takes ids there, never text
    ({**GEN, "input_ids": ["a", "b"]}, "input_ids"),
    ({**GEN, "text": [1, 2]}, "text"),
    ({**GEN, "text": "x"}, "text"),  # both: which would be scored?
    ({**GEN, "detokenize": False}, "detokenize"),  # vLLM's, not SGLang's
    ({**GEN, "retrun_logprob": True, "zz": 1}, "retrun_logprob, zz"),
    ({**GEN, "sampling_params": {"max_new_tokens": 0, "temprature": 0.7}}, "sampling_params.temprature"),
    ({**GEN, "lora_path": "adapter"}, "lora_path"),
    ({**GEN, "input_embeds": [[0.1]]}, "input_embeds"),
    ({**GEN, "session_params": {"id": "s"}}, "session_params"),
    ({**GEN, "return_flat_raw_top_logprobs": True}, "return_flat_raw_top_logprobs"),
    ({**GEN, "podium_temp_scaled_logprobs": "yes"}, "podium_temp_scaled_logprobs"),
    ({**GEN, "sampling_params": {"max_new_tokens": 0, "temperature": -0.5}}, "sampling_params.temperature"),
    ({**GEN, "sampling_params": {"max_new_tokens": 0, "temperature": "hot"}}, "sampling_params.temperature"),
    ({**GEN, "sampling_params": [{"max_new_tokens": 0}, {"max_new_tokens": 1}]}, "sampling_params"),
    ({**GEN, "sampling_params": "greedy"}, "sampling_params"),
    ({"sampling_params": {"max_new_tokens": 0}}, "input_ids"),
    ({**GEN, "input_ids": []}, "input_ids"),
    ({**GEN, "input_ids": [[1, 2], []]}, "input_ids"),
    ({"text": "no tokenizer", "sampling_params": {"max_new_tokens": 0}}, "text"),
    ({**GEN, "logprob_start_len": "0"}, "logprob_start_len"),
    ({**GEN, "logprob_start_len": 3}, "logprob_start_len"),
    ({**GEN, "logprob_start_len": -2}, "logprob_start_len"),
    ({**GEN, "input_ids": [[1, 2], [3, 4]], "return_logprob": [True]}, "return_logprob"),
    ({**GEN, "top_logprobs_num": -1}, "top_logprobs_num"),
    ({**GEN, "top_logprobs_num": "2"}, "top_logprobs_num"),
    ({**GEN, "token_ids_logprob": [1, "2"]}, "token_ids_logprob"),
    ({**GEN, "token_ids_logprob": []}, "token_ids_logprob"),
    ({**GEN, "input_ids": [[1, 2], [3, 4]], "token_ids_logprob": [[1], [2, 3]]}, "token_ids_logprob"),
    ({**GEN, "return_text_in_logprobs": "yes"}, "return_text_in_logprobs"),
])
def test_generate_refusals_name_the_field(body: Any, field: str) -> None:
    refused(generate, body, field)


@pytest.mark.parametrize(("body", "field"), [
    ({**GEN, "input_ids": [1, VOCAB]}, "input_ids"),
    ({**GEN, "sampling_params": {"max_new_tokens": 0, "temperature": -1}}, "sampling_params.temperature"),
    ({**GEN, "top_logprobs_num": VOCAB + 1}, "top_logprobs_num"),
    ({**GEN, "token_ids_logprob": [1, VOCAB]}, "input_ids"),
])
def test_generate_checks_name_the_sglang_field(body: Any, field: str) -> None:
    refused(lambda b: checked(generate(b)), body, field)


def test_generate_logprobs_are_unscaled_as_sglangs_unless_asked() -> None:
    """Stock SGLang's input logprobs are unscaled (``Req.temp_scaled_logprobs`` False) whatever
    ``sampling_params.temperature``: slime at ``--rollout-temperature 0.7`` must read the same
    numbers from podium. ``podium_temp_scaled_logprobs: true`` asks for the scaled ones."""
    for temperature in (0, 0.7, 1.0, 2, None):
        params = {"max_new_tokens": 0, **({} if temperature is None else {"temperature": temperature})}
        _, query = checked(generate({**GEN, "sampling_params": params}))
        assert query.temperature == 1.0, temperature
    scaled = {**GEN, "podium_temp_scaled_logprobs": True}
    _, query = checked(generate({**scaled, "sampling_params": {"max_new_tokens": 0, "temperature": 0.7}}))
    assert query.temperature == pytest.approx(0.7)
    _, query = checked(generate({**scaled, "sampling_params": {"max_new_tokens": 0, "temperature": 0}}))
    assert query.temperature == 1.0  # greedy: unscaled
    _, query = checked(generate(scaled))
    assert query.temperature == 1.0  # SGLang's default temperature
    message = refused(lambda b: checked(generate(b)),
                      {**scaled, "sampling_params": {"max_new_tokens": 0, "temperature": -1}},
                      "sampling_params.temperature")
    assert "finite number > 0" in message


def test_generate_accepts_every_field_sglang_knows() -> None:
    """Fields of SGLang's GenerateReqInput and SamplingParams podium does not need are accepted
    (ignored): a real SGLang caller's request is never refused for a field SGLang takes."""
    body = {**GEN, "rid": "r1", "session_id": "s", "log_metrics": False, "priority": 3, "routing_key": "k",
            "extra_key": "e", "cache_salt": "c", "return_hidden_states": False, "return_prompt_token_ids": True,
            "custom_labels": {"a": "b"}, "no_logs": True, "stream": False, "image_data": None,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
                                "min_p": 0.0, "stop": ["</s>"], "stop_token_ids": [2], "skip_special_tokens": True,
                                "repetition_penalty": 1.0, "n": 1, "sampling_seed": 1, "ignore_eos": False}}
    form = generate(body)
    assert form.call.rows == [[1, 2, 3]]


# ---------------------------------------------------------------------------------- the answers


def teacher_outputs(call: ScoringCall, k: int, seed: int = 0) -> dict[str, np.ndarray]:
    """What a teacher answers for ``call`` (podium's alignment: position i, the distribution token i
    came from), made up: float32 logprobs, top-k ids best first, ranks, candidate logprobs."""
    rng = np.random.default_rng(seed)
    batch, _ = call.ask(vocab_size=VOCAB, max_sequence_length=None)
    rows, width = batch.rows, batch.width
    out = {LOGPROBS: -rng.random((rows, width), dtype=np.float32) * 7,
           TOPK_LOGPROBS: -np.sort(rng.random((rows, width, max(k, 1)), dtype=np.float32) * 5, axis=-1),
           TOPK_INDICES: np.stack([rng.permutation(VOCAB)[:max(k, 1)] for _ in range(rows * width)]).reshape(
               rows, width, max(k, 1)),
           TARGET_RANK: rng.integers(1, VOCAB, (rows, width))}
    if call.candidates is not None:
        out[CANDIDATE_LOGPROBS] = -rng.random((rows, width, len(call.candidates[0])), dtype=np.float32)
    if call.position_candidates is not None:
        out[CANDIDATE_LOGPROBS] = -rng.random((rows, width, call.position_candidates.shape[-1]), dtype=np.float32)
    return out


def completion_answer(body: dict[str, Any], outputs: dict[str, np.ndarray] | None = None,
                      k: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    form = completion(body)
    outputs = teacher_outputs(form.call, k) if outputs is None else outputs
    text = completion_response(form, row_answers(form.call, outputs), TokenNames(None), model="m", request_id="r",
                               created=1)
    return json.loads(text), outputs


def test_prompt_logprobs_in_vllms_shape() -> None:
    prompts, k = [[5, 9, 2, 7], [3, 4]], 3
    form = completion({"prompt": prompts, "max_tokens": 1, "prompt_logprobs": k})
    outputs = teacher_outputs(form.call, k)
    outputs[TOPK_INDICES][0, 2, 1] = 2  # the prompt's own token among the top k: written once
    outputs[LOGPROBS][1, 1] = -np.inf  # vLLM's floor
    answer, _ = completion_answer({"prompt": prompts, "max_tokens": 1, "prompt_logprobs": k}, outputs)
    parsed = openai.types.Completion.model_validate(answer)  # what the openai client reads it into
    assert [c.index for c in parsed.choices] == [0, 1] and parsed.usage is not None
    assert parsed.usage.prompt_tokens == 6 and parsed.usage.completion_tokens == 2
    for b, (choice, row) in enumerate(zip(answer["choices"], prompts, strict=True)):
        got = choice["prompt_logprobs"]
        assert len(got) == len(row) and got[0] is None
        for i in range(1, len(row)):
            keys = list(got[i])
            assert all(isinstance(key, str) and key == str(int(key)) for key in keys)
            assert keys[0] == str(row[i])  # the prompt's own token first
            assert all(set(v) == {"logprob", "rank", "decoded_token"} for v in got[i].values())
            own = got[i][str(row[i])]
            want = max(float(outputs[LOGPROBS][b, i]), MIN_JSON_LOGPROB)
            assert own == {"logprob": want, "rank": int(outputs[TARGET_RANK][b, i]),
                           "decoded_token": f"token_id:{row[i]}"}
            top = outputs[TOPK_INDICES][b, i].tolist()
            assert keys == list(dict.fromkeys([str(row[i]), *map(str, top)]))
            for j, tid in enumerate(top):
                if tid != row[i]:
                    assert got[i][str(tid)] == {"logprob": float(outputs[TOPK_LOGPROBS][b, i, j]), "rank": j + 1,
                                                "decoded_token": f"token_id:{tid}"}
        # max_tokens 1: the most likely next token, the top-1 at the position after the prompt
        assert choice["text"] == "" and choice["finish_reason"] == "length"
    assert len(answer["choices"][0]["prompt_logprobs"][2]) == k  # own token in the top k: not twice
    assert answer["choices"][1]["prompt_logprobs"][1]["4"]["logprob"] == MIN_JSON_LOGPROB


def test_logprobs_round_trip_to_the_teachers_float32() -> None:
    answer, outputs = completion_answer({"prompt": [[1, 2, 3, 4, 5, 6]], "max_tokens": 0, "prompt_logprobs": 2}, k=2)
    got = answer["choices"][0]["prompt_logprobs"]
    own = np.array([got[i][str(i + 1)]["logprob"] for i in range(1, 6)], dtype=np.float32)
    np.testing.assert_array_equal(own, outputs[LOGPROBS][0, 1:6])


def test_echo_form_in_openais_legacy_shape() -> None:
    body = {"prompt": [5, 9, 2], "max_tokens": 1, "echo": True, "logprobs": 2, "return_token_ids": True}
    answer, outputs = completion_answer(body, k=2)
    # vLLM's echo writes null first, which openai's types do not declare (its client does not
    # validate: it constructs): read as JSON
    lp = answer["choices"][0]["logprobs"]
    next_id = int(outputs[TOPK_INDICES][0, 3, 0])
    assert lp["tokens"] == ["token_id:5", "token_id:9", "token_id:2", f"token_id:{next_id}"]
    assert lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][1] == float(outputs[LOGPROBS][0, 1])
    assert lp["token_logprobs"][3] == float(outputs[TOPK_LOGPROBS][0, 3, 0])
    assert lp["top_logprobs"][0] is None
    assert next(iter(lp["top_logprobs"][1])) == "token_id:9"  # the token itself, then the top k by name
    assert len(lp["top_logprobs"][1]) in (2, 3)
    assert lp["text_offset"] == [0, 10, 20, 30]
    extra = answer["choices"][0]
    assert extra["prompt_token_ids"] == [5, 9, 2] and extra["token_ids"] == [next_id]
    assert extra["prompt_logprobs"] is None
    without_echo, _ = completion_answer({**body, "echo": False}, outputs)
    assert without_echo["choices"][0]["logprobs"]["tokens"] == [f"token_id:{next_id}"]


def generate_answer(body: dict[str, Any], k: int = 0) -> tuple[Any, dict[str, np.ndarray]]:
    form = generate(body)
    outputs = teacher_outputs(form.call, k)
    text = generate_response(form, row_answers(form.call, outputs), TokenNames(None), request_id="r")
    return json.loads(text), outputs


def test_generate_in_sglangs_shape_from_logprob_start_len() -> None:
    row = [5, 9, 2, 7, 11]
    body = {"input_ids": row, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0}}
    answer, outputs = generate_answer(body, k=2)
    meta = answer["meta_info"]
    assert answer["output_ids"] == [] and meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 0
    assert meta["input_token_logprobs"] == [[None, 5, None]] + [
        [float(outputs[LOGPROBS][0, i]), row[i], None] for i in range(1, 5)]
    assert meta["input_top_logprobs"][0] is None
    assert meta["input_top_logprobs"][2] == [[float(outputs[TOPK_LOGPROBS][0, 2, j]),
                                              int(outputs[TOPK_INDICES][0, 2, j]), None] for j in range(2)]
    assert meta["output_token_logprobs"] == [] and "input_token_ids_logprobs" not in meta
    # from position 2: SGLang pads the first answered position with null too
    later, _ = generate_answer({**body, "logprob_start_len": 2}, k=2)
    triples = later["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in triples] == [2, 7, 11] and triples[0][0] is None and triples[1][0] is not None
    assert later["meta_info"]["input_top_logprobs"][0] is None and len(later["meta_info"]["input_top_logprobs"]) == 3
    # -1 (SGLang's default): the last prompt position only, its logprob null
    last, _ = generate_answer({**body, "logprob_start_len": -1, "top_logprobs_num": 0})
    assert last["meta_info"]["input_token_logprobs"] == [[None, 11, None]]
    assert "input_top_logprobs" not in last["meta_info"]  # top_logprobs_num 0: SGLang writes no top lists
    default, _ = generate_answer({k: v for k, v in body.items() if k != "logprob_start_len"}, k=2)
    assert default["meta_info"]["input_token_logprobs"] == [[None, 11, None]]
    assert default["meta_info"]["input_top_logprobs"] == [None]
    quiet, _ = generate_answer({**body, "return_logprob": False})
    assert "input_token_logprobs" not in quiet["meta_info"]


def test_generate_batch_next_token_and_given_support() -> None:
    body = {"input_ids": [[5, 9, 2], [3, 4]], "return_logprob": True, "logprob_start_len": 0,
            "token_ids_logprob": [1, 6], "return_text_in_logprobs": True, "rid": "mine",
            "sampling_params": {"max_new_tokens": 1}}
    answer, outputs = generate_answer(body, k=0)
    assert isinstance(answer, list) and len(answer) == 2
    for b, (result, row) in enumerate(zip(answer, [[5, 9, 2], [3, 4]], strict=True)):
        meta = result["meta_info"]
        nxt = int(outputs[TOPK_INDICES][b, len(row), 0])
        assert result["output_ids"] == [nxt] and meta["completion_tokens"] == 1
        assert meta["output_token_logprobs"] == [[float(outputs[TOPK_LOGPROBS][b, len(row), 0]), nxt,
                                                  f"token_id:{nxt}"]]
        assert meta["input_token_logprobs"][1][2] == f"token_id:{row[1]}"
        support = meta["input_token_ids_logprobs"]
        assert len(support) == len(row) and support[0] is None
        # position i: the distribution token i came from (podium's candidates at i - 1)
        assert [t[1] for t in support[1]] == [1, 6]
        assert [t[0] for t in support[1]] == outputs[CANDIDATE_LOGPROBS][b, 0].tolist()
        assert meta["id"] == f"r-{b}"


# ------------------------------------------------------------------ vLLM's token-in /inference/v1/generate

TOKENS = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1, "prompt_logprobs": 2}}


@pytest.mark.parametrize(("body", "field"), [
    ("ids", "body"),
    ({**TOKENS, "model": 7}, "model"),
    ({**TOKENS, "stream": True}, "stream"),
    ({**TOKENS, "features": "mm"}, "features"),
    ({"sampling_params": {"max_tokens": 1}}, "token_ids"),
    ({**TOKENS, "token_ids": []}, "token_ids"),
    ({**TOKENS, "token_ids": [[1, 2], [3]]}, "token_ids"),
    ({**TOKENS, "token_ids": [[1, 2]]}, "token_ids"),
    ({**TOKENS, "token_ids": "text"}, "token_ids"),
    ({**TOKENS, "token_ids": [1, 2.5]}, "token_ids"),
    ({"token_ids": [1, 2]}, "sampling_params"),
    ({**TOKENS, "sampling_params": [1]}, "sampling_params"),
    ({**TOKENS, "sampling_params": {"prompt_logprobs": 2}}, "sampling_params.max_tokens"),
    ({**TOKENS, "sampling_params": {"max_tokens": 4}}, "sampling_params.max_tokens"),
    ({**TOKENS, "sampling_params": {"max_tokens": "1"}}, "sampling_params.max_tokens"),
    ({**TOKENS, "sampling_params": {"max_tokens": 1, "n": 2}}, "sampling_params.n"),
    ({**TOKENS, "sampling_params": {"max_tokens": 1, "best_of": "2"}}, "sampling_params.best_of"),
    ({**TOKENS, "sampling_params": {"max_tokens": 1, "logit_bias": {"1": 3}}}, "sampling_params.logit_bias"),
    ({**TOKENS, "sampling_params": {"max_tokens": 1, "logprobs": 1}}, "sampling_params.logprobs"),
    ({**TOKENS, "sampling_params": {"max_tokens": 1, "prompt_logprobs": -1}}, "sampling_params.prompt_logprobs"),
])
def test_token_generate_refusals_name_the_field(body: Any, field: str) -> None:
    refused(parse_token_generate, body, field)


@pytest.mark.parametrize(("params", "field"), [
    ({"max_tokens": 0, "prompt_logprobs": VOCAB + 1}, "sampling_params.prompt_logprobs"),
    ({"max_tokens": 0, "temperature": -1}, "sampling_params.temperature"),
])
def test_token_generate_checks_name_the_sampling_field(params: Any, field: str) -> None:
    refused(lambda b: checked(parse_token_generate(b)), {"token_ids": [1, 2, 3], "sampling_params": params}, field)


def test_token_generate_answers_as_prime_rl_reads_it() -> None:
    """prime-rl's ``prefill_logprobs``: the top-level ``prompt_logprobs``, ``null`` first, each later
    position's map holding the prompt's own token (its logprob what prime-rl keeps) and the top k."""
    row = [5, 9, 2, 7]
    body = {"model": "m", "token_ids": row,
            "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "prompt_logprobs": 2}}
    form = parse_token_generate(body)
    outputs = teacher_outputs(form.call, 2)
    answer = json.loads(token_generate_response(form, row_answers(form.call, outputs), TokenNames(None),
                                                request_id="r1"))
    assert set(answer) == {"request_id", "choices", "prompt_logprobs", "prompt_token_id_logprobs",
                           "kv_transfer_params"}
    assert answer["request_id"] == "r1" and answer["prompt_token_id_logprobs"] is None
    (choice,) = answer["choices"]
    assert choice["token_ids"] == [int(outputs[TOPK_INDICES][0, len(row), 0])]
    got = answer["prompt_logprobs"]
    assert len(got) == len(row) and got[0] is None
    for i in range(1, len(row)):
        assert got[i][str(row[i])]["logprob"] == float(outputs[LOGPROBS][0, i])
        assert got[i][str(row[i])]["rank"] == int(outputs[TARGET_RANK][0, i])
        assert {int(t) for t in got[i]} == {row[i], *outputs[TOPK_INDICES][0, i, :2].tolist()}
    score_only = parse_token_generate({**body, "sampling_params": {"max_tokens": 0}})
    quiet = json.loads(token_generate_response(score_only, row_answers(score_only.call, teacher_outputs(
        score_only.call, 0)), TokenNames(None), request_id="r2"))
    assert quiet["choices"][0]["token_ids"] == [] and quiet["prompt_logprobs"] is None


def test_token_generate_without_detokenize_writes_no_token_text() -> None:
    """vLLM's ``sampling_params.detokenize: false`` (what token-in callers send): every
    ``decoded_token`` null, as vLLM leaves it; the numbers the same."""
    row = [5, 9, 2]
    params = {"max_tokens": 0, "prompt_logprobs": 2}
    plain = parse_token_generate({"token_ids": row, "sampling_params": params})
    bare = parse_token_generate({"token_ids": row, "sampling_params": {**params, "detokenize": False}})
    outputs = teacher_outputs(plain.call, 2)
    answers = [json.loads(token_generate_response(form, row_answers(form.call, outputs), TokenNames(None),
                                                  request_id="r"))["prompt_logprobs"] for form in (plain, bare)]
    for named, nameless in zip(answers[0][1:], answers[1][1:], strict=True):
        assert all(entry["decoded_token"] is None for entry in nameless.values())
        assert all(entry["decoded_token"].startswith("token_id:") for entry in named.values())
        assert {t: e["logprob"] for t, e in named.items()} == {t: e["logprob"] for t, e in nameless.items()}
    refused(parse_token_generate, {"token_ids": row, "sampling_params": {**params, "detokenize": 0}},
            "sampling_params.detokenize")


SCORE = {"token_ids": [5, 9, 2, 7, 11], "sampling_params": {"max_tokens": 1}}


def scoring(**params: Any) -> dict[str, Any]:
    return {**SCORE, "sampling_params": {**SCORE["sampling_params"], **params}}


@pytest.mark.parametrize(("body", "field"), [
    (scoring(prompt_logprob_start=1), "sampling_params.prompt_logprob_start"),
    (scoring(prompt_logprob_token_ids=[[1], [2], [3], [4]], prompt_logprob_start=-1),
     "sampling_params.prompt_logprob_start"),
    (scoring(prompt_logprob_token_ids=[1, 2, 3, 4]), "sampling_params.prompt_logprob_token_ids"),
    (scoring(prompt_logprob_token_ids=[]), "sampling_params.prompt_logprob_token_ids"),
    (scoring(prompt_logprob_token_ids=[[], [], [], []]), "sampling_params.prompt_logprob_token_ids"),
    (scoring(prompt_logprob_token_ids=[[1], [2], [3]]), "sampling_params.prompt_logprob_token_ids"),
    (scoring(prompt_logprob_token_ids=[[1], [2]], prompt_logprob_start=1), "sampling_params.prompt_logprob_token_ids"),
    (scoring(prompt_logprob_token_ids=[[1], [2], [True], [4]]), "sampling_params.prompt_logprob_token_ids"),
    (scoring(prompt_logprob_token_ids=[[1], [2], [3.0], [4]]), "sampling_params.prompt_logprob_token_ids"),
    (scoring(prompt_logprob_token_ids=[[1], [2], [2**70], [4]]), "sampling_params.prompt_logprob_token_ids"),
])
def test_teacher_scoring_refusals_name_the_field(body: Any, field: str) -> None:
    """vLLM's refusals of ``prompt_logprob_token_ids`` (its Rust frontend's ``LogprobsError``): empty,
    not ``[rows][ids]`` of integers, a row count other than ``prompt_len - 1 - prompt_logprob_start``,
    a start without the lists."""
    refused(parse_token_generate, body, field)


@pytest.mark.parametrize("bad", [-2, VOCAB])
def test_teacher_scoring_ids_outside_the_vocabulary_are_refused(bad: int) -> None:
    body = scoring(prompt_logprob_token_ids=[[1], [2, -1], [bad], [4]])
    message = refused(lambda b: checked(parse_token_generate(b)), body, "sampling_params.prompt_logprob_token_ids")
    assert f"id {bad} is outside the vocabulary" in message and "-1 pads" in message


def decode_npy(text: str) -> np.ndarray:
    """How vLLM's docs read ``prompt_token_id_logprobs``."""
    import base64
    import io

    return np.load(io.BytesIO(base64.b64decode(text)))


@pytest.mark.parametrize("start", [0, 2])
def test_teacher_scoring_answers_vllms_matrix(start: int) -> None:
    """Row ``j`` of the ``[rows, K]`` float32 matrix is the distribution after token ``start + j``
    (podium's candidate logprobs at next-token position ``start + j``) at that row's own ids, in
    their order; ``-1`` padding answers ``-inf``; ``prompt_logprobs`` beside it when asked."""
    row = SCORE["token_ids"]
    lists = [[3, 1, 4], [1], [5, 9], [2, 6, 5]][start:]
    form = parse_token_generate(scoring(prompt_logprob_token_ids=lists, prompt_logprob_start=start,
                                        prompt_logprobs=2))
    batch, query = checked(form)
    assert CANDIDATE_LOGPROBS in query.outputs and batch.candidate_ids is not None
    for j, ids in enumerate(lists):  # asked at next-token position start + j, padding computed on id 0
        assert batch.candidate_ids[0, start + j].tolist() == [*ids, *[0] * (3 - len(ids))]
    outputs = teacher_outputs(form.call, 2)
    answer = json.loads(token_generate_response(form, row_answers(form.call, outputs), TokenNames(None),
                                                request_id="r"))
    matrix = decode_npy(answer["prompt_token_id_logprobs"])
    assert matrix.dtype == np.float32 and matrix.shape == (len(lists), 3)
    for j, ids in enumerate(lists):
        assert matrix[j, :len(ids)].tolist() == outputs[CANDIDATE_LOGPROBS][0, start + j, :len(ids)].tolist()
        assert np.isneginf(matrix[j, len(ids):]).all()
    assert len(answer["prompt_logprobs"]) == len(row)  # prompt_logprobs as without the lists
    assert answer["choices"][0]["token_ids"] == [int(outputs[TOPK_INDICES][0, len(row), 0])]
