"""An infer request checked against the model: its batch and query, or a 400.

:func:`validate_request` says what is wrong with a decoded request (inputs, their datatypes, the
parameters, the outputs asked for); the rules themselves are :mod:`podium.protocol.batch` (the
rows) and :mod:`podium.protocol.query` (what is asked of them), the same the client applies.
"""

from __future__ import annotations

from podium.protocol import oip
from podium.protocol.batch import Batch, BatchError, validate_batch
from podium.protocol.names import (
    CANDIDATE_IDS,
    ID_DATATYPES,
    INDICES_DATATYPE,
    INPUT_IDS,
    INPUT_LENGTHS,
    INPUTS,
    MICRO_BATCH_SIZE,
    PAYLOAD_DATATYPE,
    TEMPERATURE,
    TOP_K,
    VALUE_OUTPUTS,
    VALUES_DATATYPE,
)
from podium.protocol.query import Query, ask
from podium.web.errors import RequestError


def validate_request(req: oip.InferRequest, *, vocab_size: int, max_sequence_length: int | None,
                     max_top_k: int | None, hidden_states_refusal: str | None = None) -> tuple[Batch, Query]:
    """Check an infer request against the model (``hidden_states_refusal``: why it cannot answer
    ``hidden_states``, None when it can); return its batch and query."""
    unknown = sorted(set(req.inputs) - set(INPUTS))
    if unknown:
        raise RequestError(400, f"unknown input(s) {unknown}; this model takes {list(INPUTS)}")
    for name in INPUTS:
        if name not in req.inputs:
            if name == CANDIDATE_IDS:
                continue
            raise RequestError(400, f"missing input {name!r}")
        tensor = req.inputs[name]
        if tensor.datatype not in ID_DATATYPES:
            raise RequestError(400, f"input {name!r}: datatype {tensor.datatype} not accepted; expected INT32 or INT64")
    cands = req.inputs.get(CANDIDATE_IDS)
    p = req.parameters
    try:
        batch = validate_batch(req.inputs[INPUT_IDS].array, req.inputs[INPUT_LENGTHS].array,
                               vocab_size=vocab_size, max_sequence_length=max_sequence_length,
                               candidate_ids=cands.array if cands is not None else None)
        query = ask(outputs=None if req.outputs is None else [o.name for o in req.outputs],
                    top_k=p.get(TOP_K), micro_batch_size=p.get(MICRO_BATCH_SIZE), temperature=p.get(TEMPERATURE),
                    values_datatype=p.get(VALUES_DATATYPE), indices_datatype=p.get(INDICES_DATATYPE),
                    payload_datatype=p.get(PAYLOAD_DATATYPE), candidates=cands is not None, vocab_size=vocab_size,
                    max_top_k=max_top_k, hidden_states_refusal=hidden_states_refusal)
    except BatchError as exc:
        raise RequestError(400, str(exc)) from None
    if query.values_datatype in oip.BINARY_ONLY:
        json_outputs = [o for o in query.outputs if o in VALUE_OUTPUTS and not req.wants_binary(o)]
        if json_outputs:
            raise RequestError(400, f"{VALUES_DATATYPE}={query.values_datatype} travels only as binary data; "
                               f"ask for {json_outputs} with binary_data")
    if query.payload is not None and not req.wants_binary(query.payload):
        raise RequestError(400, f"output {query.payload} travels only as binary data; ask for it with binary_data")
    return batch, query
