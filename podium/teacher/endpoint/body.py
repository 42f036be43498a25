"""Reading an infer request's body, and its framing checked before room for it is allocated.

A body over the limit is a 413 (from ``Content-Length``, or while reading a chunked one). With the
binary extension, the JSON header (``Inference-Header-Content-Length`` bytes) is read and checked
first; ``Content-Length`` must then be exactly the header plus the bytes its binary tensors
declare, else 400 naming the tensor and the numbers, before room for those bytes is allocated. The
binary part goes into one writable buffer: the tensors are numpy views of it and reach the group
without a copy. The codec itself is :mod:`podium.protocol.oip`.
"""

from __future__ import annotations

from aiohttp import web

from podium.protocol import oip
from podium.teacher.endpoint.errors import RequestError


def _buffer(size: int) -> bytearray:
    """Room for ``size`` bytes of a request body (one place, so a test can watch what is allocated)."""
    return bytearray(size)


async def _read_into(request: web.Request, size: int, length: int, got: int) -> bytearray:
    """The next ``size`` bytes of a body of ``length`` (``got`` read before), in a new buffer."""
    buf = _buffer(size)
    view = memoryview(buf)
    filled = 0
    while filled < size:
        chunk = await request.content.read(size - filled)
        if not chunk:
            raise RequestError(400, f"body ended after {got + filled} of the {length} bytes its Content-Length "
                               "announced")
        view[filled:filled + len(chunk)] = chunk
        filled += len(chunk)
    return buf


async def read_request(request: web.Request, limit: int) -> oip.InferRequest:
    """Read and decode an infer request whose body may take up to ``limit`` bytes."""
    length = request.content_length
    header_value = request.headers.get(oip.HEADER_LENGTH)
    if length is not None and length > limit:
        raise RequestError(413, f"request body of {length} bytes is larger than the limit of {limit} bytes")
    if length is None:  # chunked: aiohttp enforces client_max_size while reading
        try:
            body = bytearray(await request.read())
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(413, f"request body is larger than the limit of {limit} bytes") from None
        return oip.decode_request(body, oip.parse_header_length(header_value, len(body)))
    header_length = oip.parse_header_length(header_value, length)
    if header_length is None:
        return oip.decode_request(await _read_into(request, length, length, 0))
    raw = await _read_into(request, header_length, length, 0)
    head = oip.parse_request_head(raw, body_length=length, binary_follows=True)
    available = length - header_length
    try:
        head.check_binary_length(available)
    except oip.OIPError as exc:
        raise RequestError(400, f"{exc.message} (Content-Length {length} = {header_length} bytes of JSON header "
                           f"+ {available}; the binary tensors declare {head.binary_bytes})") from None
    binary = await _read_into(request, available, length, header_length)
    return head.decode(binary)
