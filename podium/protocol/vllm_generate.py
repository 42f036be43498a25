"""vLLM's token-in ``POST /inference/v1/generate`` as prime-rl's teacher sends it: one sequence of
token ids scored, the answer shaped as vLLM's ``GenerateResponse``.

prime-rl's orchestrator scores a sample by posting, through its ``AsyncOpenAI`` client (so with
the API key as ``Authorization: Bearer``), to the client's base URL without ``/v1`` +
``/inference/v1/generate``::

    {"model": ..., "token_ids": [...], "sampling_params": {"max_tokens": 1, "temperature": T,
     "top_p": 1.0, "prompt_logprobs": k}}

and reads the answer's top-level ``prompt_logprobs``: ``null`` first, then per position a map
from token id to ``{"logprob", "rank", "decoded_token"}`` holding the prompt's own token and the
top ``k`` (vLLM's ``Logprob``; the same maps as ``/v1/completions`` writes:
:func:`~podium.protocol.openai_scoring.prompt_logprobs_json`; ``decoded_token`` null with
``sampling_params.detokenize: false``, as vLLM writes it then). ``choices`` holds one choice whose
``token_ids`` is the most likely next token with ``max_tokens: 1`` (none with 0).

The rules are ``/v1/completions``' (:mod:`podium.protocol.openai_scoring`), with the sampling
fields inside ``sampling_params`` (named so in errors): ``max_tokens`` 0 or 1 (absent: vLLM's
default 16, refused), ``n`` / ``best_of`` 1, no ``logit_bias``; ``temperature`` as there. Refused
besides: ``stream``, multimodal ``features``, ``sampling_params.logprobs`` (the generated token's
logprobs in chat form: podium answers the prompt's), a batch of sequences (vLLM's route takes one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from podium.protocol.oip import brief
from podium.protocol.openai_scoring import (
    OPENAI_DEFAULT_MAX_TOKENS,
    CompletionForm,
    check_max_tokens,
    check_one_choice,
    prompt_logprobs_json,
)
from podium.protocol.scoring import FieldError, RowAnswer, ScoringCall, TokenNames, dumps, int_field, token_rows

PARAMS = "sampling_params"


def parse_token_generate(body: Any) -> CompletionForm:
    """An ``/inference/v1/generate`` request as the :class:`CompletionForm` its answer is built
    from (a :class:`FieldError` naming the field at fault)."""
    if not isinstance(body, Mapping):
        raise FieldError("body", f"must be a JSON object, got {brief(body)}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise FieldError("model", f"must be a string, got {brief(model)}")
    for field, why in (("stream", "podium answers whole (no streaming)"),
                       ("features", "podium teachers are text-only (no multimodal features)")):
        if body.get(field):
            raise FieldError(field, why)
    if "token_ids" not in body:
        raise FieldError("token_ids", "missing: send the token ids to score")
    value = body["token_ids"]
    rows, _ = token_rows(value, "token_ids", tokenize=None, allow_text=False)
    if len(rows) != 1 or not isinstance(value[0], int):
        raise FieldError("token_ids", "one sequence of token ids (a list of ints); send one request per sequence")
    params = body.get(PARAMS)
    if not isinstance(params, Mapping):
        raise FieldError(PARAMS, "missing: an object with max_tokens and prompt_logprobs" if params is None
                         else f"must be an object, got {brief(params)}")
    max_tokens = _param(params, "max_tokens", OPENAI_DEFAULT_MAX_TOKENS)
    assert max_tokens is not None
    check_max_tokens(max_tokens, f"{PARAMS}.max_tokens", None if "max_tokens" in params else "vLLM default")
    check_one_choice(params, prefix=f"{PARAMS}.")
    if params.get("logit_bias"):
        raise FieldError(f"{PARAMS}.logit_bias", "would change the logprobs podium answers; not supported")
    if params.get("logprobs") is not None:
        raise FieldError(f"{PARAMS}.logprobs", "the generated token's logprobs are not served: ask prompt_logprobs")
    k = _param(params, "prompt_logprobs", None, bool_as_int=True)
    detokenize = params.get("detokenize", True)
    if not isinstance(detokenize, bool):
        raise FieldError(f"{PARAMS}.detokenize", f"must be true or false, got {brief(detokenize)}")
    call = ScoringCall(rows=rows, top_k=k or 0, temperature=params.get("temperature"), rank=k is not None,
                       next_token=max_tokens == 1, ids_field="token_ids", top_k_field=f"{PARAMS}.prompt_logprobs",
                       temperature_field=f"{PARAMS}.temperature")
    return CompletionForm(call=call, model=model, prompt_logprobs=k, logprobs=None, echo=False,
                          max_tokens=max_tokens, as_ids=False, return_token_ids=False, texts=None,
                          detokenize=detokenize)


def _param(params: Mapping[str, Any], field: str, default: int | None, *, bool_as_int: bool = False) -> int | None:
    return int_field(params, field, default, lo=0, bool_as_int=bool_as_int, named=f"{PARAMS}.{field}")


def token_generate_response(form: CompletionForm, answers: Sequence[RowAnswer], names: TokenNames, *,
                            request_id: str) -> bytes:
    """vLLM's ``GenerateResponse`` (JSON bytes) for the one sequence."""
    (answer,) = answers
    generated = [] if answer.next_id is None else [answer.next_id]
    return dumps({
        "request_id": request_id,
        "choices": [{"index": 0, "logprobs": None, "finish_reason": "length", "token_ids": generated}],
        "prompt_logprobs": prompt_logprobs_json(form, answer, names) if form.prompt_logprobs is not None else None,
        "kv_transfer_params": None,
    })
