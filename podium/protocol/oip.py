"""Open Inference Protocol (KServe v2) tensor codec, with the binary tensor data extension.

Owns the wire format both ways, for the server (:func:`decode_request`, :func:`encode_response`) and
the client (:func:`encode_request`, :func:`decode_response`); it knows nothing about teachers.

A body is either pure JSON, with each tensor's values in ``data`` (flat row-major, nested lists are
accepted too), or a JSON header of ``Inference-Header-Content-Length`` bytes followed by the raw
little-endian bytes of every tensor whose ``parameters.binary_data_size`` is set, in the order the
tensors appear in the header. An output is sent binary when its requested-output entry says
``parameters.binary_data: true``, or when the request parameter ``binary_data_output`` is true.

Every malformed body is an :class:`OIPError` carrying the HTTP status and a message that says what
is wrong. Only numpy is imported.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

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
}
_BY_DTYPE = {dt.newbyteorder("="): name for name, dt in DATATYPES.items()}

Buffer = Union[bytes, bytearray, memoryview]


class OIPError(ValueError):
    """A request or response that does not follow the protocol; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def datatype_of(array: np.ndarray) -> str:
    """The OIP datatype of a numpy array."""
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
    binary: Optional[bool] = None  # None: not said; the request-level default applies
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    id: Optional[str]
    inputs: dict[str, Tensor]
    outputs: Optional[list[RequestedOutput]]
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
    id: Optional[str]
    model_name: Optional[str]
    model_version: Optional[str]
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any]


# --------------------------------------------------------------------------- decoding


def parse_header_length(value: Optional[str], body_length: int) -> Optional[int]:
    """The ``Inference-Header-Content-Length`` value checked against the body, or None."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise OIPError(f"{HEADER_LENGTH} is not an integer: {value!r}") from None
    if length < 0 or length > body_length:
        raise OIPError(f"{HEADER_LENGTH} {length} is outside the body of {body_length} bytes")
    return length


def _split(body: Buffer, header_length: Optional[int]) -> tuple[dict[str, Any], memoryview]:
    view = memoryview(body)
    if header_length is None:
        header_bytes, binary = view, view[:0]
    else:
        header_bytes, binary = view[:header_length], view[header_length:]
    try:
        header = json.loads(bytes(header_bytes))
    except UnicodeDecodeError:
        raise OIPError("body is not UTF-8 JSON (binary tensors need the Inference-Header-Content-Length header)") from None
    except json.JSONDecodeError as exc:
        hint = ""
        if header_length is None and exc.msg == "Extra data":
            hint = f" (binary tensors after the JSON need the {HEADER_LENGTH} header)"
        raise OIPError(f"malformed JSON: {exc.msg} at char {exc.pos}{hint}") from None
    if not isinstance(header, dict):
        raise OIPError(f"body must be a JSON object, got {type(header).__name__}")
    return header, binary


def _shape(name: str, raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise OIPError(f"tensor {name!r}: shape must be a list of integers, got {raw!r}")
    if any(d < 0 for d in raw):
        raise OIPError(f"tensor {name!r}: negative dimension in shape {raw}")
    return tuple(raw)


def _from_json_data(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    dtype = DATATYPES[datatype]
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


def _decode_tensors(
    entries: Any, binary: memoryview, what: str
) -> tuple[list[Tensor], int]:
    if not isinstance(entries, list):
        raise OIPError(f"'{what}' must be a list of tensors")
    tensors: list[Tensor] = []
    offset = 0
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise OIPError(f"{what}[{i}] must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise OIPError(f"{what}[{i}] has no name")
        datatype = entry.get("datatype")
        if datatype not in DATATYPES:
            raise OIPError(
                f"tensor {name!r}: unsupported datatype {datatype!r} (supported: {', '.join(DATATYPES)})"
            )
        shape = _shape(name, entry.get("shape"))
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise OIPError(f"tensor {name!r}: parameters must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            dtype = DATATYPES[datatype]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise OIPError(f"tensor {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
            expected = math.prod(shape) * dtype.itemsize
            if size != expected:
                raise OIPError(
                    f"tensor {name!r}: binary_data_size {size} != {expected} bytes for {datatype} {list(shape)}"
                )
            if offset + size > len(binary):
                raise OIPError(
                    f"tensor {name!r}: binary data ends at byte {offset + size} but only {len(binary)} "
                    "binary bytes follow the JSON header"
                )
            array = np.frombuffer(binary[offset : offset + size], dtype=dtype).reshape(shape)
            offset += size
        elif "data" in entry:
            array = _from_json_data(name, datatype, shape, entry["data"])
        else:
            raise OIPError(f"tensor {name!r}: neither 'data' nor parameters.binary_data_size")
        tensors.append(Tensor(name, datatype, shape, array, params))
    return tensors, offset


def decode_request(body: Buffer, header_length: Optional[int] = None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON header + binary tensors)."""
    header, binary = _split(body, header_length)
    if "inputs" not in header:
        raise OIPError("request has no 'inputs'")
    tensors, used = _decode_tensors(header["inputs"], binary, "inputs")
    if used != len(binary):
        raise OIPError(
            f"binary data sizes add up to {used} bytes but {len(binary)} bytes follow the JSON header"
        )
    inputs: dict[str, Tensor] = {}
    for t in tensors:
        if t.name in inputs:
            raise OIPError(f"input {t.name!r} given twice")
        inputs[t.name] = t
    outputs: Optional[list[RequestedOutput]] = None
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
    if request_id is not None and not isinstance(request_id, str):
        raise OIPError("'id' must be a string")
    return InferRequest(request_id, inputs, outputs, parameters)


def decode_response(body: Buffer, header_length: Optional[int] = None) -> InferResponse:
    """Parse an infer response body; binary outputs are numpy views into ``body``."""
    header, binary = _split(body, header_length)
    if "error" in header and "outputs" not in header:
        raise OIPError(str(header["error"]), status=500)
    tensors, used = _decode_tensors(header.get("outputs", []), binary, "outputs")
    if used != len(binary):
        raise OIPError(f"response binary sizes add up to {used} bytes but {len(binary)} follow the header", 502)
    return InferResponse(
        header.get("id"),
        header.get("model_name"),
        header.get("model_version"),
        {t.name: t.array for t in tensors},
        header.get("parameters") or {},
    )


# --------------------------------------------------------------------------- encoding


def _tensor_entry(name: str, array: np.ndarray, binary: bool, chunks: list[Buffer]) -> dict[str, Any]:
    datatype = datatype_of(array)
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if binary:
        contiguous = np.ascontiguousarray(array, dtype=DATATYPES[datatype])
        raw = memoryview(contiguous).cast("B") if contiguous.size else memoryview(b"")
        entry["parameters"] = {"binary_data_size": raw.nbytes}
        chunks.append(raw)
    else:
        entry["data"] = array.ravel().tolist()
    return entry


def _assemble(header: dict[str, Any], chunks: list[Buffer]) -> tuple[list[Buffer], Optional[int]]:
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if not chunks:
        return [head], None
    return [head, *chunks], len(head)


def encode_request(
    inputs: Sequence[tuple[str, np.ndarray]],
    *,
    outputs: Optional[Iterable[str]] = None,
    binary_inputs: bool = True,
    binary_outputs: bool = True,
    parameters: Optional[Mapping[str, Any]] = None,
    request_id: Optional[str] = None,
) -> tuple[list[Buffer], Optional[int]]:
    """Body chunks and header length (None for pure JSON) of an infer request."""
    chunks: list[Buffer] = []
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
    return _assemble(header, chunks)


def encode_response(
    model_name: str,
    outputs: Sequence[tuple[str, np.ndarray, bool]],
    *,
    model_version: Optional[str] = None,
    request_id: Optional[str] = None,
    parameters: Optional[Mapping[str, Any]] = None,
) -> tuple[list[Buffer], Optional[int]]:
    """Body chunks and header length of an infer response; ``outputs`` are (name, array, binary)."""
    chunks: list[Buffer] = []
    header: dict[str, Any] = {"model_name": model_name}
    if model_version is not None:
        header["model_version"] = model_version
    if request_id is not None:
        header["id"] = request_id
    if parameters:
        header["parameters"] = dict(parameters)
    header["outputs"] = [_tensor_entry(n, a, b, chunks) for n, a, b in outputs]
    return _assemble(header, chunks)


def join(chunks: Sequence[Buffer]) -> bytes:
    """One ``bytes`` of body chunks."""
    return b"".join(chunks)
