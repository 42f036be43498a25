"""How rows become micro-batches and group calls, as pure logic (no processes): length buckets,
the token budget, DP balance and lockstep, and the scheduler's calls (fair turns, splitting, rows
back to their own request). The real group and endpoint run the same code in
``tests/teacher/test_endpoint_batching.py``."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from podium.protocol.batch import Options, validate_batch
from podium.teacher.compute.microbatch import assign_replicas, bucket_length, computed_tokens, plan_microbatches
from podium.teacher.endpoint.batching import Job, call_batch, deliver, form_call


def test_a_bucket_depends_on_the_row_alone_and_pads_at_most_an_eighth():
    assert [bucket_length(n) for n in (1, 3, 4, 5, 31, 32, 33, 64, 65, 100, 4097)] == \
        [4, 4, 4, 8, 32, 32, 36, 64, 72, 104, 4608]
    for n in range(32, 5000):
        b = bucket_length(n)
        assert n <= b <= n * 9 / 8 and b % 4 == 0
    assert bucket_length(5, seq_multiple=16) == 16


def test_micro_batches_hold_one_bucket_within_the_budget_longest_first():
    lengths = [3, 9, 1, 4, 2, 100, 101, 50]
    plan = plan_microbatches(lengths, 64)
    assert sorted(i for mb in plan for i in mb.rows) == list(range(len(lengths)))  # every row once
    for mb in plan:
        assert len({bucket_length(lengths[i]) for i in mb.rows}) == 1
        assert mb.tokens <= 64 or len(mb.rows) == 1  # a row longer than the budget runs alone
    assert [mb.seq_len for mb in plan] == sorted((mb.seq_len for mb in plan), reverse=True)
    assert plan_microbatches([4] * 10, 1000, max_rows=3)[0].rows == (0, 1, 2)
    with pytest.raises(ValueError, match="max_tokens"):
        plan_microbatches([1], 0)


def test_replicas_get_balanced_tokens_and_in_lockstep_as_many_micro_batches():
    lengths = [400] + [10] * 40
    plan = plan_microbatches(lengths, 64)
    shards = assign_replicas(plan, 2)
    loads = [sum(mb.tokens for mb in s) for s in shards]
    assert abs(loads[0] - loads[1]) <= max(mb.tokens for mb in plan)
    assert len(shards[0]) != len(shards[1])  # balanced by tokens, not by count
    locked = assign_replicas(plan, 2, lockstep=True)
    assert len(locked[0]) == len(locked[1])
    fillers = [mb for s in locked for mb in s if mb.rows == (-1,)]
    assert fillers and computed_tokens(locked) == computed_tokens(shards) + sum(mb.tokens for mb in fillers)


def _job(loop, caller, lengths, rid="r"):
    lengths = np.asarray(lengths)
    ids = np.zeros((len(lengths), int(lengths.max())), dtype=np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = np.arange(1, n + 1) + 100 * r
    batch = validate_batch(ids, lengths, vocab_size=10_000, max_sequence_length=None)
    return Job(rid, caller, batch, Options(), ("logprobs",), loop.create_future())


def test_calls_take_turns_between_callers_and_split_a_huge_request():
    loop = asyncio.new_event_loop()
    try:
        huge = _job(loop, "a", [64] * 100, "huge")
        small = [_job(loop, c, [8, 8], c) for c in ("b", "c")]
        queue = [huge, *small]
        first = form_call(queue, 256)
        served = {s.job.caller for s in first}
        assert served == {"a", "b", "c"}, first  # the huge request does not hold the others back
        assert huge.remaining > 0 and all(j.remaining == 0 for j in small)
        calls = 1
        while huge.remaining:
            segs = form_call(queue, 256, after_caller="a")
            assert sum(huge.costs[s.start] * (s.end - s.start) for s in segs) <= 256
            calls += 1
        assert calls > 10
    finally:
        loop.close()


def test_only_requests_with_the_same_options_share_a_call():
    loop = asyncio.new_event_loop()
    try:
        a = _job(loop, "a", [5])
        b = _job(loop, "b", [5])
        b.opts = Options(top_k=3)
        c = _job(loop, "c", [5])
        segs = form_call([a, b, c], 10_000)
        assert [s.job for s in segs] == [a, c]
        assert [s.job for s in form_call([a, b, c], 10_000)] == [b]
    finally:
        loop.close()


def _whole(blocks) -> np.ndarray:
    return np.concatenate(blocks)


def test_a_request_gets_the_calls_rows_as_blocks_never_an_assembled_copy():
    loop = asyncio.new_event_loop()
    try:
        wide, narrow = _job(loop, "a", [7, 7, 7], "wide"), _job(loop, "b", [3], "narrow")
        results = []
        while wide.done_rows < wide.batch.rows or narrow.done_rows < narrow.batch.rows:
            segs = form_call([j for j in (wide, narrow) if j.remaining], 16)  # splits "wide" over calls
            result = {"logprobs": call_batch(segs).input_ids.astype(np.float32)}
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


def test_a_call_of_one_whole_request_sends_its_own_ids_and_a_shared_call_a_batch_of_its_own():
    loop = asyncio.new_event_loop()
    try:
        alone = _job(loop, "a", [7, 7, 5], "alone")
        assert np.shares_memory(call_batch(form_call([alone], 1000)).input_ids, alone.batch.input_ids)
        first, second = _job(loop, "a", [7, 3], "first"), _job(loop, "b", [4], "second")
        shared = call_batch(form_call([first, second], 1000))
        assert shared.input_ids.shape == (3, 7) and not np.shares_memory(shared.input_ids, first.batch.input_ids)
        assert np.array_equal(shared.input_ids[:2], first.batch.input_ids)
        assert np.array_equal(shared.input_ids[2, :4], second.batch.input_ids[0]) and not shared.input_ids[2, 4:].any()
    finally:
        loop.close()


def test_rows_come_back_to_their_own_request_in_their_own_order():
    loop = asyncio.new_event_loop()
    rng = random.Random(3)
    try:
        jobs = [_job(loop, f"c{k % 3}", [rng.randint(1, 40) for _ in range(rng.randint(1, 6))], f"r{k}")
                for k in range(12)]
        done = []
        while len(done) < len(jobs):
            segs = form_call(jobs, 48)
            batch = call_batch(segs)
            # the "group": each row's answer is its own ids (zeros past its length), as floats
            result = {"logprobs": batch.input_ids.astype(np.float32)}
            done += deliver(segs, result)
        for job in jobs:
            expected = np.zeros((job.batch.rows, job.batch.width), dtype=np.float32)
            expected[:, :job.batch.input_ids.shape[1]] = job.batch.input_ids
            assert np.array_equal(_whole(job.results["logprobs"]), expected), job.request_id
    finally:
        loop.close()
