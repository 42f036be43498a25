"""What an encoded body is made of, and how bfloat16 travels.

A body is a list of :data:`Chunk`: bytes-like pieces, or a :class:`CastBlock` (an array whose bytes
travel in another dtype, cast a piece at a time as they are written, so no whole converted copy is
ever made). bfloat16 has no numpy dtype: its values travel as their 16-bit patterns
(:func:`to_bf16`, :func:`from_bf16`). Only numpy is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np


def to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (round to nearest even), ``uint16``."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (``uint16``) as float32 values (exact)."""
    wide = np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32)
    wide <<= 16  # in place: one array made, not two
    return wide.view(np.float32)


Buffer = bytes | bytearray | memoryview


class CastBlock:
    """A block of an answer whose bytes travel in another dtype than the array holds, cast a piece
    (:data:`PIECE_BYTES`) at a time as it is written (:meth:`pieces`): no whole converted copy is
    made (a fresh 64 MB array costs its page faults, on a thread's arena every time), and each piece
    is still in cache when the socket copies it. ``cast(part)`` gives a part's values in ``dtype``
    (numpy's ``astype`` by default)."""

    PIECE_BYTES = 1 << 20

    def __init__(self, array: np.ndarray, dtype: Any, cast: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.array = np.ascontiguousarray(array)
        self.dtype = np.dtype(dtype)
        self._cast = cast
        self.shape = self.array.shape
        self.ndim = self.array.ndim
        self.size = self.array.size
        self.nbytes = self.size * self.dtype.itemsize

    def cast(self, part: np.ndarray) -> np.ndarray:
        out = self._cast(part) if self._cast is not None else part.astype(self.dtype)
        if out.dtype != self.dtype or out.shape != part.shape:
            raise TypeError(f"a cast to {self.dtype} gave {out.dtype} {list(out.shape)} for {list(part.shape)}")
        return out

    def pieces(self) -> Iterator[memoryview]:
        flat = self.array.reshape(-1)
        step = max(1, self.PIECE_BYTES // self.dtype.itemsize)
        for start in range(0, self.size, step):
            yield self.cast(flat[start:start + step]).data.cast("B")

    def values(self) -> np.ndarray:
        """The whole block cast (for JSON, or a small answer sent in one write)."""
        return self.cast(self.array)


Chunk = Buffer | CastBlock
"""A piece of an encoded body: bytes, or a block cast as it is written."""


def chunk_nbytes(chunk: Chunk) -> int:
    return chunk.nbytes if isinstance(chunk, CastBlock) else memoryview(chunk).nbytes


def join(chunks: Sequence[Chunk]) -> bytes:
    """One ``bytes`` of body chunks."""
    return b"".join(c.values().data if isinstance(c, CastBlock) else c for c in chunks)
