"""Memory that large answers are received into: an earlier answer's, once its caller let go of it.

An answer is handed over as arrays (a payload as a tensor) over the very bytes it was received
into, so each answer needs memory of its own. Fresh memory costs its page faults: the kernel maps
and zeroes each page as the socket's bytes first land in it, ~0.1 s per GiB on a quiet machine and
several times that on a loaded one, beside the ~0.4 s a loopback takes to move the GiB. A 1 GiB
hidden-state payload received into fresh memory came at 0.53x of a raw receiver reusing one buffer
(and at the speed of a raw receiver into fresh memory); received into reused memory, at the raw speed.

:class:`ReceiveBuffers` hands out, for an answer of at least :data:`RECYCLE_FROM` bytes, a slab an
earlier answer was received into once nothing refers to it any more: the caller dropped every array,
tensor and view of that answer (CPython counts the references: a slab nothing but this pool holds
is free). A caller that keeps its answers gets fresh memory each time, as before: memory in use is
never written. Slabs come in steps of :data:`GRAIN` bytes, so answers of nearby sizes (a batch's
padded length changes from call to call) share one; at most :data:`KEEP_FREE` free slabs are kept
(the memory a process holds for answers to come), the smallest that fits is taken.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

RECYCLE_FROM = 32 << 20  # smaller answers come from the allocator (its pools are already mapped)
GRAIN = 32 << 20  # a slab's size is a multiple of this (its pages are mapped only where an answer lands)
KEEP_FREE = 2  # free slabs kept for answers to come; more are given back to the system
_TRACKED = 8  # slabs followed at most (the oldest in use are forgotten: their caller frees them)


def _held_alone() -> int:
    """The reference count of a slab that only the pool's list holds, as :meth:`ReceiveBuffers._free`
    reads it (the list's reference and the count's own argument)."""
    probe = [np.empty(1, dtype=np.uint8)]
    return sys.getrefcount(probe[0])


_ALONE = _held_alone()


class ReceiveBuffers:
    """Writable memory for answers of ``size`` bytes (:meth:`take`), recycled (see the module doc)."""

    def __init__(self, keep_free: int = KEEP_FREE) -> None:
        self.keep_free = keep_free
        self._slabs: list[np.ndarray] = []  # oldest first
        self._lock = threading.Lock()
        self.reused = 0  # answers received into a recycled slab

    def take(self, size: int) -> memoryview:
        """``size`` writable bytes that nothing else refers to (not zero-filled)."""
        if size < RECYCLE_FROM:
            return np.empty(size, dtype=np.uint8).data
        with self._lock:
            free = [i for i in range(len(self._slabs)) if self._slabs[i].nbytes >= size and self._free(i)]
            if free:
                slab = self._slabs[min(free, key=lambda i: self._slabs[i].nbytes)]
                self.reused += 1
            else:
                slab = np.empty(-(-size // GRAIN) * GRAIN, dtype=np.uint8)
                self._slabs.append(slab)
                self._trim()
            return slab[:size].data

    def _free(self, index: int) -> bool:
        return sys.getrefcount(self._slabs[index]) <= _ALONE

    def _trim(self) -> None:
        """At most :attr:`keep_free` free slabs (the newest kept) and :data:`_TRACKED` in all."""
        free = [i for i in range(len(self._slabs)) if self._free(i)]
        drop = set(free[:max(0, len(free) - self.keep_free)])
        kept = [slab for i, slab in enumerate(self._slabs) if i not in drop]
        self._slabs = kept[-_TRACKED:]

    @property
    def held_bytes(self) -> int:
        """Bytes of the slabs followed (free or in use)."""
        with self._lock:
            return sum(slab.nbytes for slab in self._slabs)


RECEIVE_BUFFERS = ReceiveBuffers()
"""The process's pool: every transport receives its large answers through it."""
