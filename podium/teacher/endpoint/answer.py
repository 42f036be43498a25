"""The group's answer on its way out: checked, each output in its wire dtype, encoded as OIP.

:func:`group_outputs` refuses what a group returned in the wrong shape (a broken group is a 500,
never a wrong answer); :func:`wire` gives each output the dtype it travels as; :func:`infer_response`
is the HTTP answer (JSON or the binary extension, as the request asked; codec
:mod:`podium.protocol.oip`) with the request id, generation and teacher headers, its body never
joined when large (:mod:`~podium.teacher.endpoint.stream` writes the tensors' own memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from aiohttp import web

from podium.protocol import oip
from podium.protocol.batch import Batch
from podium.protocol.names import (
    GENERATION_HEADER,
    GENERATION_PARAMETER,
    INDEX_OUTPUTS,
    INT32_VOCAB,
    OUTPUTS,
    PAYLOAD_OUTPUTS,
    REQUEST_ID_HEADER,
    TEACHER_HEADER,
    VALUE_OUTPUTS,
)
from podium.protocol.pieces import CastBlock
from podium.protocol.query import Query
from podium.teacher.endpoint.batching import RowBlocks
from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.endpoint.stream import AnswerSender

WireBlocks = tuple[np.ndarray | CastBlock, ...]
"""An output's row blocks in their wire dtypes (:func:`wire`)."""


def group_outputs(result: Mapping[str, Any], batch: Batch) -> dict[str, np.ndarray]:
    """The outputs the group returned for a batch, as numpy arrays ``[rows, width, ...]`` of ``batch``."""
    out: dict[str, np.ndarray] = {}
    for name in OUTPUTS:
        if name in result and result[name] is not None:
            array = as_numpy(result[name])
            if array.shape[:2] != (batch.rows, batch.width):  # a broken group is a 500, never a wrong answer
                raise RuntimeError(f"the group returned {name} of shape {list(array.shape)} for a batch of "
                                   f"{batch.rows} rows and width {batch.width}")
            out[name] = array
    return out


def as_numpy(value: Any) -> np.ndarray:
    """A group's output as numpy, without a copy where it is on the host: a bfloat16 tensor (a
    payload) as its 16-bit patterns, the BF16 wire form (numpy has no bfloat16)."""
    if not hasattr(value, "detach"):
        return np.asarray(value)
    import torch

    tensor = value.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def wire(name: str, blocks: RowBlocks, query: Query, vocab_size: int) -> WireBlocks:
    """An output's row blocks as they travel: indices INT64 (INT32 when asked and the vocabulary
    fits), values float32 (top-k logits and candidate logprobs as BF16 bits when asked). A block
    already in its wire dtype goes as it is (the worker's head answers ids in int32); another is
    cast a piece at a time as it is written (:class:`~podium.protocol.pieces.CastBlock`). A payload
    is computed in its wire dtype by the workers: its blocks go as they are."""
    if name in PAYLOAD_OUTPUTS:
        target = oip.DATATYPES[query.payload_datatype]
        if query.payload_datatype == "BF16":  # a stand-in's float blocks: their bfloat16 bits
            return tuple(b if b.dtype == target else CastBlock(b, target, bf16_bits) for b in blocks)
        return _as(blocks, target)
    if name in INDEX_OUTPUTS:
        narrow = query.indices_datatype == "INT32" and vocab_size <= INT32_VOCAB
        return _as(blocks, np.dtype(np.int32 if narrow else np.int64))
    if name in VALUE_OUTPUTS and query.values_datatype == "BF16":
        return tuple(CastBlock(b, oip.DATATYPES["BF16"], bf16_bits) for b in blocks)
    return _as(blocks, np.dtype(np.float32))


def _as(blocks: RowBlocks, dtype: np.dtype) -> WireBlocks:
    return tuple(b if b.dtype == dtype else CastBlock(b, dtype) for b in blocks)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns, ``uint16``: :func:`podium.protocol.pieces.to_bf16`'s
    rounding (to nearest even) by torch's vectorised cast (~5x faster than numpy's integer steps;
    NaN stays NaN, where the integer steps can carry it into the sign bit)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def infer_response(config: EndpointConfig, req: oip.InferRequest, result: Mapping[str, WireBlocks], query: Query,
                   request_id: str, sender: AnswerSender) -> web.StreamResponse:
    """The answer to ``req``: the outputs its ``query`` asks, of ``result`` (already in their wire
    dtypes); a large one is written by ``sender`` from the arrays' memory."""
    gen = str(config.generation) if config.generation is not None else ""
    chunks, header_len = oip.encode_response(
        config.served_name,
        [(name, result[name], req.wants_binary(name)) for name in query.outputs],
        model_version=config.model_version,
        request_id=req.id,
        parameters={GENERATION_PARAMETER: gen} if gen else None,
        datatypes={name: query.wire_datatype(name) for name in query.outputs
                   if name in VALUE_OUTPUTS or name in PAYLOAD_OUTPUTS},
    )
    headers = {REQUEST_ID_HEADER: request_id, GENERATION_HEADER: gen, TEACHER_HEADER: config.teacher_key}
    if header_len is not None:
        headers[oip.HEADER_LENGTH] = str(header_len)
        content_type = oip.BINARY_CONTENT_TYPE
    else:
        content_type = oip.JSON_CONTENT_TYPE
    return sender.response(chunks, headers, content_type)
