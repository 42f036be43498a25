"""SGLang's native ``POST /generate`` as slime and miles send it for teacher logprobs: the request
parsed into a :class:`~podium.protocol.scoring.ScoringCall`, the answer shaped as SGLang writes it.

What is served:

- ``input_ids``: one prompt (a list of ids: the answer is one object) or a batch (a list of lists:
  the answer is a list, in order); ``text`` likewise where the checkpoint has a tokenizer;
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
  ``sampling_params.temperature``: see :mod:`podium.protocol.scoring` (slime sends 0: greedy, unscaled);
- ``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num`` may be one value or one per prompt.

Refused (400, naming the field): ``stream``, ``image_data`` (podium teachers are text-only), a list
of ``sampling_params`` that differ. Other fields are ignored.
"""

from __future__ import annotations

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
    for field, why in (("stream", "podium answers whole (no streaming)"),
                       ("image_data", "podium teachers are text-only")):
        if body.get(field):
            raise FieldError(field, why)
    params = _sampling_params(body.get("sampling_params"))
    max_new = int_field(params, "max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS, lo=0)
    assert max_new is not None
    if max_new > 1:
        raise FieldError("sampling_params.max_new_tokens",
                         f"{max_new}{' (SGLang default)' if 'max_new_tokens' not in params else ''}: podium scores "
                         "and does not generate; send 0 (score the prompt) or 1 (and answer the most likely next "
                         "token)")
    if body.get("input_ids") is not None:
        field, value = "input_ids", body["input_ids"]
    elif body.get("text") is not None:
        field, value = "text", body["text"]
    else:
        raise FieldError("input_ids", "missing: send the token ids to score")
    rows, _ = token_rows(value, field, tokenize=tokenize)
    batched = isinstance(value, list) and bool(value) and isinstance(value[0], (list, str))
    n = len(rows)
    want = [bool(v) for v in _per_row(body, "return_logprob", n, False)]
    starts = [_start(v, len(row), b) for b, (v, row) in enumerate(zip(_per_row(body, "logprob_start_len", n, -1), rows,
                                                                           strict=True))]
    tops = [int_field({"top_logprobs_num": v}, "top_logprobs_num", 0, lo=0) or 0
            for v in _per_row(body, "top_logprobs_num", n, 0)]
    call = ScoringCall(rows=rows, top_k=max(tops), temperature=params.get("temperature"),
                       next_token=max_new == 1, candidates=_support(body.get("token_ids_logprob"), n),
                       ids_field=field, top_k_field="top_logprobs_num",
                       temperature_field="sampling_params.temperature")
    text_in = body.get("return_text_in_logprobs", False)
    if not isinstance(text_in, bool):
        raise FieldError("return_text_in_logprobs", f"must be true or false, got {brief(text_in)}")
    return GenerateForm(call=call, batched=batched, return_logprob=want, start=starts, top_k=tops,
                        max_new_tokens=max_new, text_in_logprobs=text_in, rid=body.get("rid"))


def _sampling_params(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, list):  # one per prompt: podium computes the batch alike
        if not value or any(v != value[0] for v in value):
            raise FieldError("sampling_params", "a list of sampling_params that differ; send one request per setting")
        value = value[0]
    if not isinstance(value, Mapping):
        raise FieldError("sampling_params", f"must be an object, got {brief(value)}")
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
