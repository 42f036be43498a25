"""How a batch's rows become forward micro-batches, as pure logic (no processes): length buckets, the
token budget, DP balance and lockstep. The real group runs the same code in
``tests/teacher/test_endpoint_batching.py``."""

from __future__ import annotations

import pytest

from podium.teacher.compute.microbatch import assign_replicas, bucket_length, computed_tokens, plan_microbatches


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
