"""An infer request checked against the model: the group's batch, options and outputs, or a 400.

:func:`validate_request` says what is wrong with a decoded request (inputs, their datatypes, the
parameters, the outputs asked for); the batch rule itself is :mod:`podium.protocol.batch`.
"""

from __future__ import annotations

from podium.protocol import oip
from podium.protocol.batch import Batch, BatchError, Options, validate_batch, validate_options
from podium.protocol.names import (
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    ID_DATATYPES,
    INDICES_DATATYPE,
    INPUT_IDS,
    INPUT_LENGTHS,
    INPUTS,
    LOGPROBS,
    MICRO_BATCH_SIZE,
    OUTPUTS,
    TEMPERATURE,
    TOP_K,
    TOPK_INDICES,
    TOPK_LOGPROBS,
    TOPK_OUTPUTS,
    VALUE_OUTPUTS,
    VALUES_DATATYPE,
)
from podium.teacher.endpoint.errors import RequestError


def validate_request(req: oip.InferRequest, *, vocab_size: int, max_sequence_length: int | None,
                     max_top_k: int | None) -> tuple[Batch, Options, list[str]]:
    """Check an infer request against the model; return (batch, options, outputs)."""
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
    try:
        batch = validate_batch(req.inputs[INPUT_IDS].array, req.inputs[INPUT_LENGTHS].array,
                               vocab_size=vocab_size, max_sequence_length=max_sequence_length,
                               candidate_ids=cands.array if cands is not None else None)
        p = req.parameters
        opts = validate_options(top_k=p.get(TOP_K), micro_batch_size=p.get(MICRO_BATCH_SIZE),
                                temperature=p.get(TEMPERATURE), values_datatype=p.get(VALUES_DATATYPE),
                                indices_datatype=p.get(INDICES_DATATYPE),
                                vocab_size=vocab_size, max_top_k=max_top_k)
    except BatchError as exc:
        raise RequestError(400, str(exc)) from None
    if req.outputs is None:
        outputs = [LOGPROBS] + ([TOPK_LOGPROBS, TOPK_INDICES] if opts.top_k else []) + (
            [CANDIDATE_LOGPROBS] if cands is not None else [])
    else:
        outputs = [o.name for o in req.outputs]
        unknown = sorted(set(outputs) - set(OUTPUTS))
        if unknown:
            raise RequestError(400, f"unknown output(s) {unknown}; this model has {list(OUTPUTS)}")
        needs_k = [o for o in outputs if o in TOPK_OUTPUTS]
        if not opts.top_k and needs_k:
            raise RequestError(400, f"outputs {'/'.join(needs_k)} need the request parameter 'top_k'")
        if CANDIDATE_LOGPROBS in outputs and cands is None:
            raise RequestError(400, f"output {CANDIDATE_LOGPROBS} needs the input {CANDIDATE_IDS!r}")
        if len(set(outputs)) != len(outputs):
            raise RequestError(400, f"an output is requested twice: {outputs}")
    if opts.values_datatype in oip.BINARY_ONLY:
        json_outputs = [o for o in outputs if o in VALUE_OUTPUTS and not req.wants_binary(o)]
        if json_outputs:
            raise RequestError(400, f"{VALUES_DATATYPE}={opts.values_datatype} travels only as binary data; "
                               f"ask for {json_outputs} with binary_data")
    return batch, opts, outputs
