"""The rules defined once and imported everywhere: the parallel layout and precision (batch
validation: ``tests/protocol/test_batch.py``; ports: ``tests/test_net.py``)."""

from __future__ import annotations

import pytest
import torch

from podium.config.layout import PARALLEL_SIZES, LayoutError, ParallelLayout
from podium.config.precision import from_hf_config, normalise_precision, torch_dtype


def test_layout_shows_the_arithmetic() -> None:
    layout = ParallelLayout(num_nodes=2, gpus_per_node=8, tensor_model_parallel_size=4,
                            expert_model_parallel_size=4)
    assert (layout.world_size, layout.data_parallel_size, layout.short()) == (16, 4, "TP4·PP1·CP1·EP4·ETP1")
    layout.check("teacher 'x'")
    with pytest.raises(LayoutError, match=r"teacher 'x': 1 nodes × 6 GPUs = 6 GPUs is not divisible by TP4"):
        ParallelLayout(gpus_per_node=6, tensor_model_parallel_size=4).check("teacher 'x'")
    with pytest.raises(LayoutError, match=r"16 GPUs / PP2 = 8 per stage is not divisible by EP16 × ETP1 = 16"):
        ParallelLayout(num_nodes=2, pipeline_model_parallel_size=2, expert_model_parallel_size=16).check("teacher 'x'")


@pytest.mark.parametrize(("tp", "pp", "cp", "ep", "etp"), [
    (1, 1, 1, 1, 1), (2, 1, 1, 1, 1), (1, 1, 1, 2, 1), (2, 2, 1, 4, 1), (4, 1, 1, 2, 3), (2, 3, 2, 3, 2),
])
def test_fewest_workers_is_the_least_world_the_rule_accepts(tp: int, pp: int, cp: int, ep: int, etp: int) -> None:
    sizes = dict(zip(PARALLEL_SIZES, (tp, pp, cp, ep, etp), strict=True))
    layout = ParallelLayout.on_fewest_workers(sizes)
    assert layout.num_nodes == 1 and layout.parallel_sizes() == sizes
    layout.check("convert")
    for world in range(1, layout.world_size):
        with pytest.raises(LayoutError):
            ParallelLayout(gpus_per_node=world, **sizes).check("convert")


def test_precision_spellings() -> None:
    assert [normalise_precision(p) for p in ("bf16", "bfloat16", "torch.float32", "32", "half")] == [
        "bf16", "bf16", "fp32", "fp32", "fp16"]
    assert torch_dtype("bfloat16") is torch.bfloat16
    assert from_hf_config({"torch_dtype": "float32"}) == "fp32" and from_hf_config({}) == "bf16"
    with pytest.raises(ValueError, match="must be one of bf16, fp16, fp32, got 'fp8'"):
        normalise_precision("fp8")
