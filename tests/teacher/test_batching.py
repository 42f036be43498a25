"""How the endpoint's batcher joins requests into batches for the group, as pure logic (no
processes): fair turns between callers, splitting a huge request, only requests asking alike
together, rows back to their own request as blocks. The real group and endpoint run the same code
in ``tests/teacher/test_endpoint_batching.py``."""

from __future__ import annotations

import asyncio
import random

import numpy as np

from podium.protocol.batch import validate_batch
from podium.protocol.query import Query, ask
from podium.teacher.endpoint.batching import QueuedRequest, deliver, form_batch, join_rows


def _request(loop, caller, lengths, rid="r"):
    lengths = np.asarray(lengths)
    ids = np.zeros((len(lengths), int(lengths.max())), dtype=np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = np.arange(1, n + 1) + 100 * r
    batch = validate_batch(ids, lengths, vocab_size=10_000, max_sequence_length=None)
    return QueuedRequest(rid, caller, batch, Query(), loop.create_future())


def test_batches_take_turns_between_callers_and_split_a_huge_request():
    loop = asyncio.new_event_loop()
    try:
        huge = _request(loop, "a", [64] * 100, "huge")
        small = [_request(loop, c, [8, 8], c) for c in ("b", "c")]
        queue = [huge, *small]
        first = form_batch(queue, 256)
        served = {s.request.caller for s in first}
        assert served == {"a", "b", "c"}, first  # the huge request does not hold the others back
        assert huge.remaining > 0 and all(j.remaining == 0 for j in small)
        calls = 1
        while huge.remaining:
            segs = form_batch(queue, 256, after_caller="a")
            assert sum(huge.costs[s.start] * (s.end - s.start) for s in segs) <= 256
            calls += 1
        assert calls > 10
    finally:
        loop.close()


def test_only_requests_asking_alike_share_a_batch():
    loop = asyncio.new_event_loop()
    try:
        a = _request(loop, "a", [5])
        b = _request(loop, "b", [5])
        b.query = ask(top_k=3)
        c = _request(loop, "c", [5])
        segs = form_batch([a, b, c], 10_000)
        assert [s.request for s in segs] == [a, c]
        assert [s.request for s in form_batch([a, b, c], 10_000)] == [b]
    finally:
        loop.close()


def _whole(blocks) -> np.ndarray:
    return np.concatenate(blocks)


def test_a_request_gets_the_batchs_rows_as_blocks_never_an_assembled_copy():
    loop = asyncio.new_event_loop()
    try:
        wide, narrow = _request(loop, "a", [7, 7, 7], "wide"), _request(loop, "b", [3], "narrow")
        results = []
        while wide.done_rows < wide.batch.rows or narrow.done_rows < narrow.batch.rows:
            segs = form_batch([j for j in (wide, narrow) if j.remaining], 16)  # splits "wide" over batches
            result = {"logprobs": join_rows(segs).input_ids.astype(np.float32)}
            results.append(result["logprobs"])
            deliver(segs, result)
        blocks = wide.results["logprobs"]
        assert len(blocks) > 1 and sum(b.shape[0] for b in blocks) == 3  # more than one call, rows in order
        # each block spans the request's width: it is the call's own rows, not a copy
        assert all(any(np.shares_memory(b, r) for r in results) for b in blocks)
        assert np.array_equal(_whole(blocks), wide.batch.input_ids.astype(np.float32))
        # the narrower request's rows are cut to its own width (a view would not be contiguous)
        (block,) = narrow.results["logprobs"]
        assert block.flags.c_contiguous and not any(np.shares_memory(block, r) for r in results)
        assert np.array_equal(block, narrow.batch.input_ids.astype(np.float32))
    finally:
        loop.close()


def test_a_batch_of_one_whole_request_sends_its_own_ids_and_a_shared_batch_ids_of_its_own():
    loop = asyncio.new_event_loop()
    try:
        alone = _request(loop, "a", [7, 7, 5], "alone")
        assert np.shares_memory(join_rows(form_batch([alone], 1000)).input_ids, alone.batch.input_ids)
        first, second = _request(loop, "a", [7, 3], "first"), _request(loop, "b", [4], "second")
        shared = join_rows(form_batch([first, second], 1000))
        assert shared.input_ids.shape == (3, 7) and not np.shares_memory(shared.input_ids, first.batch.input_ids)
        assert np.array_equal(shared.input_ids[:2], first.batch.input_ids)
        assert np.array_equal(shared.input_ids[2, :4], second.batch.input_ids[0]) and not shared.input_ids[2, 4:].any()
    finally:
        loop.close()


def test_rows_come_back_to_their_own_request_in_their_own_order():
    loop = asyncio.new_event_loop()
    rng = random.Random(3)
    try:
        jobs = [_request(loop, f"c{k % 3}", [rng.randint(1, 40) for _ in range(rng.randint(1, 6))], f"r{k}")
                for k in range(12)]
        done = []
        while len(done) < len(jobs):
            segs = form_batch(jobs, 48)
            batch = join_rows(segs)
            # the "group": each row's answer is its own ids (zeros past its length), as floats
            result = {"logprobs": batch.input_ids.astype(np.float32)}
            done += deliver(segs, result)
        for job in jobs:
            expected = np.zeros((job.batch.rows, job.batch.width), dtype=np.float32)
            expected[:, :job.batch.input_ids.shape[1]] = job.batch.input_ids
            assert np.array_equal(_whole(job.results["logprobs"]), expected), job.request_id
    finally:
        loop.close()
