"""What a call asks of a teacher, checked once per side: the :class:`Query`.

A query is everything about a call but its rows (those are a :class:`~podium.protocol.batch.Batch`):
which outputs, the top-k width, the temperature, a row cap, and the dtypes the values and ids
travel in. It is built by :func:`ask` only, on either side of the wire: the client asks before
it sends anything (a bad option is a :class:`~podium.protocol.batch.BatchError` in the trainer),
the endpoint asks again from the request it received (a 400), against the teacher's vocabulary.
Like a ``Batch``, a ``Query`` is the proof that the check ran: the endpoint, its batcher, the
group and every worker take one and check nothing again. Adding an output kind is one entry in
:mod:`podium.protocol.names` (and the size of its values in :data:`VALUE_BYTES`) plus its compute.

The rules, each here once:

- **default outputs** (:func:`default_outputs`): ``logprobs``, plus ``topk_logprobs`` /
  ``topk_indices`` with ``top_k``, plus ``candidate_logprobs`` with candidate ids;
- **options**: ``top_k`` in ``1..min(max_top_k, vocab)`` (larger or ``≤ 0`` is refused, never
  clamped), ``micro_batch_size ≥ 1``, ``temperature`` in ``MIN_TEMPERATURE..MAX_TEMPERATURE``,
  the wire dtypes among :data:`~podium.protocol.names.VALUE_DATATYPES` /
  :data:`~podium.protocol.names.INDEX_DATATYPES`; ``None`` means not asked for;
- **outputs**: known names, each once; top-k outputs need ``top_k``, ``candidate_logprobs``
  needs candidate ids; at most one full-vocabulary payload (``hidden_states`` or ``logits``, in
  ``payload_datatype``); ``hidden_states`` refused, with the teacher's reason, where its logits are
  not ``output_layer(h)`` (the teacher says why: ``hidden_states_refusal``);
- **the answer's size** (:meth:`Query.answer_bytes`), from the query and the batch's shape: what
  the client pipelines by and what the endpoint's cost bound refuses by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from podium.protocol.batch import BatchError
from podium.protocol.names import (
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    HIDDEN_STATES,
    INDEX_DATATYPES,
    INDEX_OUTPUTS,
    INDICES_DATATYPE,
    LOGITS,
    LOGPROBS,
    MICRO_BATCH_SIZE,
    OUTPUTS,
    PAYLOAD_DATATYPE,
    PAYLOAD_DATATYPES,
    PAYLOAD_OUTPUTS,
    TARGET_RANK,
    TEMPERATURE,
    TOP_K,
    TOPK_INDICES,
    TOPK_LOGPROBS,
    TOPK_OUTPUTS,
    VALUE_DATATYPES,
    VALUE_OUTPUTS,
    VALUES_DATATYPE,
)
from podium.protocol.oip import brief

# The temperatures a query may ask for: z / T stays finite and its softmax meaningful (a
# subnormal T overflows the logits to inf and the logprobs to NaN; a huge one flattens them to
# the uniform distribution). Sampling temperatures in practice are 0.1..10.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 1e3
DEFAULT_VALUES_DATATYPE = VALUE_DATATYPES[0]
DEFAULT_INDICES_DATATYPE = INDEX_DATATYPES[0]
DEFAULT_PAYLOAD_DATATYPE = PAYLOAD_DATATYPES[0]
# Bytes of one element of an output on the wire, by datatype; a JSON tensor's element is text.
WIRE_BYTES = {"FP32": 4, "BF16": 2, "FP16": 2, "INT64": 8, "INT32": 4}
JSON_BYTES_PER_VALUE = 16  # a value written as JSON text ("-12.345678,"), about


@dataclass(frozen=True)
class Query:
    """A call's outputs and options, checked (build it with :func:`ask`; see the module doc)."""

    outputs: tuple[str, ...] = (LOGPROBS,)  # in the order asked: the answer's order
    top_k: int | None = None  # None: no top-k output
    temperature: float | None = None  # None: the teacher's (its recipe's generation.temperature)
    micro_batch_size: int | None = None  # None: the teacher's token budget alone
    values_datatype: str = DEFAULT_VALUES_DATATYPE  # of topk_logits / candidate_logprobs on the wire
    indices_datatype: str = DEFAULT_INDICES_DATATYPE  # of topk_indices / topk_logit_indices on the wire
    payload_datatype: str = DEFAULT_PAYLOAD_DATATYPE  # of hidden_states / logits, computed and on the wire

    def wants(self, name: str) -> bool:
        return name in self.outputs

    @property
    def computed_alike(self) -> tuple[Any, ...]:
        """Queries with equal values here compute alike: their rows may share one forward of the
        group (the row cap and the wire dtypes do not change a row's answer)."""
        return self.top_k, self.temperature, frozenset(self.outputs), self.payload and self.payload_datatype

    @property
    def payload(self) -> str | None:
        """The full-vocabulary payload asked (``hidden_states`` or ``logits``), or None."""
        return next((name for name in self.outputs if name in PAYLOAD_OUTPUTS), None)

    def parameters(self) -> dict[str, object]:
        """The OIP request parameters that say this query (the defaults left out)."""
        params: dict[str, object] = {}
        if self.top_k is not None:
            params[TOP_K] = self.top_k
        if self.micro_batch_size is not None:
            params[MICRO_BATCH_SIZE] = self.micro_batch_size
        if self.temperature is not None:
            params[TEMPERATURE] = self.temperature
        if self.values_datatype != DEFAULT_VALUES_DATATYPE:
            params[VALUES_DATATYPE] = self.values_datatype
        if self.indices_datatype != DEFAULT_INDICES_DATATYPE:
            params[INDICES_DATATYPE] = self.indices_datatype
        if self.payload_datatype != DEFAULT_PAYLOAD_DATATYPE:
            params[PAYLOAD_DATATYPE] = self.payload_datatype
        return params

    def wire_datatype(self, name: str) -> str:
        """The datatype output ``name`` is asked to travel in (the endpoint answers INT64 ids for a
        vocabulary that INT32 cannot hold)."""
        if name in VALUE_OUTPUTS:
            return self.values_datatype
        if name in INDEX_OUTPUTS:
            return self.indices_datatype
        if name in PAYLOAD_OUTPUTS:
            return self.payload_datatype
        return "FP32"

    def answer_bytes(self, rows: int, width: int, candidates: int | None = None,
                     binary: Mapping[str, bool] | None = None, *, hidden_size: int | None = None,
                     vocab_size: int | None = None) -> int:
        """The size of the answer to this query for ``rows × width`` positions (``candidates``: C of
        the candidate ids; ``hidden_size`` / ``vocab_size``: the payloads' width, the teacher's, 1
        where not known), each output binary unless ``binary`` says otherwise."""
        total = 0
        for name in self.outputs:
            per = {LOGPROBS: 1, TARGET_RANK: 1, CANDIDATE_LOGPROBS: candidates or 1, HIDDEN_STATES: hidden_size or 1,
                   LOGITS: vocab_size or 1}.get(name, self.top_k or 1)
            size = WIRE_BYTES[self.wire_datatype(name)]
            if binary is not None and not binary.get(name, True):
                size = JSON_BYTES_PER_VALUE
            total += rows * width * per * size
        return total


def default_outputs(top_k: int | None, candidates: bool) -> tuple[str, ...]:
    """What a call answers when it names no outputs (see the module doc)."""
    return ((LOGPROBS,) + ((TOPK_LOGPROBS, TOPK_INDICES) if top_k else ())
            + ((CANDIDATE_LOGPROBS,) if candidates else ()))


def ask(*, outputs: Sequence[str] | None = None, top_k: Any = None, temperature: Any = None,
        micro_batch_size: Any = None, values_datatype: Any = None, indices_datatype: Any = None,
        payload_datatype: Any = None, candidates: bool = False, vocab_size: int | None = None,
        max_top_k: int | None = None, hidden_states_refusal: str | None = None) -> Query:
    """The :class:`Query` of these options, checked (see the module doc); a :class:`BatchError`
    naming the option and the value at fault. ``candidates``: the call sends candidate ids;
    ``vocab_size`` / ``max_top_k``: the teacher's bounds of ``top_k`` (None: the client, which does
    not know them: the teacher checks); ``hidden_states_refusal``: why this teacher cannot answer
    ``hidden_states`` (None: it can, or the client, which does not know)."""
    limit = min(max_top_k, vocab_size) if max_top_k and vocab_size else (vocab_size or max_top_k)
    checked_temperature = None if temperature is None else _temperature(temperature)
    k = _int_option(top_k, TOP_K, 1, limit)
    rows = _int_option(micro_batch_size, MICRO_BATCH_SIZE, 1, None)
    values = _choice(values_datatype, VALUES_DATATYPE, VALUE_DATATYPES)
    indices = _choice(indices_datatype, INDICES_DATATYPE, INDEX_DATATYPES)
    payload = _choice(payload_datatype, PAYLOAD_DATATYPE, PAYLOAD_DATATYPES)
    names = _outputs(outputs, k, candidates)
    if HIDDEN_STATES in names and hidden_states_refusal:
        raise BatchError(f"output {HIDDEN_STATES} is refused by this teacher: {hidden_states_refusal}; ask for "
                         f"{LOGITS} instead")
    return Query(outputs=names, top_k=k, temperature=checked_temperature, micro_batch_size=rows,
                 values_datatype=values, indices_datatype=indices, payload_datatype=payload)


def _outputs(outputs: Sequence[str] | None, top_k: int | None, candidates: bool) -> tuple[str, ...]:
    if outputs is None:
        return default_outputs(top_k, candidates)
    if isinstance(outputs, str) or not all(isinstance(name, str) for name in outputs):
        raise BatchError(f"outputs must be a list of output names, got {brief(outputs)}")
    names = tuple(outputs)
    unknown = sorted(set(names) - set(OUTPUTS))
    if unknown:
        raise BatchError(f"unknown output(s) {unknown}; this model has {list(OUTPUTS)}")
    if len(set(names)) != len(names):
        raise BatchError(f"an output is requested twice: {list(names)}")
    needs_k = [name for name in names if name in TOPK_OUTPUTS]
    if not top_k and needs_k:
        raise BatchError(f"outputs {'/'.join(needs_k)} need the request parameter {TOP_K!r}")
    if CANDIDATE_LOGPROBS in names and not candidates:
        raise BatchError(f"output {CANDIDATE_LOGPROBS} needs the input {CANDIDATE_IDS!r}")
    payloads = [name for name in names if name in PAYLOAD_OUTPUTS]
    if len(payloads) > 1:  # each is streamed as it is computed: the answer holds at most one
        raise BatchError(f"outputs {'/'.join(payloads)}: a call asks for one full-vocabulary payload at most")
    return names


def _int_option(value: Any, name: str, lo: int, hi: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BatchError(f"parameter {name!r} must be an integer, got {brief(value)}", name)
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise BatchError(f"parameter {name!r} = {value} is out of range ({bound})", name)
    return value


def _temperature(value: Any) -> float:
    """``value`` as a temperature in ``MIN_TEMPERATURE..MAX_TEMPERATURE`` (an integer too large
    for a float is refused like any other value out of range)."""
    number = None
    if not isinstance(value, bool) and isinstance(value, (int, float, np.floating, np.integer)):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
    if number is None or not MIN_TEMPERATURE <= number <= MAX_TEMPERATURE:
        raise BatchError(f"parameter {TEMPERATURE!r} must be a finite number > 0, got {brief(value)}; accepted: "
                         f"{MIN_TEMPERATURE:g}..{MAX_TEMPERATURE:g} (podium.protocol.query MIN_TEMPERATURE.."
                         "MAX_TEMPERATURE)", TEMPERATURE)
    return number


def _choice(value: Any, name: str, allowed: tuple[str, ...]) -> str:
    if value is None:
        return allowed[0]
    if value not in allowed:
        raise BatchError(f"parameter {name!r} must be one of {', '.join(allowed)}, got {brief(value)}", name)
    return str(value)
