"""Large answers are received into the memory of earlier ones their callers let go of, never into
memory still referred to (:mod:`podium.client.buffers`)."""

from __future__ import annotations

import numpy as np
import torch

from podium.client.buffers import GRAIN, RECYCLE_FROM, ReceiveBuffers


def test_small_answers_come_from_the_allocator():
    pool = ReceiveBuffers()
    a = pool.take(1000)
    assert a.nbytes == 1000 and not a.readonly
    assert pool.held_bytes == 0


def test_a_let_go_slab_is_reused_for_an_answer_that_fits():
    pool = ReceiveBuffers()
    first = pool.take(RECYCLE_FROM + 1)
    address = np.frombuffer(first, dtype=np.uint8).ctypes.data
    del first
    second = pool.take(RECYCLE_FROM + GRAIN)  # in the same grain: the same slab
    assert np.frombuffer(second, dtype=np.uint8).ctypes.data == address
    assert pool.reused == 1 and second.nbytes == RECYCLE_FROM + GRAIN


def test_memory_still_referred_to_is_never_handed_out_again():
    pool = ReceiveBuffers()
    body = pool.take(RECYCLE_FROM)
    array = np.frombuffer(body[64:], dtype=np.uint16)  # what decoding makes of it
    tensor = torch.from_numpy(array[4:]).view(torch.bfloat16)  # what the caller gets
    del body, array
    tensor.zero_()
    other = pool.take(RECYCLE_FROM)
    np.frombuffer(other, dtype=np.uint8)[:] = 0xFF
    assert pool.reused == 0
    assert bool((tensor == 0).all())  # untouched by the second answer
    del other, tensor
    pool.take(RECYCLE_FROM)
    assert pool.reused == 1


def test_free_slabs_kept_are_bounded():
    pool = ReceiveBuffers(keep_free=1)
    held = [pool.take(RECYCLE_FROM + k * GRAIN) for k in range(3)]  # three sizes, all in use
    assert pool.held_bytes == sum(-(-h.nbytes // GRAIN) * GRAIN for h in held)
    del held
    pool.take(RECYCLE_FROM + 5 * GRAIN)  # larger than any: a new slab; two of the free ones go
    assert pool.held_bytes == (RECYCLE_FROM + 5 * GRAIN) + (RECYCLE_FROM + 2 * GRAIN)
