"""Open Inference Protocol (KServe v2) tensor codec, with the binary tensor data extension.

Owns the wire format both ways, for the server (:func:`decode_request`, :func:`encode_response`) and
the client (:func:`encode_request`, :func:`decode_response`); it knows nothing about teachers.

A body is either pure JSON, with each tensor's values in ``data`` (flat row-major, nested lists are
accepted too), or a JSON header of ``Inference-Header-Content-Length`` bytes followed by the raw
little-endian bytes of every tensor whose ``parameters.binary_data_size`` is set, in the order the
tensors appear in the header. An output is sent binary when its requested-output entry says
``parameters.binary_data: true``, or when the request parameter ``binary_data_output`` is true.

Every malformed body is an :class:`OIPError` carrying the HTTP status and a message that says what
is wrong, including bodies built to exhaust the decoder: JSON nested too deep, shapes of more than
:data:`MAX_RANK` dimensions, shapes with more elements than the body has bytes. A server reading a
binary request can check the header before it reads (or allocates room for) the tensor bytes:
:func:`parse_request_head` returns a :class:`RequestHead` whose ``binary_bytes`` is what the
declared binary tensors need. Only numpy is imported.
"""

from __future__ import annotations

import json
import logging
import math
import reprlib
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from podium.protocol.json_chunks import dumps_chunked
from podium.protocol.pieces import Buffer, CastBlock, Chunk, chunk_nbytes, from_bf16

logger = logging.getLogger(__name__)

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"

# OIP datatype -> little-endian numpy dtype (BYTES, i.e. strings, is not supported here).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    # bfloat16 has no numpy dtype: its arrays here hold the raw 16 bits (pieces.to_bf16 / from_bf16), and
    # it travels only as binary data (a JSON list of its bit patterns would mean something else).
    "BF16": np.dtype("<u2"),
}
BINARY_ONLY = frozenset({"BF16"})
_BY_DTYPE = {dt.newbyteorder("="): name for name, dt in DATATYPES.items() if name not in BINARY_ONLY}


# The protocol's tensors have at most 3 dimensions; numpy's limit is 64. More than this is refused.
MAX_RANK = 8
MAX_ID_LENGTH = 256  # a request id travels back in the X-Request-ID header

_brief_repr = reprlib.Repr()
_brief_repr.maxlevel, _brief_repr.maxlist, _brief_repr.maxstring, _brief_repr.maxother = 3, 8, 60, 60


def brief(value: Any) -> str:
    """A short repr of a client-sent value for an error message (bounded in depth and length)."""
    return _brief_repr.repr(value)


class OIPError(ValueError):
    """A request or response that does not follow the protocol; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def datatype_of(array: np.ndarray | CastBlock) -> str:
    """The OIP datatype of a numpy array (a cast block's: the dtype it is cast to)."""
    try:
        return _BY_DTYPE[array.dtype.newbyteorder("=")]
    except KeyError:
        raise OIPError(f"numpy dtype {array.dtype} has no Open Inference Protocol datatype") from None


@dataclass
class Tensor:
    """One named tensor as it travels: OIP datatype, shape, values."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: not said; the request-level default applies
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, Tensor]
    outputs: list[RequestedOutput] | None
    parameters: dict[str, Any]

    def wants_binary(self, name: str) -> bool:
        """Should output ``name`` be sent as binary data?"""
        if self.outputs is not None:
            for out in self.outputs:
                if out.name == name and out.binary is not None:
                    return out.binary
        return bool(self.parameters.get("binary_data_output", False))


@dataclass
class InferResponse:
    id: str | None
    model_name: str | None
    model_version: str | None
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    datatypes: dict[str, str] = field(default_factory=dict)  # output name -> OIP datatype

    def as_float32(self, name: str) -> np.ndarray:
        """Output ``name`` as float32 values, whatever floating datatype it travelled in."""
        array = self.outputs[name]
        return from_bf16(array) if self.datatypes.get(name) == "BF16" else array.astype(np.float32, copy=False)


# --------------------------------------------------------------------------- decoding


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The ``Inference-Header-Content-Length`` value checked against the body, or None."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise OIPError(f"{HEADER_LENGTH} is not an integer: {brief(value)}") from None
    if length < 0 or length > body_length:
        raise OIPError(f"{HEADER_LENGTH} {length} is outside the body of {body_length} bytes")
    return length


def _parse_json(raw: Buffer, binary_follows: bool) -> dict[str, Any]:
    """The JSON header as a dict; a nesting too deep for the parser is a 400, not a RecursionError."""
    try:
        header = json.loads(bytes(raw))
    except RecursionError:
        raise OIPError("malformed JSON: nesting too deep (the protocol nests a few levels; this body "
                       "nests beyond what the parser allows)") from None
    except UnicodeDecodeError:
        raise OIPError("body is not UTF-8 JSON (binary tensors need the Inference-Header-Content-Length "
                       "header)") from None
    except json.JSONDecodeError as exc:
        hint = ""
        if not binary_follows and exc.msg == "Extra data":
            hint = f" (binary tensors after the JSON need the {HEADER_LENGTH} header)"
        raise OIPError(f"malformed JSON: {exc.msg} at char {exc.pos}{hint}") from None
    except ValueError as exc:  # an integer longer than Python converts (sys.get_int_max_str_digits)
        raise OIPError(f"malformed JSON: {exc}") from None
    if not isinstance(header, dict):
        raise OIPError(f"body must be a JSON object, got {type(header).__name__}")
    return header


def _shape(name: str, raw: Any, body_length: int) -> tuple[int, ...]:
    """A shape checked: integers, at most :data:`MAX_RANK` of them, none negative, and no more
    elements (an empty dimension counted as 1) than the body has bytes: every value takes at least
    one byte of the body, JSON or binary, so a larger shape cannot be its data's."""
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise OIPError(f"tensor {name!r}: shape must be a list of integers, got {brief(raw)}")
    if len(raw) > MAX_RANK:
        raise OIPError(f"tensor {name!r}: shape has {len(raw)} dimensions; at most {MAX_RANK} are accepted")
    if any(d < 0 for d in raw):
        raise OIPError(f"tensor {name!r}: negative dimension in shape {raw}")
    cells = math.prod(max(d, 1) for d in raw)
    if cells > body_length:
        raise OIPError(f"tensor {name!r}: shape {raw} has {cells} elements, more than the {body_length}-byte "
                       "body can hold")
    return tuple(raw)


def _nesting(data: Any, limit: int) -> int:
    """How deep ``data``'s first elements nest, counted up to ``limit + 1``."""
    depth = 0
    while isinstance(data, list) and depth <= limit:
        depth += 1
        data = data[0] if data else None
    return depth


def _from_json_data(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    if datatype in BINARY_ONLY:
        raise OIPError(f"tensor {name!r}: datatype {datatype} travels only as binary data")
    dtype = DATATYPES[datatype]
    if _nesting(data, max(len(shape), 1)) > max(len(shape), 1):
        raise OIPError(f"tensor {name!r}: data nests deeper than its shape {list(shape)}")
    try:
        values = np.asarray(data)
    except ValueError as exc:  # ragged nested lists
        raise OIPError(f"tensor {name!r}: data is not a regular array ({exc})") from None
    count = math.prod(shape)
    if values.size != count:
        raise OIPError(f"tensor {name!r}: shape {list(shape)} needs {count} values, data has {values.size}")
    if values.size and values.dtype.kind not in "biuf":
        raise OIPError(f"tensor {name!r}: data must be numbers, got {values.dtype.kind!r} values")
    if dtype.kind in "iu":
        if values.size and values.dtype.kind == "f":
            raise OIPError(f"tensor {name!r}: datatype {datatype} but data holds non-integer values")
        if values.size:
            info = np.iinfo(dtype)
            lo, hi = values.min(), values.max()
            if lo < info.min or hi > info.max:
                raise OIPError(f"tensor {name!r}: values {lo}..{hi} do not fit datatype {datatype}")
    elif dtype.kind == "b" and values.size and values.dtype.kind != "b":
        raise OIPError(f"tensor {name!r}: datatype BOOL needs true/false values")
    return values.astype(dtype, copy=False).reshape(shape)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a header, checked but not decoded: its bytes may not have been read yet."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    binary_size: int | None  # bytes in the binary part; None: the values are in ``data``
    data: Any = None


def _entries(raw: Any, what: str, body_length: int) -> list[TensorEntry]:
    if not isinstance(raw, list):
        raise OIPError(f"'{what}' must be a list of tensors")
    entries: list[TensorEntry] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise OIPError(f"{what}[{i}] must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise OIPError(f"{what}[{i}] has no name")
        datatype = entry.get("datatype")
        if datatype not in DATATYPES:
            raise OIPError(
                f"tensor {name!r}: unsupported datatype {brief(datatype)} (supported: {', '.join(DATATYPES)})"
            )
        shape = _shape(name, entry.get("shape"), body_length)
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise OIPError(f"tensor {name!r}: parameters must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise OIPError(f"tensor {name!r}: binary_data_size must be a non-negative integer, got {brief(size)}")
            expected = math.prod(shape) * DATATYPES[datatype].itemsize
            if size != expected:
                raise OIPError(
                    f"tensor {name!r}: binary_data_size {size} != {expected} bytes for {datatype} {list(shape)}"
                )
            entries.append(TensorEntry(name, datatype, shape, params, size))
        elif "data" in entry:
            entries.append(TensorEntry(name, datatype, shape, params, None, entry["data"]))
        else:
            raise OIPError(f"tensor {name!r}: neither 'data' nor parameters.binary_data_size")
    return entries


def _check_binary_length(entries: Sequence[TensorEntry], available: int, status: int = 400) -> None:
    offset = 0
    for entry in entries:
        if entry.binary_size is not None:
            offset += entry.binary_size
            if offset > available:
                raise OIPError(f"tensor {entry.name!r}: binary data ends at byte {offset} but only {available} "
                               "binary bytes follow the JSON header", status)
    if offset != available:
        raise OIPError(f"binary data sizes add up to {offset} bytes but {available} bytes follow the JSON header",
                       status)


def _decode_entries(entries: Sequence[TensorEntry], binary: memoryview) -> list[Tensor]:
    """The tensors; binary ones are numpy views into ``binary`` (writable when it is)."""
    tensors: list[Tensor] = []
    offset = 0
    for e in entries:
        if e.binary_size is not None:
            array = np.frombuffer(binary[offset: offset + e.binary_size], dtype=DATATYPES[e.datatype]).reshape(e.shape)
            offset += e.binary_size
        else:
            array = _from_json_data(e.name, e.datatype, e.shape, e.data)
        tensors.append(Tensor(e.name, e.datatype, e.shape, array, e.parameters))
    return tensors


@dataclass(frozen=True)
class RequestHead:
    """An infer request's JSON header, checked, before its binary tensor bytes are read.

    ``binary_bytes`` is what the declared binary tensors need: a reader compares it with what the
    body holds (:meth:`check_binary_length`) before it allocates room for them, then
    :meth:`decode` makes the request of those bytes."""

    header: dict[str, Any]
    inputs: tuple[TensorEntry, ...]

    @property
    def binary_bytes(self) -> int:
        return sum(e.binary_size for e in self.inputs if e.binary_size is not None)

    def check_binary_length(self, available: int) -> None:
        """:class:`OIPError` naming the tensor and the numbers unless ``available`` bytes are exactly
        what the binary tensors need."""
        _check_binary_length(self.inputs, available)

    def decode(self, binary: Buffer = b"") -> InferRequest:
        """The request, its binary inputs numpy views into ``binary`` (no copy)."""
        view = memoryview(binary)
        self.check_binary_length(view.nbytes)
        inputs: dict[str, Tensor] = {}
        for t in _decode_entries(self.inputs, view):
            if t.name in inputs:
                raise OIPError(f"input {t.name!r} given twice")
            inputs[t.name] = t
        header = self.header
        outputs: list[RequestedOutput] | None = None
        if header.get("outputs") is not None:
            if not isinstance(header["outputs"], list):
                raise OIPError("'outputs' must be a list")
            outputs = []
            for i, out in enumerate(header["outputs"]):
                if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                    raise OIPError(f"outputs[{i}] must be an object with a name")
                params = out.get("parameters") or {}
                if not isinstance(params, dict):
                    raise OIPError(f"output {out['name']!r}: parameters must be an object")
                binary_flag = params.get("binary_data")
                outputs.append(RequestedOutput(out["name"], None if binary_flag is None else bool(binary_flag), params))
        parameters = header.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise OIPError("'parameters' must be an object")
        request_id = header.get("id")
        if request_id is not None:
            if not isinstance(request_id, str):
                raise OIPError("'id' must be a string")
            if len(request_id) > MAX_ID_LENGTH or not request_id.isprintable():
                raise OIPError(f"'id' must be printable and at most {MAX_ID_LENGTH} characters, "
                               f"got {brief(request_id)}")
        return InferRequest(request_id, inputs, outputs, parameters)


def parse_request_head(raw: Buffer, *, body_length: int, binary_follows: bool) -> RequestHead:
    """The JSON header ``raw`` of a request body of ``body_length`` bytes, checked (shapes, binary
    sizes) without the binary part; ``binary_follows``: the body has an
    ``Inference-Header-Content-Length`` (binary bytes may follow)."""
    header = _parse_json(raw, binary_follows)
    if "inputs" not in header:
        raise OIPError("request has no 'inputs'")
    return RequestHead(header, tuple(_entries(header["inputs"], "inputs", body_length)))


def decode_request(body: Buffer, header_length: int | None = None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON header + binary tensors)."""
    view = memoryview(body)
    split = view.nbytes if header_length is None else header_length
    head = parse_request_head(view[:split], body_length=view.nbytes, binary_follows=header_length is not None)
    return head.decode(view[split:])


def decode_response(body: Buffer, header_length: int | None = None) -> InferResponse:
    """Parse an infer response body; binary outputs are numpy views into ``body``."""
    view = memoryview(body)
    split = view.nbytes if header_length is None else header_length
    header = _parse_json(view[:split], header_length is not None)
    if "error" in header and "outputs" not in header:
        raise OIPError(str(header["error"]), status=500)
    entries = _entries(header.get("outputs", []), "outputs", view.nbytes)
    binary = view[split:]
    try:
        _check_binary_length(entries, binary.nbytes, status=502)
    except OIPError as exc:
        raise OIPError(f"response: {exc.message}", 502) from None
    decoded = _decode_entries(entries, binary)
    return InferResponse(
        header.get("id"),
        header.get("model_name"),
        header.get("model_version"),
        {t.name: t.array for t in decoded},
        header.get("parameters") or {},
        {t.name: t.datatype for t in decoded},
    )


# --------------------------------------------------------------------------- encoding


ArrayOrBlocks = np.ndarray | Sequence[np.ndarray | CastBlock]
"""An array, or its consecutive row blocks (one tensor, rows in order: written block by block,
never joined), some perhaps cast as they are written."""


def _tensor_entry(name: str, tensor: ArrayOrBlocks, binary: bool, chunks: list[Chunk],
                  datatype: str | None = None) -> dict[str, Any]:
    blocks: list[np.ndarray | CastBlock]
    if isinstance(tensor, np.ndarray):
        blocks, shape = [tensor], list(tensor.shape)
    else:
        blocks = list(tensor)
        if not blocks or any(b.ndim == 0 or b.shape[1:] != blocks[0].shape[1:] or b.dtype != blocks[0].dtype
                             for b in blocks):
            raise OIPError(f"tensor {name!r}: row blocks must share their dtype and all but the first dimension")
        shape = [sum(b.shape[0] for b in blocks), *blocks[0].shape[1:]]
    datatype = datatype or datatype_of(blocks[0])
    if datatype in BINARY_ONLY and not binary:
        raise OIPError(f"tensor {name!r}: datatype {datatype} travels only as binary data")
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if binary:
        size = 0
        for block in blocks:
            chunk: Chunk = block if isinstance(block, CastBlock) else \
                np.ascontiguousarray(block, dtype=DATATYPES[datatype]).data.cast("B")
            if chunk_nbytes(chunk):
                chunks.append(chunk)
                size += chunk_nbytes(chunk)
        entry["parameters"] = {"binary_data_size": size}
    else:  # written by dumps_chunked, a chunk at a time
        arrays = [b.values() if isinstance(b, CastBlock) else b for b in blocks]
        entry["data"] = arrays[0].ravel() if len(arrays) == 1 else np.concatenate(arrays).ravel()
    return entry


def _assemble(header: dict[str, Any], chunks: list[Chunk]) -> tuple[list[Chunk], int | None]:
    head = dumps_chunked(header)
    if not chunks:
        return [head], None
    head += b" " * (-len(head) % 8)  # JSON may end in spaces: the tensors after it start 8-byte aligned
    return [head, *chunks], len(head)


def encode_request(
    inputs: Sequence[tuple[str, np.ndarray]],
    *,
    outputs: Iterable[str] | None = None,
    binary_inputs: bool = True,
    binary_outputs: bool = True,
    parameters: Mapping[str, Any] | None = None,
    request_id: str | None = None,
) -> tuple[list[Buffer], int | None]:
    """Body chunks and header length (None for pure JSON) of an infer request."""
    chunks: list[Chunk] = []
    header: dict[str, Any] = {"inputs": [_tensor_entry(n, a, binary_inputs, chunks) for n, a in inputs]}
    if request_id is not None:
        header["id"] = request_id
    if outputs is not None:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": binary_outputs}} for n in outputs]
    params = dict(parameters or {})
    if outputs is None and binary_outputs:
        params["binary_data_output"] = True
    if params:
        header["parameters"] = params
    body, header_len = _assemble(header, chunks)
    return typing.cast("list[Buffer]", body), header_len  # inputs are arrays: no cast blocks


def encode_response(
    model_name: str,
    outputs: Sequence[tuple[str, ArrayOrBlocks, bool]],
    *,
    model_version: str | None = None,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    datatypes: Mapping[str, str] | None = None,
) -> tuple[list[Chunk], int | None]:
    """Body chunks and header length of an infer response; ``outputs`` are (name, tensor, binary);
    ``datatypes`` names the datatype of outputs whose numpy dtype does not say it (``BF16``)."""
    chunks: list[Chunk] = []
    header: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        header["model_version"] = model_version
    if request_id is not None:
        header["id"] = request_id
    if parameters:
        header["parameters"] = dict(parameters)
    header["outputs"] = [_tensor_entry(n, a, b, chunks, (datatypes or {}).get(n)) for n, a, b in outputs]
    return _assemble(header, chunks)

