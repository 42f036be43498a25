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

**Teacher scoring** (vLLM's "Prompt Token ID Logprobs", ``docs/training/prompt_token_id_logprobs.md``;
vLLM PRs #54335, #56984): ``sampling_params.prompt_logprob_token_ids``, one candidate list per
scored causal row (ragged lists padded with ``-1``), and ``prompt_logprob_start`` (default 0), the
first row scored. There must be exactly ``len(token_ids) - 1 - prompt_logprob_start`` lists; row
``j`` is the distribution after token ``start + j`` (the one token ``start + j + 1`` came from),
its columns in the list's order. The answer's top-level ``prompt_token_id_logprobs`` is that
``[rows, K]`` float32 matrix as a base64 ``.npy`` (``np.load(io.BytesIO(b64decode(...)))``), ``-inf``
where a row was padded; ``null`` when not asked. One prefill (podium's candidate logprobs, the
group's ``get_logprobs_on_support``), alongside ``prompt_logprobs`` when both are asked. Refused as
vLLM refuses them: no non-empty list, an id outside ``-1..V-1``, a row count other than the
prompt's, ``prompt_logprob_start`` without the lists; the widest list over ``podium.server.max_top_k``
is a 413 (vLLM's bound is ``--max-logprobs``). ``temperature`` scales these logits as it scales
``prompt_logprobs`` (podium's rule; vLLM's default ``--logprobs-mode`` answers raw logprobs).

The rules are ``/v1/completions``' (:mod:`podium.protocol.openai_scoring`), with the sampling
fields inside ``sampling_params`` (named so in errors): ``max_tokens`` 0 or 1 (absent: vLLM's
default 16, refused), ``n`` / ``best_of`` 1, no ``logit_bias``; ``temperature`` as there. Refused
besides: ``stream``, multimodal ``features``, ``sampling_params.logprobs`` (the generated token's
logprobs in chat form: podium answers the prompt's), a batch of sequences (vLLM's route takes one).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from podium.protocol.oip import brief
from podium.protocol.openai_scoring import (
    OPENAI_DEFAULT_MAX_TOKENS,
    CompletionForm,
    check_max_tokens,
    check_one_choice,
    prompt_logprobs_json,
)
from podium.protocol.scoring import (
    FieldError,
    RowAnswer,
    ScoredRows,
    ScoringCall,
    TokenNames,
    dumps,
    int_field,
    token_rows,
)

PARAMS = "sampling_params"
TOKEN_IDS = "prompt_logprob_token_ids"
START = "prompt_logprob_start"
ANSWER = "prompt_token_id_logprobs"  # the response's field: base64 of the matrix's .npy
PAD_ID = -1


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
    scored = scored_rows(params, len(rows[0]))
    call = ScoringCall(rows=rows, top_k=k or 0, temperature=params.get("temperature"), rank=k is not None,
                       next_token=max_tokens == 1, ids_field="token_ids", top_k_field=f"{PARAMS}.prompt_logprobs",
                       temperature_field=f"{PARAMS}.temperature",
                       position_candidates=None if scored is None else scored.position_candidates(),
                       candidates_field=f"{PARAMS}.{TOKEN_IDS}")
    return CompletionForm(call=call, model=model, prompt_logprobs=k, logprobs=None, echo=False,
                          max_tokens=max_tokens, as_ids=False, return_token_ids=False, texts=None,
                          detokenize=detokenize, scored_rows=scored)


def scored_rows(params: Mapping[str, Any], prompt_len: int) -> ScoredRows | None:
    """The teacher-scoring request of ``sampling_params`` (see the module doc), or None: the lists
    padded with -1 to the widest; a :class:`FieldError` naming the field vLLM would refuse."""
    field, start_field = f"{PARAMS}.{TOKEN_IDS}", f"{PARAMS}.{START}"
    value = params.get(TOKEN_IDS)
    start = int_field(params, START, None, lo=0, named=start_field)
    if value is None:
        if start is not None:
            raise FieldError(start_field, f"needs {field} (the candidate ids of each scored row)")
        return None
    start = start or 0
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value) or all(not r for r in value):
        raise FieldError(field, "must be a non-empty integer array of shape [num_rows, num_ids]: one list of "
                                f"candidate ids per scored row, {PAD_ID} padding, got {brief(value)}")
    expected = max(prompt_len - 1 - start, 0)
    if len(value) != expected:
        raise FieldError(field, f"has {len(value)} rows, but the prompt has {expected} scored rows "
                                f"(prompt_len - 1 - {START} = {prompt_len} - 1 - {start})")
    ids = np.full((len(value), max(len(row) for row in value)), PAD_ID, dtype=np.int64)
    for j, row in enumerate(value):
        bad = next((v for v in row if type(v) is not int), None)  # bool is not an id
        if bad is not None:
            raise FieldError(field, f"row {j} holds {brief(bad)}, not a token id (an integer; {PAD_ID} pads a row)")
        try:
            ids[j, :len(row)] = row
        except OverflowError:
            raise FieldError(field, f"row {j} holds an id outside the vocabulary") from None
    return ScoredRows(start=start, ids=ids)


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
        ANSWER: None if form.scored_rows is None else npy_base64(form.scored_rows.answer(answer)),
        "kv_transfer_params": None,
    })


def npy_base64(matrix: np.ndarray) -> str:
    """``matrix`` as vLLM writes ``prompt_token_id_logprobs``: its ``.npy`` bytes, base64 (ASCII)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(matrix, dtype=np.float32), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
