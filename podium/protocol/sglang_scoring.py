"""SGLang's native ``POST /generate`` as slime and miles send it for teacher logprobs: the request
parsed into a :class:`~podium.protocol.scoring.ScoringCall`, the answer shaped as SGLang writes it.

What is served:

- ``input_ids``: one prompt (a list of ids: the answer is one object) or a batch (a list of lists:
  the answer is a list, in order), token ids only (a string is refused, as SGLang refuses it);
  ``text`` (a text or a list) is tokenized where the checkpoint has a tokenizer, as SGLang does;
- ``return_logprob: true`` -> ``meta_info.input_token_logprobs``: ``[logprob, token_id, text]`` for
  each prompt position from ``logprob_start_len`` (default -1: the last position only, as SGLang),
  the logprob ``null`` at position 0; ``text`` is ``null`` unless ``return_text_in_logprobs``;
- ``top_logprobs_num: k`` -> ``meta_info.input_top_logprobs``: per position ``null`` (position 0)
  or the top ``k`` as ``[logprob, token_id, text]``, best first;
- ``token_ids_logprob: [ids]`` (one list for every prompt, or one per prompt) ->
  ``meta_info.input_token_ids_logprobs``: per position ``null`` (position 0) or those ids' logprobs
  in the same triples (the given-support scoring miles and verl ask for);
- ``sampling_params.max_new_tokens``: 0 (score only) or 1 (also the most likely next token, in
  ``output_ids`` and ``output_token_logprobs``); more is refused (podium scores and does not
  generate); absent, it is SGLang's default 128: refused the same way.
- the logprobs are unscaled, as stock SGLang's input logprobs are (its ``Req.temp_scaled_logprobs``
  is False), whatever ``sampling_params.temperature`` says (it is checked as SGLang checks it: a
  finite number >= 0). With ``podium_temp_scaled_logprobs: true`` (podium's own field) they come
  from the logits scaled by ``sampling_params.temperature`` (absent: SGLang's default 1; 0: greedy,
  unscaled), as :mod:`podium.protocol.scoring` scales vLLM's;
- ``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num`` may be one value or one per prompt.

Refused (400, naming the field): a field SGLang's ``GenerateReqInput`` does not have, or a
``sampling_params`` field its ``SamplingParams`` does not have (:data:`GENERATE_FIELDS`,
:data:`SAMPLING_FIELDS`: a misspelt field would be ignored); a field SGLang has whose answer podium
would not give (:data:`UNSERVED`: ``stream``, multimodal data, embeddings, LoRA, sessions...);
``sampling_params.n`` other than 1; a list of ``sampling_params`` that differ. The other fields
SGLang has are ignored (routing, caching, sampling-only settings).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from podium.protocol.oip import brief
from podium.protocol.scoring import (
    FieldError,
    RawJSON,
    RowAnswer,
    ScoringCall,
    TokenNames,
    dumps,
    format_rows,
    int_field,
    token_rows,
)

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # what SGLang generates when sampling_params names no max_new_tokens
# podium's own field: the logprobs from the logits scaled by sampling_params.temperature (SGLang's
# Req.temp_scaled_logprobs, which stock SGLang leaves False: its input logprobs are unscaled)
TEMP_SCALED_LOGPROBS = "podium_temp_scaled_logprobs"

# Every field of SGLang's GenerateReqInput (python/sglang/srt/managers/io_struct.py; ``session``:
# its earlier releases'): any other is refused as unknown, as a misspelt field would be ignored.
GENERATE_FIELDS = frozenset({
    "rid", "session_id", "text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data", "mm_hashes",
    "mm_content_hashes", "use_audio_in_video", "video_config", "sampling_params", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "return_sampling_mask", "return_text_in_logprobs",
    "return_flat_raw_top_logprobs", "return_flat_raw_top_logprobs_b64", "stream", "log_metrics",
    "return_hidden_states", "return_routed_experts", "routed_experts_start_len", "return_indexer_topk", "modalities",
    "session_params", "session", "lora_path", "lora_id", "custom_logit_processor", "positional_embed_overrides",
    "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank",
    "data_parallel_rank", "disagg_prefill_dp_rank", "kv_router_hint", "routing_key", "conversation_id",
    "http_worker_ipc", "background", "require_reasoning", "max_thinking_tokens", "priority", "extra_key", "no_logs",
    "custom_labels", "return_bytes", "return_entropy", "return_prompt_token_ids", "external_trace_header",
    "received_time", "need_wait_for_mm_inputs", "num_items_assigned", "encoder_urls", "max_dynamic_patch",
    "min_dynamic_patch", "image_max_dynamic_patch", "video_max_dynamic_patch", "images_config",
    "multi_item_delimiter_indices", "cache_salt", TEMP_SCALED_LOGPROBS,
})
# Every field a request may set of SGLang's SamplingParams (python/sglang/srt/sampling/sampling_params.py;
# SGLang refuses any other there too). Those that only steer sampling are accepted and ignored: a
# prompt's logprobs do not depend on them, and the next token podium answers is the most likely.
SAMPLING_FIELDS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed",
})
# Fields SGLang knows that podium refuses when set: ignored, they would make the answer another
# question's (other inputs, other weights, another context, another layout). Other known fields
# are ignored (routing, caching, metrics; extra outputs such as return_hidden_states, left out).
UNSERVED = {
    "stream": "podium answers whole (no streaming)",
    "input_embeds": "podium scores token ids (input_ids or text), not embeddings",
    "positional_embed_overrides": "podium scores token ids; embedding overrides would change the logprobs",
    "image_data": "podium teachers are text-only",
    "video_data": "podium teachers are text-only",
    "audio_data": "podium teachers are text-only",
    "lora_path": "podium serves the teacher's own weights (no LoRA adapters)",
    "lora_id": "podium serves the teacher's own weights (no LoRA adapters)",
    "session_params": "podium scores each request alone (no session context is prepended)",
    "session": "podium scores each request alone (no session context is prepended)",
    "multi_item_delimiter_indices": "podium scores every prompt position (no multi-item scoring)",
    "return_flat_raw_top_logprobs": "podium writes the top logprobs as SGLang's nested lists only",
    "return_flat_raw_top_logprobs_b64": "podium writes the top logprobs as SGLang's nested lists only",
}
VLLM_ONLY_HINT = ("; detokenize is vLLM's sampling parameter (podium honours it on /inference/v1/generate), "
                  "SGLang answers token text only with return_text_in_logprobs")


@dataclass(frozen=True)
class GenerateForm:
    """What the answer shows, beside the rows."""

    call: ScoringCall
    batched: bool  # a list of prompts: the answer is a list
    return_logprob: Sequence[bool]  # per prompt
    start: Sequence[int]  # per prompt: the first position whose logprobs are answered
    top_k: Sequence[int]  # per prompt
    max_new_tokens: int
    text_in_logprobs: bool
    rid: Any


def parse_generate(body: Any, tokenize: Callable[[str], list[int]] | None) -> GenerateForm:
    """A ``/generate`` request as a :class:`GenerateForm` (a :class:`FieldError` naming the field)."""
    if not isinstance(body, Mapping):
        raise FieldError("body", f"must be a JSON object, got {brief(body)}")
    _check_names(body, GENERATE_FIELDS, "", "SGLang's GenerateReqInput")
    for field, why in UNSERVED.items():
        if body.get(field):
            raise FieldError(field, why)
    params = _sampling_params(body.get("sampling_params"))
    max_new = int_field(params, "max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS, lo=0,
                        named="sampling_params.max_new_tokens")
    assert max_new is not None
    if max_new > 1:
        raise FieldError("sampling_params.max_new_tokens",
                         f"{max_new}{' (SGLang default)' if 'max_new_tokens' not in params else ''}: podium scores "
                         "and does not generate; send 0 (score the prompt) or 1 (and answer the most likely next "
                         "token)")
    if int_field(params, "n", 1, named="sampling_params.n") != 1:
        raise FieldError("sampling_params.n", "must be 1: podium answers one result per prompt")
    rows, batched, field = _prompts(body, tokenize)
    n = len(rows)
    want = [bool(v) for v in _per_row(body, "return_logprob", n, False)]
    starts = [_start(v, len(row), b) for b, (v, row) in enumerate(zip(_per_row(body, "logprob_start_len", n, -1), rows,
                                                                           strict=True))]
    tops = [int_field({"top_logprobs_num": v}, "top_logprobs_num", 0, lo=0) or 0
            for v in _per_row(body, "top_logprobs_num", n, 0)]
    call = ScoringCall(rows=rows, top_k=max(tops), temperature=_temperature(body, params),
                       next_token=max_new == 1, candidates=_support(body.get("token_ids_logprob"), n),
                       ids_field=field, top_k_field="top_logprobs_num",
                       temperature_field="sampling_params.temperature")
    return GenerateForm(call=call, batched=batched, return_logprob=want, start=starts, top_k=tops,
                        max_new_tokens=max_new, text_in_logprobs=_flag(body, "return_text_in_logprobs"),
                        rid=body.get("rid"))


def _check_names(body: Mapping[str, Any], known: frozenset[str], prefix: str, whose: str) -> None:
    """A :class:`FieldError` naming every field of ``body`` not in ``known`` (a misspelt field
    would otherwise be an answer to another question)."""
    unknown = sorted(str(name) for name in body if name not in known)
    if unknown:
        names = ", ".join(prefix + name for name in unknown)
        raise FieldError(names, f"unknown field{'s' if len(unknown) > 1 else ''}: not in {whose}"
                                f"{VLLM_ONLY_HINT if 'detokenize' in unknown else ''}")


def _prompts(body: Mapping[str, Any], tokenize: Callable[[str], list[int]] | None) -> tuple[list[list[int]], bool, str]:
    """The prompt rows (``input_ids``: token ids only; ``text``: tokenized, as SGLang does), whether
    they are a batch, and the field they came from."""
    if body.get("input_ids") is not None and body.get("text") is not None:
        raise FieldError("text", "send one of input_ids and text, not both")
    if body.get("input_ids") is not None:
        field, value = "input_ids", body["input_ids"]
        rows, _ = token_rows(value, field, tokenize=None, allow_text=False)
    elif body.get("text") is not None:
        field, value = "text", body["text"]
        if not isinstance(value, str) and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise FieldError("text", f"must be a text or a list of texts, got {brief(value)}")
        rows, _ = token_rows(value, field, tokenize=tokenize)
    else:
        raise FieldError("input_ids", "missing: send the token ids to score")
    return rows, isinstance(value, list) and bool(value) and isinstance(value[0], (list, str)), field


def _temperature(body: Mapping[str, Any], params: Mapping[str, Any]) -> Any:
    """The temperature the logprobs come from: 1 (unscaled, as SGLang's input logprobs are), or,
    with :data:`TEMP_SCALED_LOGPROBS`, ``sampling_params.temperature`` (SGLang's default 1; 0:
    greedy, unscaled; checked by :meth:`ScoringCall.ask`). Unscaled, the temperature is still
    checked as SGLang checks it (a finite number >= 0)."""
    temperature = params.get("temperature")
    if _flag(body, TEMP_SCALED_LOGPROBS):
        return 1.0 if temperature is None else temperature
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                    or not 0 <= temperature < math.inf):
        raise FieldError("sampling_params.temperature", f"must be a finite number >= 0, got {brief(temperature)}")
    return 1.0


def _flag(body: Mapping[str, Any], field: str) -> bool:
    value = body.get(field, False)
    if not isinstance(value, bool):
        raise FieldError(field, f"must be true or false, got {brief(value)}")
    return value


def _sampling_params(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, list):  # one per prompt: podium computes the batch alike
        if not value or any(v != value[0] for v in value):
            raise FieldError("sampling_params", "a list of sampling_params that differ; send one request per setting")
        value = value[0]
    if not isinstance(value, Mapping):
        raise FieldError("sampling_params", f"must be an object, got {brief(value)}")
    _check_names(value, SAMPLING_FIELDS, "sampling_params.", "SGLang's SamplingParams")
    return value


def _per_row(body: Mapping[str, Any], field: str, rows: int, default: Any) -> list[Any]:
    value = body.get(field)
    if value is None:
        return [default] * rows
    if isinstance(value, list):
        if len(value) != rows:
            raise FieldError(field, f"{len(value)} values for {rows} prompts")
        return [default if v is None else v for v in value]
    return [value] * rows


def _start(value: Any, length: int, row: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError("logprob_start_len", f"must be an integer, got {brief(value)}")
    if value == -1:
        return length - 1  # SGLang's default: the last prompt position only
    if not 0 <= value < length:
        raise FieldError("logprob_start_len",
                         f"{value} for prompt {row} of {length} tokens: not in -1 or 0..{length - 1}")
    return value


def _support(value: Any, rows: int) -> list[list[int]] | None:
    """``token_ids_logprob``: one id list for every prompt, or one per prompt (equally long)."""
    if value is None:
        return None
    lists = value if isinstance(value, list) and value and all(isinstance(v, list) for v in value) else [value] * rows
    if len(lists) != rows:
        raise FieldError("token_ids_logprob", f"{len(lists)} id lists for {rows} prompts")
    for ids in lists:
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise FieldError("token_ids_logprob", f"must be a non-empty list of token ids, got {brief(ids)}")
    if len({len(ids) for ids in lists}) != 1:
        raise FieldError("token_ids_logprob", "per-prompt id lists of different lengths; send one request per length")
    return lists


def generate_response(form: GenerateForm, answers: Sequence[RowAnswer], names: TokenNames, *,
                      request_id: str) -> bytes:
    """SGLang's answer (JSON bytes): one object, or a list for a batch."""
    results = [_result(form, b, answer, names, request_id) for b, answer in enumerate(answers)]
    return dumps(results if form.batched else results[0])


def _result(form: GenerateForm, b: int, answer: RowAnswer, names: TokenNames, request_id: str) -> dict[str, Any]:
    generated = [] if answer.next_id is None else [answer.next_id]
    meta: dict[str, Any] = {
        "id": form.rid if form.rid is not None and not form.batched else f"{request_id}-{b}",
        "finish_reason": {"type": "length", "length": form.max_new_tokens},
        "prompt_tokens": len(answer.ids), "completion_tokens": len(generated), "cached_tokens": 0,
    }
    if not form.return_logprob[b]:
        return {"text": names.text(generated), "output_ids": generated, "meta_info": meta}
    start, k = form.start[b], form.top_k[b]
    text = names if form.text_in_logprobs else None
    # SGLang answers no logprob at the first answered position, whatever logprob_start_len: its
    # triple's logprob is null, its top and given-support lists are null
    first_id = int(answer.ids[start])
    first = f"[null,{first_id},{'null' if text is None else text.json_names([first_id])[0]}]"
    rest = _triples(answer.ids[start + 1:, None], answer.logprobs[start + 1:, None], text, open_="", close="")
    meta["input_token_logprobs"] = RawJSON("[" + ",".join([first, *rest]) + "]")
    meta["output_token_logprobs"] = RawJSON("[" + ",".join(_triples(
        np.array([generated], dtype=np.int64).reshape(1, -1),
        np.array([[answer.next_logprob]] if generated else [[]], dtype=np.float32), text, open_="", close="")) + "]")
    if k:  # SGLang writes the top lists only for top_logprobs_num > 0
        top_ids = answer.top_ids if answer.top_ids is not None else np.zeros((len(answer.ids), 0), dtype=np.int64)
        top_lps = answer.top_logprobs if answer.top_logprobs is not None else np.zeros(top_ids.shape, np.float32)
        meta["input_top_logprobs"] = _null_first(_triples(top_ids[start:, :k], top_lps[start:, :k], text))
        next_top = [] if answer.next_top_ids is None or answer.next_top_logprobs is None else _triples(
            answer.next_top_ids[None, :k], answer.next_top_logprobs[None, :k], text)
        meta["output_top_logprobs"] = RawJSON("[" + ",".join(next_top if generated else []) + "]")
    if form.call.candidates is not None and answer.candidate_logprobs is not None:
        values = answer.candidate_logprobs[start:]
        support = np.broadcast_to(np.asarray(form.call.candidates[b], dtype=np.int64), values.shape)
        meta["input_token_ids_logprobs"] = _null_first(_triples(support, values, text))
    return {"text": names.text(generated), "output_ids": generated, "meta_info": meta}


def _triples(ids: np.ndarray, logprobs: np.ndarray, names: TokenNames | None, *, open_: str = "[",
             close: str = "]") -> list[str]:
    """Per row of ``ids`` / ``logprobs`` (``[rows, width]``), SGLang's ``[logprob, token_id, text]``
    triples as JSON text (``text``: the token's name, or ``null`` without ``names``)."""
    if not ids.size:
        return [open_ + close] * len(ids)
    if names is None:
        return format_rows("[%r,%d,null]", [logprobs, ids], open_=open_, close=close)
    text = np.array(names.json_names(ids.ravel().tolist()), dtype=object).reshape(ids.shape)
    return format_rows("[%r,%d,%s]", [logprobs, ids, text], open_=open_, close=close)


def _null_first(rows: list[str]) -> RawJSON:
    """``rows`` as a JSON list, the first (the first answered position: SGLang's padding) null."""
    return RawJSON("[" + ",".join(["null", *rows[1:]]) + "]")
