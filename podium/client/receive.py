"""An answer as the caller gets it: :func:`caller_arrays`, its narrow tensors converted while the
rest of it is still arriving (:class:`EagerConversion`).

The caller gets float32 values and int64 ids whatever travelled (BF16 values, INT32 ids: half the
bytes). Converting after the whole body is in costs a pass over the answer that nothing overlaps:
for a 64 x 2048 x 64 BF16/INT32 answer ~9 ms beside an ~19 ms transfer on loopback. An
:class:`EagerConversion` is told by the transport how far the body has arrived
(:meth:`EagerConversion.received`, after each read) and converts what has, element-aligned, into the
arrays the caller will get, while the teacher's sender thread fills the socket with the rest.

It is an optimisation only: it reads the JSON header with the standard library to learn where each
tensor's bytes lie, and anything it does not understand (no binary part, a malformed header, a
shape or size that does not add up) makes it do nothing. :func:`podium.protocol.oip.decode_response`
still decodes and checks the whole answer; :meth:`EagerConversion.take` hands over an array only
where that decoding agrees with what was converted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from typing import Any

import numpy as np

from podium.protocol import oip
from podium.protocol.names import INDEX_OUTPUTS, PAYLOAD_OUTPUTS, VALUE_OUTPUTS


@dataclass
class _Pending:
    """One tensor to convert: where its bytes lie in the body, what it becomes, how far it went."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    start: int  # its first byte in the body
    itemsize: int
    out: np.ndarray  # flat, the caller's dtype
    done: int = 0  # elements converted

    def convert(self, body: memoryview, got: int) -> None:
        """The elements whose bytes are all in ``body[:got]`` and not yet converted."""
        ready = min(self.out.size, max(0, (got - self.start) // self.itemsize))
        if ready <= self.done:
            return
        lo, hi = self.start + self.done * self.itemsize, self.start + ready * self.itemsize
        src = np.frombuffer(body[lo:hi], dtype=oip.DATATYPES[self.datatype])
        if self.datatype == "BF16":
            wide = self.out[self.done:ready].view(np.uint32)
            np.copyto(wide, src)  # widened, then shifted into float32's upper half
            wide <<= 16
        else:
            np.copyto(self.out[self.done:ready], src)
        self.done = ready


class EagerConversion:
    """Converts an answer's BF16 values (to float32) and, when ``widen_ids``, its INT32 ids (to
    int64) as their bytes arrive (see the module doc)."""

    def __init__(self, outputs: tuple[str, ...] | list[str], widen_ids: bool) -> None:
        self.outputs = set(outputs)
        self.widen_ids = widen_ids
        self._body: memoryview | None = None
        self._pending: list[_Pending] = []

    def received(self, body: memoryview, got: int, headers: Message) -> None:
        """``body[:got]`` has arrived (a new ``body``: a new answer, e.g. after a retry)."""
        if body is not self._body:
            plan = self._plan(body, got, headers)
            if plan is None:
                return  # its JSON header is not in yet
            self._body, self._pending = body, plan
        for pending in self._pending:
            pending.convert(body, got)

    def _plan(self, body: memoryview, got: int, headers: Message) -> list[_Pending] | None:
        """What to convert, where (empty: nothing, or nothing understood); None until the JSON
        header has arrived."""
        try:
            header_length = int(headers.get(oip.HEADER_LENGTH) or 0)
            if not 0 < header_length <= body.nbytes:
                return []
            if header_length > got:
                return None
            outputs = json.loads(bytes(body[:header_length])).get("outputs", [])
            plan, offset = [], header_length
            for entry in outputs:
                size = (entry.get("parameters") or {}).get("binary_data_size")
                if size is None:
                    continue
                datatype, shape = entry["datatype"], tuple(int(n) for n in entry["shape"])
                itemsize = oip.DATATYPES[datatype].itemsize
                if size != math.prod(shape) * itemsize or offset + size > body.nbytes:
                    return []  # not what it seems: the decoder will say what is wrong
                target = self._target(entry["name"], datatype)
                if target is not None:
                    plan.append(_Pending(entry["name"], datatype, shape, offset, itemsize,
                                         np.empty(math.prod(shape), dtype=target)))
                offset += size
            return plan
        except (ValueError, TypeError, KeyError, AttributeError):
            return []

    def _target(self, name: str, datatype: str) -> Any:
        if name not in self.outputs:
            return None
        if datatype == "BF16" and name in VALUE_OUTPUTS:
            return np.float32
        if datatype == "INT32" and name in INDEX_OUTPUTS and self.widen_ids:
            return np.int64
        return None

    def take(self, body: memoryview, decoded: oip.InferResponse) -> dict[str, np.ndarray]:
        """The converted arrays, finished, for the outputs ``decoded`` (the checked answer, of
        ``body``) agrees on; none when ``body`` is not the one watched (an earlier attempt's)."""
        out: dict[str, np.ndarray] = {}
        if self._body is None or body is not self._body:
            return out
        for pending in self._pending:
            array = decoded.outputs.get(pending.name)
            if array is None or decoded.datatypes.get(pending.name) != pending.datatype or \
                    tuple(array.shape) != pending.shape:
                continue
            pending.convert(self._body, self._body.nbytes)
            out[pending.name] = pending.out.reshape(pending.shape)
        return out


def caller_arrays(decoded: oip.InferResponse, outputs: Sequence[str], widen: bool = True,
                  converted: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The ``outputs`` of an answer as the caller gets them: values float32 (BF16 decoded), ids int64
    (as they travelled unless ``widen``: :func:`pipelined` widens them as it puts them in place);
    those in ``converted`` as they are (converted while the answer arrived: :mod:`.receive`); a
    full-vocabulary payload in the dtype it travelled (:func:`payload_tensor`)."""
    result = {}
    for name in outputs:
        if name in PAYLOAD_OUTPUTS:
            result[name] = payload_tensor(decoded.outputs[name], decoded.datatypes.get(name, "FP32"))
        elif converted and name in converted:
            result[name] = converted[name]
        elif name in VALUE_OUTPUTS:
            result[name] = decoded.as_float32(name)
        elif name in INDEX_OUTPUTS and widen:
            result[name] = decoded.outputs[name].astype(np.int64, copy=False)
        else:
            result[name] = decoded.outputs[name]
    return result


def payload_tensor(array: np.ndarray, datatype: str) -> Any:
    """A full-vocabulary payload as the caller gets it, in the dtype it asked and without a copy: a
    torch tensor over the received body (``torch.bfloat16`` for BF16) where torch is installed; else
    the numpy array (BF16 as its 16-bit patterns, ``uint16``: numpy has no bfloat16)."""
    try:
        import torch
    except ImportError:
        return array
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if datatype == "BF16" else tensor
