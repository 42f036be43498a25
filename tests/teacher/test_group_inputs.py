"""What the worker group checks before it places anything: a plain mapping by the one batch rule,
a spec from the plan, known options, layouts that cannot work."""

from __future__ import annotations

import pytest


def test_group_validates_a_plain_mapping_with_the_one_batch_rule():
    from podium.protocol.batch import Batch, BatchError
    from podium.teacher.compute.group import TeacherWorkerGroup
    from podium.teacher.seam import GroupFacts

    group = TeacherWorkerGroup.__new__(TeacherWorkerGroup)  # only validate's attributes
    group.facts = GroupFacts(vocab_size=50, max_sequence_length=32)
    batch = group.validate({"input_ids": [[1, 2, 3, 99]], "input_lengths": [3]})
    assert batch.input_ids.tolist() == [[1, 2, 3]] and batch.width == 4  # cut, padding not checked
    assert group.validate(batch) is batch  # a validated batch is trusted, not checked again
    with pytest.raises(BatchError, match="must be a mapping"):
        group.validate([1, 2])
    with pytest.raises(BatchError, match=r"input_ids\[0, 1\] = 77 not in 0..49"):
        group.validate({"input_ids": [[1, 77]], "input_lengths": [2]})
    assert isinstance(batch, Batch)


def test_group_takes_a_spec_from_the_plan_and_known_options_only(tiny_llama_checkpoint):
    from podium.config.spec import TeacherSpec
    from podium.teacher.compute.group import GroupOptions, TeacherWorkerGroup

    with pytest.raises(TypeError, match="takes a TeacherSpec"):
        TeacherWorkerGroup({"model_name": str(tiny_llama_checkpoint)})
    spec = TeacherSpec(key="k", name="math", aliases=("math",), model_name=str(tiny_llama_checkpoint),
                       num_nodes=1, gpus_per_node=1)
    with pytest.raises(TypeError, match="bogus"):
        TeacherWorkerGroup(spec, GroupOptions(), bogus=1)


def test_layout_errors_come_before_ray(tiny_llama_checkpoint):
    from pydantic import ValidationError

    from podium.config.spec import TeacherSpec

    with pytest.raises(ValidationError,
                       match=r"teacher 'math': 1 nodes × 3 GPUs = 3 GPUs is not divisible by TP2 × PP1 × CP1 = 2"):
        TeacherSpec(key="k", name="math", aliases=("math",), model_name=str(tiny_llama_checkpoint),
                    num_nodes=1, gpus_per_node=3, tensor_model_parallel_size=2)
