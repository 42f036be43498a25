"""vLLM's OpenAI-compatible ``POST /v1/completions`` as scoring trainers send it: the request parsed
into a :class:`~podium.protocol.scoring.ScoringCall`, the answer shaped as vLLM writes it.

What is served (verl's and TRL's teacher calls, and prime-rl's before its token-in route):

- ``prompt``: token ids, a batch of them, or text (a batch of texts) where the teacher's checkpoint
  has a tokenizer (``add_special_tokens``, default true, as vLLM); one choice per prompt, in order;
- ``prompt_logprobs: k`` (vLLM's extra parameter; ``true`` is 1) -> ``choices[i].prompt_logprobs``:
  as long as the prompt, ``null`` first, then per position a map from the token id (a string, as
  JSON writes vLLM's int keys) to ``{"logprob", "rank", "decoded_token"}``, holding the prompt's
  own token (its rank in the whole vocabulary) first, then the top ``k`` (ranks ``1..k``);
- the OpenAI legacy form, ``echo: true`` with ``logprobs: k`` -> ``choices[i].logprobs`` with
  ``tokens``, ``token_logprobs`` (``null`` first), ``top_logprobs`` (``null`` first, then the own
  token and the top ``k`` by their text) and ``text_offset``; without ``echo``, ``logprobs`` covers
  the generated token only;
- ``max_tokens``: 0 (score only) or 1 (also the most likely next token, greedy); more is refused:
  podium scores and does not generate. Absent, it is OpenAI's default 16: refused the same way;
- tokens are written ``token_id:<id>`` where the checkpoint has no tokenizer or the request asks
  (``return_tokens_as_token_ids``); ``return_token_ids`` adds ``prompt_token_ids`` / ``token_ids``;
- ``temperature``: see :mod:`podium.protocol.scoring`.

vLLM's token-in ``POST /inference/v1/generate`` (prime-rl's teacher call) is the same scoring in
another request shape: :mod:`podium.protocol.vllm_generate`.

Refused (400, naming the field): ``n``/``best_of`` other than 1, ``stream``, ``suffix``, a
non-empty ``logit_bias`` (it would change the processed logprobs), vLLM's teacher-scoring fields
``prompt_logprob_token_ids`` / ``prompt_logprob_start`` (vLLM serves them on its token-in route only;
ignored, a caller would read a missing matrix). Sampling fields that cannot
change a prompt's logprobs (``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, penalties...) and
unknown fields are ignored, as vLLM does.
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
    ScoredRows,
    ScoringCall,
    TokenNames,
    dumps,
    format_rows,
    int_field,
    json_list,
    json_logprob,
    token_rows,
)

# vLLM's teacher scoring (podium.protocol.vllm_generate): not an OpenAI-compatible route's field in
# vLLM; refused here rather than ignored, so a caller never takes a missing matrix for an answer.
TOKEN_ID_SCORING_FIELDS = ("prompt_logprob_token_ids", "prompt_logprob_start")
OPENAI_DEFAULT_MAX_TOKENS = 16  # what an OpenAI completion generates when max_tokens is absent
REFUSED = {
    "stream": "podium answers whole (no streaming)",
    "suffix": "podium scores and does not generate: no suffix",
}


@dataclass(frozen=True)
class CompletionForm:
    """What the answer shows, beside the rows (the parsed request's shape)."""

    call: ScoringCall
    model: str | None
    prompt_logprobs: int | None  # k of choices[i].prompt_logprobs, or None
    logprobs: int | None  # k of the legacy choices[i].logprobs, or None
    echo: bool
    max_tokens: int
    as_ids: bool  # return_tokens_as_token_ids
    return_token_ids: bool
    texts: Sequence[str] | None  # the prompts as sent, when text
    detokenize: bool = True  # vLLM's sampling parameter: false, no token text (decoded_token null)
    scored_rows: ScoredRows | None = None  # vLLM's prompt_logprob_token_ids (/inference/v1/generate only)


def check_max_tokens(value: int, field: str, default: str | None) -> None:
    """podium scores and does not generate: ``max_tokens`` 0 or 1 (a :class:`FieldError` naming
    ``field``; ``default``: whose default the value is, when the request did not send it)."""
    if value > 1:
        raise FieldError(field, f"{value}{f' ({default})' if default else ''}: podium scores and does not "
                                "generate; send max_tokens 0 (score the prompt) or 1 (and answer the most likely next "
                                "token)")


def parse_completion(body: Any, tokenize: Callable[[str, bool], list[int]] | None) -> CompletionForm:
    """A ``/v1/completions`` request as a :class:`CompletionForm` (a :class:`FieldError` naming the
    field at fault). ``tokenize(text, add_special_tokens)``: the teacher's tokenizer, or None."""
    if not isinstance(body, Mapping):
        raise FieldError("body", f"must be a JSON object, got {brief(body)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise FieldError("model", f"must be a string, got {brief(model)}")
    max_tokens = int_field(body, "max_tokens", OPENAI_DEFAULT_MAX_TOKENS, lo=0)
    assert max_tokens is not None
    check_max_tokens(max_tokens, "max_tokens", None if "max_tokens" in body else "OpenAI default")
    check_one_choice(body)
    for field, why in REFUSED.items():
        if body.get(field):
            raise FieldError(field, why)
    if body.get("logit_bias"):
        raise FieldError("logit_bias", "would change the logprobs podium answers; not supported")
    for field in TOKEN_ID_SCORING_FIELDS:
        if body.get(field) is not None:
            raise FieldError(field, "vLLM's teacher scoring is served on /inference/v1/generate (in its "
                                    "sampling_params), not on the OpenAI-compatible routes (as vLLM)")
    echo, as_ids, want_ids, special = (_bool(body, name, default) for name, default in (
        ("echo", False), ("return_tokens_as_token_ids", False), ("return_token_ids", False),
        ("add_special_tokens", True)))
    if "prompt" not in body:
        raise FieldError("prompt", "missing: send the token ids to score")
    text_tokenize = None if tokenize is None else (lambda text: tokenize(text, special))
    rows, was_text = token_rows(body["prompt"], "prompt", tokenize=text_tokenize)
    prompt_k = int_field(body, "prompt_logprobs", None, lo=0, bool_as_int=True)
    legacy_k = int_field(body, "logprobs", None, lo=0, bool_as_int=True)
    top_field = "prompt_logprobs" if (prompt_k or 0) >= (legacy_k or 0) else "logprobs"
    call = ScoringCall(rows=rows, top_k=max(prompt_k or 0, legacy_k or 0), temperature=body.get("temperature"),
                       rank=prompt_k is not None, next_token=max_tokens == 1, ids_field="prompt",
                       top_k_field=top_field)
    texts = None
    if was_text:
        prompt = body["prompt"]
        texts = [prompt] if isinstance(prompt, str) else list(prompt)
    return CompletionForm(call=call, model=model, prompt_logprobs=prompt_k, logprobs=legacy_k, echo=echo,
                          max_tokens=max_tokens, as_ids=as_ids, return_token_ids=want_ids, texts=texts)


def check_one_choice(body: Mapping[str, Any], prefix: str = "") -> None:
    """``n`` / ``best_of`` of 1 only (a :class:`FieldError` naming ``prefix + field``)."""
    for field in ("n", "best_of"):
        if int_field(body, field, 1, named=prefix + field) != 1:
            raise FieldError(prefix + field, "must be 1: podium answers one choice per prompt")


def _bool(body: Mapping[str, Any], field: str, default: bool) -> bool:
    value = body.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FieldError(field, f"must be true or false, got {brief(value)}")
    return value


def completion_response(form: CompletionForm, answers: Sequence[RowAnswer], names: TokenNames, *, model: str,
                        request_id: str, created: int) -> bytes:
    """The ``text_completion`` answer (JSON bytes), one choice per prompt."""
    choices = [_choice(form, i, answer, names) for i, answer in enumerate(answers)]
    prompt_tokens = sum(len(a.ids) for a in answers)
    completion_tokens = form.max_tokens * len(answers)
    return dumps({
        "id": f"cmpl-{request_id}", "object": "text_completion", "created": created, "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


def _choice(form: CompletionForm, index: int, answer: RowAnswer, names: TokenNames) -> dict[str, Any]:
    generated = [] if answer.next_id is None else [answer.next_id]
    text = names.text(generated)
    if form.echo:
        prompt_text = form.texts[index] if form.texts is not None else names.text(answer.ids.tolist())
        text = prompt_text + text
    return {
        "index": index, "text": text,
        "logprobs": _legacy_logprobs(form, answer, names) if form.logprobs is not None else None,
        "finish_reason": "length", "stop_reason": None,
        "prompt_logprobs": prompt_logprobs_json(form, answer, names) if form.prompt_logprobs is not None else None,
        "prompt_token_ids": json_list(answer.ids.tolist()) if form.return_token_ids else None,
        "token_ids": generated if form.return_token_ids else None,
    }


def prompt_logprobs_json(form: CompletionForm, answer: RowAnswer, names: TokenNames) -> RawJSON:
    """vLLM's ``prompt_logprobs``: ``null``, then per position a map holding the prompt's own token
    first, then the top k (the own token once: left out of the top k where it is among them)."""
    k = form.prompt_logprobs or 0
    ids = answer.ids[1:, None]
    ranks = answer.ranks[1:, None] if answer.ranks is not None else np.full(ids.shape, "null", dtype=object)
    own = [ids, answer.logprobs[1:, None], ranks]
    texts = np.empty(len(ids), dtype=object)
    if not (k and answer.top_ids is not None and answer.top_logprobs is not None):
        texts[:] = _entries(own, names, form)
        return RawJSON("[" + ",".join(["null", *texts.tolist()]) + "]")
    top_ids = answer.top_ids[1:, :k]
    top = [top_ids, answer.top_logprobs[1:, :k], np.broadcast_to(np.arange(1, top_ids.shape[1] + 1), top_ids.shape)]
    twice = top_ids == ids  # the own token among the top k: written once, first
    apart = ~twice.any(axis=1)
    texts[apart] = _entries([np.concatenate([o[apart], t[apart]], axis=1) for o, t in zip(own, top, strict=True)],
                            names, form)
    among = ~apart
    others = np.argsort(twice[among], axis=1, kind="stable")[:, :top_ids.shape[1] - 1]  # the rest, in order
    texts[among] = _entries([np.concatenate([o[among], np.take_along_axis(t[among], others, axis=1)], axis=1)
                             for o, t in zip(own, top, strict=True)], names, form)
    return RawJSON("[" + ",".join(["null", *texts.tolist()]) + "]")


def _entries(columns: list[np.ndarray], names: TokenNames, form: CompletionForm) -> list[str]:
    """Each row's ``{"<id>":{"logprob":..,"rank":..,"decoded_token":..},...}`` (vLLM's ``Logprob`` by
    id; ``decoded_token`` null without ``detokenize``, as vLLM leaves it)."""
    if not len(columns[0]):
        return []
    if not form.detokenize:
        return format_rows('"%d":{"logprob":%r,"rank":%s,"decoded_token":null}', columns, open_="{", close="}")
    if form.as_ids or names.tokenizer is None:  # the name is the id again: no per-token work
        return format_rows('"%d":{"logprob":%r,"rank":%s,"decoded_token":"token_id:%d"}', [*columns, columns[0]],
                           open_="{", close="}")
    text = np.array(names.json_names(columns[0].ravel().tolist()), dtype=object).reshape(columns[0].shape)
    return format_rows('"%d":{"logprob":%r,"rank":%s,"decoded_token":%s}', [*columns, text], open_="{", close="}")


def _legacy_logprobs(form: CompletionForm, answer: RowAnswer, names: TokenNames) -> dict[str, Any]:
    """The OpenAI legacy ``logprobs``: the prompt's tokens (with ``echo``) and the generated one."""
    k = form.logprobs or 0
    steps: list[tuple[int, float | None, Any, Any]] = []  # (id, logprob, top ids, top logprobs)
    if form.echo:
        top_ids = answer.top_ids if k and answer.top_ids is not None else None
        top_lps = answer.top_logprobs if k and answer.top_logprobs is not None else None
        for i, (tid, lp) in enumerate(zip(answer.ids.tolist(), answer.logprobs.tolist(), strict=True)):
            steps.append((tid, None if i == 0 else lp, None if top_ids is None else top_ids[i],
                          None if top_lps is None else top_lps[i]))
    if answer.next_id is not None:
        steps.append((answer.next_id, answer.next_logprob, answer.next_top_ids if k else None,
                      answer.next_top_logprobs if k else None))
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offsets: list[int] = []
    at = 0
    for tid, lp, t_ids, t_lps in steps:
        name = names.name(tid, form.as_ids)
        tokens.append(name)
        offsets.append(at)
        at += len(name)
        token_logprobs.append(None if lp is None else json_logprob(lp))
        if lp is None:
            top_logprobs.append(None)
            continue
        top = {name: json_logprob(lp)}
        if t_ids is not None and t_lps is not None:
            for tid2, lp2 in zip(np.asarray(t_ids)[:k].tolist(), np.asarray(t_lps)[:k].tolist(), strict=True):
                top.setdefault(names.name(tid2, form.as_ids), json_logprob(lp2))
        top_logprobs.append(top)
    return {"text_offset": json_list(offsets), "token_logprobs": json_list(token_logprobs),
            "tokens": json_list(tokens), "top_logprobs": json_list(top_logprobs)}


def models_response(names: Sequence[str], *, root: str | None, max_model_len: int | None, vocab_size: int,
                    created: int) -> bytes:
    """``GET /v1/models``: every name the teacher answers to, as vLLM lists its served model."""
    data = [{"id": name, "object": "model", "created": created, "owned_by": "podium", "root": root or name,
             "parent": None, "max_model_len": max_model_len, "vocab_size": vocab_size} for name in names]
    return dumps({"object": "list", "data": data})
