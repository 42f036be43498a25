"""The group's watch on a real TP2 group (tiny Llama, CPU/gloo): a rank frozen for real (SIGSTOP)
fails its call within the allowance, named as the rank that stopped answering, and the group is
broken from then on (the launcher then ends the generation: ``test_faults.py`` on Slurm); the
warm-up forward's shape. A rank that freezes in the warm-up forward, through the launcher:
``test_local_cluster.py``. The decisions alone: ``test_liveness.py``."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.checkpoints import random_batch
from harness.teacher_groups import teacher_cfg

from podium.protocol.query import ask

FLOOR_S = 8.0  # the tests' server.stuck_after_s


@pytest.fixture
def tp2_group(ray_cluster: Any, tiny_llama_checkpoint: Path) -> Iterator[Any]:
    from podium.teacher.compute.group import GroupOptions, TeacherWorkerGroup

    group = TeacherWorkerGroup(teacher_cfg(tiny_llama_checkpoint, per_node=2, tp=2),
                               GroupOptions(stuck_after_s=FLOOR_S))
    yield group
    for info in group.worker_info:  # a frozen worker goes on, then the group ends
        try:
            os.kill(info.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    group.shutdown()


def test_a_frozen_rank_fails_its_call_named_and_breaks_the_group(tp2_group: Any) -> None:
    from podium.teacher.compute.waiting import StuckForwardError

    group = tp2_group
    data = random_batch(256, [6, 11, 3], seed=3)
    batch = group.validate(data)
    query = ask(vocab_size=group.facts.vocab_size)
    group.compute(batch, query)  # a call that returns: the watch's measured speed, each rank's last end
    live = group.liveness
    assert live.stuck is None and live.call_age_s is None
    assert {r.rank for r in live.ranks if r.last_forward_end is not None} == {0, 1}
    assert live.slowest is not None

    frozen = group.worker_info[1]
    os.kill(frozen.pid, signal.SIGSTOP)  # a rank that stops making progress: no answer, no error
    t0 = time.monotonic()
    with pytest.raises(StuckForwardError) as stuck:
        group.compute(batch, query)
    took = time.monotonic() - t0
    verdict = str(stuck.value)
    print(f"{took:.1f} s: {verdict}")
    assert verdict.startswith(f"teacher {group.spec.name!r}: stuck call: no progress for ")
    first = verdict.split("): ", 1)[1].split("; ")[0]
    assert re.match(rf"rank 1 \({frozen.node_ip}, pid {frozen.pid}\) has not finished micro-batch 1 of \d+ ", first)
    assert first.endswith("(frozen?)")
    assert group.broken == verdict and group.liveness.stuck == verdict
    with pytest.raises(RuntimeError, match=r"broken by an earlier failure: .*stuck call"):
        group.compute(batch, query)


def test_the_warm_up_runs_a_full_micro_batch_of_the_longest_rows(llama_group: Any) -> None:
    """The warm-up forward's shape: the group's micro-batch budget, in rows of the longest length."""
    stats = llama_group.warm_up()
    facts = llama_group.facts
    assert stats.microbatches == facts.data_parallel_size == 1
    assert stats.computed_tokens <= facts.max_tokens_per_microbatch
    assert stats.computed_tokens > facts.max_tokens_per_microbatch - facts.max_sequence_length
    assert stats.tokens % stats.rows == 0 and stats.tokens // stats.rows <= facts.max_sequence_length
