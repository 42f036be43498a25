"""A request whose own computation fails fails alone: the real group (TP2 on the Ray test cluster)
stays whole and serves the next call; a worker that died breaks it for good.

The failing request is the one the workers are told to fail (``PODIUM_FAULTS fail_call_token``):
every rank raises, as an out-of-memory on every rank of a too-large request would.
"""

from __future__ import annotations

import pytest
from fixtures.checkpoints import hf_oracle_logprobs
from harness.teacher_groups import TOL, shut_down_and_check, teacher_cfg

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

FAIL_TOKEN = 7


@pytest.fixture(scope="module")
def group(ray_cluster, tiny_llama_checkpoint):
    from podium.faults import FAULTS_ENV
    from podium.teacher.compute.group import GroupOptions, TeacherWorkerGroup

    options = GroupOptions(env_vars={FAULTS_ENV: f"fail_call_token={FAIL_TOKEN}"}, failed_call_settle_s=60.0)
    group = TeacherWorkerGroup(teacher_cfg(tiny_llama_checkpoint, per_node=2, tp=2), options)
    try:
        yield group
    finally:
        shut_down_and_check(group)


def test_a_failing_request_fails_alone_and_a_dead_worker_breaks_the_group(group, tiny_llama_checkpoint):
    import ray

    good = {"input_ids": [[3, 4, 5, 6, 9]], "input_lengths": [5]}
    before = group.get_logprobs(good)["logprobs"]
    oracle = hf_oracle_logprobs(tiny_llama_checkpoint, good["input_ids"], good["input_lengths"])
    assert (before - oracle).abs().max() < TOL

    with pytest.raises(Exception, match="fault injected by PODIUM_FAULTS fail_call_token"):
        group.get_logprobs({"input_ids": [[FAIL_TOKEN, 4, 5]], "input_lengths": [3]})
    assert group.broken is None  # every worker came back: the request failed, not the group
    again = group.get_logprobs(good)["logprobs"]
    assert (again - before).abs().max() == 0

    ray.kill(group._actors[1])  # a worker dies (its node lost, the process killed)
    with pytest.raises(ray.exceptions.RayActorError):
        group.get_logprobs(good)
    assert group.broken is not None
    with pytest.raises(RuntimeError, match="group is broken by an earlier failure"):
        group.get_logprobs(good)
