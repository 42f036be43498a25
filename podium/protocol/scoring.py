"""What the scoring fronts share (vLLM's OpenAI-compatible completions, SGLang's ``/generate``):
token rows in, a checked (:class:`~podium.protocol.batch.Batch`, :class:`~podium.protocol.query.Query`)
out, the answer's rows back, and the names tokens are written with.

A front parses its JSON into a :class:`ScoringCall` (its own fields, its own names);
:meth:`ScoringCall.ask` turns it into the batch and query podium's OIP route would build, through
the same :func:`~podium.protocol.batch.validate_batch` and :func:`~podium.protocol.query.ask`, and
a refusal names the *front's* field (a :class:`FieldError`). Each row's answer, in podium's
alignment (position ``i``: token ``i``), is a :class:`RowAnswer`.

The fronts' rules, each here once:

- **temperature**: scales the logits the logprobs come from (vLLM's processed logprobs, what TRL
  configures); ``0`` is greedy decoding, whose logits are not scaled (``T = 1``); absent, the
  teacher's own (its recipe's ``generation.temperature``);
- **the next token** (``max_tokens: 1``): the most likely token after the prompt, the argmax of the
  last position's distribution; the row is sent one placeholder id longer so that distribution is
  computed (podium computes a position's distribution only for a token that follows it);
- **logprobs as JSON**: ``-inf`` becomes :data:`MIN_JSON_LOGPROB`, vLLM's floor (JSON has no infinity);
  each is written as ``json.dumps`` writes the float (it parses back to the teacher's float32). The
  long per-position parts of an answer are built as JSON text, one ``%`` format per position over
  whole arrays (:func:`format_rows`, :meth:`TokenNames.json_names`): building nested dicts for
  ``json.dumps`` cost several times more, and it is what bounds a front's tokens/s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from podium.protocol.batch import Batch, BatchError, validate_batch
from podium.protocol.names import (
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    LOGPROBS,
    TARGET_RANK,
    TEMPERATURE,
    TOPK_INDICES,
    TOPK_LOGPROBS,
)
from podium.protocol.oip import brief
from podium.protocol.query import Query, ask

MIN_JSON_LOGPROB = -9999.0  # vLLM's floor for a logprob written as JSON (-inf has no JSON form)
PLACEHOLDER_ID = 0  # the id a row is extended by to compute the distribution after its last token
TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids: a token written as token_id:<id>


class FieldError(BatchError):
    """A request the front refuses, naming the front's field (answered 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}", field)
        self.field = field


@dataclass(frozen=True)
class ScoringCall:
    """A front's request in podium's terms (its field names kept for its errors)."""

    rows: Sequence[Sequence[int]]  # each prompt's token ids
    top_k: int = 0  # the widest top-k the answer shows (0: none)
    temperature: Any = None  # as sent (checked by ask); None: the teacher's
    rank: bool = False  # the rank of each prompt token (vLLM's prompt-logprob ``rank``)
    next_token: bool = False  # also the most likely token after each prompt
    candidates: Sequence[Sequence[int]] | None = None  # per row: ids scored at every position
    # Or ids per position: int [B, P, C] (P <= the longest row), next-token alignment (position t: ids
    # scored against the distribution after token t), -1 a padding entry (computed on id 0; its answer
    # is the front's to mask); checked against the vocabulary, refusals naming ``candidates_field``.
    position_candidates: np.ndarray | None = None
    ids_field: str = "prompt"
    top_k_field: str = "logprobs"
    temperature_field: str = TEMPERATURE
    candidates_field: str = CANDIDATE_IDS

    def ask(self, *, vocab_size: int, max_sequence_length: int | None) -> tuple[Batch, Query]:
        """The checked batch and query (a :class:`FieldError` naming the field at fault)."""
        extra = 1 if self.next_token else 0
        width = max(len(row) for row in self.rows) + extra
        ids = np.zeros((len(self.rows), width), dtype=np.int64)
        for b, row in enumerate(self.rows):
            ids[b, :len(row)] = row
        lengths = np.array([len(row) + extra for row in self.rows], dtype=np.int64)
        cands = None
        if self.candidates is not None:
            support = np.asarray(self.candidates, dtype=np.int64)  # [B, C], the same at every position
            cands = np.broadcast_to(support[:, None, :], (len(self.rows), width, support.shape[1]))
        elif self.position_candidates is not None:
            given = np.asarray(self.position_candidates, dtype=np.int64)
            outside = (given < -1) | (given >= vocab_size)
            if outside.any():
                b, t, c = (int(x[0]) for x in np.nonzero(outside))
                raise FieldError(self.candidates_field, f"id {int(given[b, t, c])} is outside the vocabulary "
                                                        f"(0..{vocab_size - 1}; -1 pads a row)")
            cands = np.zeros((len(self.rows), width, given.shape[2]), dtype=np.int64)
            cands[:, :given.shape[1]] = np.maximum(given, 0)
        try:
            batch = validate_batch(ids, lengths, vocab_size=vocab_size, max_sequence_length=max_sequence_length,
                                   candidate_ids=cands)
        except BatchError as exc:
            raise FieldError(self.ids_field, str(exc)) from None
        k = self.top_k or (1 if self.next_token else 0)
        outputs = [LOGPROBS, *((TOPK_LOGPROBS, TOPK_INDICES) if k else ()), *((TARGET_RANK,) if self.rank else ()),
                   *((CANDIDATE_LOGPROBS,) if cands is not None else ())]
        temperature = self.temperature
        if temperature == 0 and not isinstance(temperature, bool):
            temperature = 1.0  # greedy: the logits unscaled
        try:
            query = ask(outputs=outputs, top_k=k or None, temperature=temperature, candidates=cands is not None,
                        vocab_size=vocab_size)
        except BatchError as exc:
            field = self.temperature_field if exc.param == TEMPERATURE else self.top_k_field
            raise FieldError(field, str(exc)) from None
        return batch, query


@dataclass(frozen=True)
class RowAnswer:
    """One row's answer (prompt positions only; ``next_*``: the token after the prompt, when asked)."""

    ids: np.ndarray  # [n] the prompt's ids
    logprobs: np.ndarray  # [n] float32, 0 at 0
    top_ids: np.ndarray | None  # [n, k] or None
    top_logprobs: np.ndarray | None  # [n, k] or None
    ranks: np.ndarray | None  # [n] or None
    candidate_logprobs: np.ndarray | None  # [n, C] (position i: the distribution token i came from) or None
    next_id: int | None = None
    next_logprob: float | None = None
    next_top_ids: np.ndarray | None = None  # [k]
    next_top_logprobs: np.ndarray | None = None


@dataclass(frozen=True)
class ScoredRows:
    """vLLM's teacher scoring (``prompt_logprob_token_ids``): causal rows ``start .. n - 2`` of a
    prompt of ``n`` tokens, row ``j`` (the distribution after token ``start + j``, the one token
    ``start + j + 1`` came from) scored at its own candidate ids; ``ids`` int64 ``[n - 1 - start, K]``,
    -1 padding a shorter row (answered ``-inf``)."""

    start: int
    ids: np.ndarray

    def position_candidates(self, rows: int = 1) -> np.ndarray:
        """The ids as :attr:`ScoringCall.position_candidates` ``[rows, start + R, K]`` (the rows
        before ``start`` unscored: -1)."""
        out = np.full((rows, self.start + self.ids.shape[0], self.ids.shape[1]), -1, dtype=np.int64)
        out[:, self.start:] = self.ids
        return out

    def answer(self, answer: RowAnswer) -> np.ndarray:
        """The float32 ``[R, K]`` matrix from a row's answer: row ``j`` is the distribution token
        ``start + j + 1`` came from (:attr:`RowAnswer.candidate_logprobs`' alignment), -inf where padded."""
        assert answer.candidate_logprobs is not None, "the call asked for candidate logprobs"
        rows = self.ids.shape[0]
        scores = np.array(answer.candidate_logprobs[self.start + 1:self.start + 1 + rows], dtype=np.float32)
        scores[self.ids < 0] = -np.inf
        return scores


def row_answers(call: ScoringCall, outputs: Mapping[str, np.ndarray]) -> list[RowAnswer]:
    """Each row's answer from the query's outputs ``[B, width, ...]`` (podium's alignment), cut to
    the prompt (and the next token taken from the placeholder's position)."""
    answers = []
    top_ids, top_lps = outputs.get(TOPK_INDICES), outputs.get(TOPK_LOGPROBS)
    ranks, cands = outputs.get(TARGET_RANK), outputs.get(CANDIDATE_LOGPROBS)
    k = call.top_k
    for b, row in enumerate(call.rows):
        n = len(row)
        shifted = None
        if cands is not None:  # next-token alignment -> position i: the distribution token i came from
            shifted = np.zeros((n, cands.shape[-1]), dtype=np.float32)
            shifted[1:] = cands[b, :n - 1]
        answer = RowAnswer(
            ids=np.asarray(row, dtype=np.int64), logprobs=outputs[LOGPROBS][b, :n],
            top_ids=top_ids[b, :n, :k] if top_ids is not None and k else None,
            top_logprobs=top_lps[b, :n, :k] if top_lps is not None and k else None,
            ranks=ranks[b, :n] if ranks is not None else None, candidate_logprobs=shifted)
        if call.next_token and top_ids is not None and top_lps is not None:
            answer = RowAnswer(**{**answer.__dict__, "next_id": int(top_ids[b, n, 0]),
                                  "next_logprob": float(top_lps[b, n, 0]), "next_top_ids": top_ids[b, n, :k],
                                  "next_top_logprobs": top_lps[b, n, :k]})
        answers.append(answer)
    return answers


def json_logprob(value: float) -> float:
    """A logprob as JSON can hold it (see the module doc)."""
    value = float(value)
    return value if value > MIN_JSON_LOGPROB else MIN_JSON_LOGPROB


def json_values(values: np.ndarray) -> np.ndarray:
    """``values`` ready to be written as JSON: logprobs (floats) floored as :func:`json_logprob`
    does, as float64 (their Python floats print as ``json.dumps`` prints them); ids as they are."""
    if np.issubdtype(values.dtype, np.floating):
        return np.where(values > MIN_JSON_LOGPROB, values, MIN_JSON_LOGPROB).astype(np.float64)
    return values


def format_rows(entry: str, columns: Sequence[np.ndarray], *, open_: str = "[", close: str = "]") -> list[str]:
    """One JSON text per row: ``open_``, ``entry`` once per column of the row (comma-separated),
    ``close``. ``entry`` is a ``%`` format whose fields take one value of each of ``columns`` (each
    ``[rows, width]``; a float as ``%r``: what ``json.dumps`` writes, see :func:`json_values`).
    One format per row, its fields filled in C: the per-entry Python work of building dicts for
    ``json.dumps`` is what bounded a front's tokens/s."""
    rows, width = columns[0].shape
    args = np.empty((rows, width, len(columns)), dtype=object)
    for at, column in enumerate(columns):
        args[:, :, at] = json_values(column)  # numpy writes Python ints / floats / strs into the object array
    template = open_ + ",".join([entry] * width) + close
    return [template % tuple(row) for row in args.reshape(rows, -1).tolist()]


def int_field(body: Mapping[str, Any], field: str, default: int | None = None, *, lo: int | None = None,
              hi: int | None = None, bool_as_int: bool = False, named: str | None = None) -> int | None:
    """``body[field]`` as an integer in ``lo..hi`` (None / absent: ``default``); a :class:`FieldError`
    otherwise, naming ``named`` (default: ``field``; the path of a nested field). ``bool_as_int``:
    ``true`` counts as 1 and ``false`` as absent (what vLLM's own parsing takes for ``prompt_logprobs``)."""
    value = body.get(field)
    field = named or field
    if value is None:
        return default
    if isinstance(value, bool):
        if not bool_as_int:
            raise FieldError(field, f"must be an integer, got {brief(value)}")
        return 1 if value else default
    if not isinstance(value, int):
        raise FieldError(field, f"must be an integer, got {brief(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise FieldError(field, f"{value} is out of range ({lo if lo is not None else ''}..{'' if hi is None else hi})")
    return value


def token_rows(value: Any, field: str, *, tokenize: Callable[[str], list[int]] | None,
               allow_text: bool = True) -> tuple[list[list[int]], bool]:
    """The prompt rows of ``value`` (ids, a batch of them, a text or a batch of texts) and whether it
    was text; a :class:`FieldError` naming ``field`` for anything else, an empty prompt, or a text
    where the teacher has no tokenizer (``tokenize`` None)."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        if not allow_text:
            raise FieldError(field, "must be token ids")
        if tokenize is None:
            raise FieldError(field, "this teacher's checkpoint has no tokenizer: send token ids (a list of ints, "
                                    "or a list of such lists), not text")
        texts = [value] if isinstance(value, str) else value
        rows = [tokenize(text) for text in texts]
        if any(not row for row in rows):
            raise FieldError(field, "a text prompt tokenized to no tokens")
        return rows, True
    if isinstance(value, list) and value and all(_is_id(v) for v in value):
        return [list(value)], False
    if isinstance(value, list) and value and all(isinstance(r, list) for r in value):
        for b, row in enumerate(value):
            if not row:
                raise FieldError(field, f"prompt {b} is empty")
            bad = next((v for v in row if not _is_id(v)), None)
            if bad is not None:
                raise FieldError(field, f"prompt {b} holds {brief(bad)}, not a token id (an integer)")
        return [list(row) for row in value], False
    if isinstance(value, list) and not value:
        raise FieldError(field, "the prompt is empty")
    raise FieldError(field, f"must be token ids (a list of ints, or a list of such lists) or text, got {brief(value)}")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class TokenNames:
    """How tokens are written: ``token_id:<id>`` (vLLM's ``return_tokens_as_token_ids``; always
    without a tokenizer) or the tokenizer's text of the one token (cached by id)."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._json: dict[int, str] = {}

    def name(self, token_id: int, as_ids: bool = False) -> str:
        if as_ids or self.tokenizer is None:
            return f"{TOKEN_ID_PREFIX}{token_id}"
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id])
        return text

    def json_names(self, ids: Sequence[int], as_ids: bool = False) -> list[str]:
        """Each token's :meth:`name` as JSON text (a quoted, escaped string; the tokenizer's cached by id)."""
        if as_ids or self.tokenizer is None:
            return [f'"{TOKEN_ID_PREFIX}{token_id}"' for token_id in ids]
        cache = self._json
        return [cache.get(token_id) or cache.setdefault(token_id, json.dumps(self.name(token_id))) for token_id in ids]

    def text(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (empty without a tokenizer: the caller sent ids)."""
        return "" if self.tokenizer is None else str(self.tokenizer.decode(list(ids)))


JSON_SLICE = 256  # items of a long list encoded in one json.dumps call (a few ms: other threads run between)
_RAW = re.compile(r'"\\u0000podium-raw-(\d+)\\u0000"')


class RawJSON:
    """Text already encoded as JSON, put in place by :func:`dumps`."""

    def __init__(self, text: str) -> None:
        self.text = text


def json_list(items: Sequence[Any]) -> RawJSON:
    """``items`` encoded :data:`JSON_SLICE` at a time: one ``json.dumps`` of a long list of dicts is
    one C call that holds the GIL (the event loop's thread could not run meanwhile)."""
    parts = [json.dumps(list(items[at:at + JSON_SLICE]), separators=(",", ":"))[1:-1]
             for at in range(0, len(items), JSON_SLICE)]
    return RawJSON("[" + ",".join(parts) + "]")


def dumps(value: Any) -> bytes:
    """``value`` as compact JSON, each :class:`RawJSON` inside it written as it is."""
    raws: list[str] = []

    def place(v: Any) -> Any:
        if isinstance(v, RawJSON):
            raws.append(v.text)
            return f"\0podium-raw-{len(raws) - 1}\0"
        if isinstance(v, dict):
            return {k: place(x) for k, x in v.items()}
        if isinstance(v, list):
            return [place(x) for x in v]
        return v

    text = json.dumps(place(value), separators=(",", ":"))
    pieces = _RAW.split(text)  # text, index, text, index, ..., text
    for i in range(1, len(pieces), 2):
        pieces[i] = raws[int(pieces[i])]
    return "".join(pieces).encode("utf-8")
