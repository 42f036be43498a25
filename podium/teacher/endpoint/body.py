"""Reading an infer request's body: bounded in size and in time, memory taken as bytes arrive.

A body over its limit is a 413 naming the setting (``podium.server.max_body_mb`` for the binary
extension, the far smaller ``podium.server.max_json_body_mb`` for a JSON body), from
``Content-Length`` before a byte is read or while a chunked one arrives. A body with no byte for
``body_timeout_s`` is a 408 (its connection is then closed). With the binary extension, the JSON
header (``Inference-Header-Content-Length`` bytes) is read and checked first; ``Content-Length``
must then be exactly the header plus the bytes its binary tensors declare, else 400 naming the
tensor and the numbers. The binary part goes into one writable buffer whose pages are committed
only as bytes are written into it (``numpy.empty``: a stalled upload costs what it sent, not what
it announced); the tensors are numpy views of it and reach the group without a copy. A JSON body
grows as its bytes arrive. Decoding is :func:`read_request`'s caller's (off the event loop); the
codec is :mod:`podium.protocol.oip`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from aiohttp import web

from podium.protocol import oip
from podium.web.errors import RequestError

MIB = 1024 * 1024


@dataclass(frozen=True)
class BodyLimits:
    """How large and how slow a body may be."""

    binary_bytes: int  # a body with the binary extension
    json_bytes: int  # a JSON body
    timeout_s: float  # the longest wait for the body's next bytes

    def too_large(self, size: int | str, binary: bool) -> RequestError:
        if binary:
            return RequestError(413, f"binary request body of {size} bytes is larger than the limit of "
                                     f"{self.binary_bytes} bytes (podium.server.max_body_mb)")
        return RequestError(413, f"JSON request body of {size} bytes is larger than the limit of {self.json_bytes} "
                                 "bytes (podium.server.max_json_body_mb; binary tensors may be larger)")


@dataclass(frozen=True)
class RawRequest:
    """A body read but not decoded: either ``json`` (all of it) or ``head`` and ``binary``."""

    json: bytes | None = None
    head: oip.RequestHead | None = None
    binary: memoryview | None = None

    def decode(self) -> oip.InferRequest:
        """The decoded request (CPU work: run it off the event loop)."""
        if self.head is not None:
            assert self.binary is not None
            return self.head.decode(self.binary)
        assert self.json is not None
        return oip.decode_request(self.json)


def _buffer(size: int) -> memoryview:
    """Room for ``size`` bytes of a request body, committed as it is written (one place, so a test
    can watch what is allocated)."""
    return np.empty(size, dtype=np.uint8).data


async def _next(request: web.Request, limit: int, limits: BodyLimits, got: int, length: int | None) -> bytes:
    """Up to ``limit`` more bytes of the body (b"" at its end), or a 408 when none come in time."""
    try:
        return await asyncio.wait_for(request.content.read(limit), limits.timeout_s)
    except asyncio.TimeoutError:
        of = f" of {length}" if length is not None else ""
        t = limits.timeout_s
        raise RequestError(408, f"request body stalled (podium.server.body_timeout_s): no byte for {t:g}"
                                f"s after {got}{of} bytes") from None


async def _read_into(request: web.Request, size: int, length: int, got: int, limits: BodyLimits) -> memoryview:
    """The next ``size`` bytes of a body of ``length`` (``got`` read before), in a new buffer."""
    view = _buffer(size)
    filled = 0
    while filled < size:
        chunk = await _next(request, size - filled, limits, got + filled, length)
        if not chunk:
            raise RequestError(400, f"body ended after {got + filled} of the {length} bytes its Content-Length "
                               "announced")
        view[filled:filled + len(chunk)] = chunk
        filled += len(chunk)
    return view


async def _read_all(request: web.Request, limit: int, limits: BodyLimits, binary: bool,
                    length: int | None) -> bytearray:
    """The whole body, grown as it arrives, at most ``limit`` bytes (413 past it)."""
    body = bytearray()
    while True:
        chunk = await _next(request, MIB, limits, len(body), length)
        if not chunk:
            return body
        if len(body) + len(chunk) > limit:
            raise limits.too_large(f"more than {limit}", binary)
        body += chunk


async def read_request(request: web.Request, limits: BodyLimits) -> RawRequest:
    """Read an infer request's body within ``limits``; decode it with :meth:`RawRequest.decode`."""
    length = request.content_length
    header_value = request.headers.get(oip.HEADER_LENGTH)
    binary = header_value is not None
    limit = limits.binary_bytes if binary else limits.json_bytes
    if length is not None and length > limit:
        raise limits.too_large(length, binary)
    if length is None:  # chunked
        body = await _read_all(request, limit, limits, binary, None)
        header_length = oip.parse_header_length(header_value, len(body))
        if header_length is None:
            return RawRequest(json=bytes(body))
        view = memoryview(body)
        head = oip.parse_request_head(view[:header_length], body_length=len(body), binary_follows=True)
        return RawRequest(head=head, binary=view[header_length:])
    header_length = oip.parse_header_length(header_value, length)
    if header_length is None:
        return RawRequest(json=bytes(await _read_all(request, limit, limits, binary, length)))
    raw = await _read_into(request, header_length, length, 0, limits)
    head = oip.parse_request_head(raw, body_length=length, binary_follows=True)
    available = length - header_length
    try:
        head.check_binary_length(available)
    except oip.OIPError as exc:
        raise RequestError(400, f"{exc.message} (Content-Length {length} = {header_length} bytes of JSON header "
                           f"+ {available}; the binary tensors declare {head.binary_bytes})") from None
    return RawRequest(head=head, binary=await _read_into(request, available, length, header_length, limits))
