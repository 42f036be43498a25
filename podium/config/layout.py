"""A teacher's parallel layout: the one list of parallel sizes and the one divisibility rule.

Every part that sizes or splits a teacher reads it from here: the planner (which validates it
against the recipe and names the recipe keys at fault), the launcher (nodes × workers per node),
the worker group (placement, data-parallel sharding) and the Megatron model (the sizes go into
``parallel_state`` and ``TransformerConfig``).

================================  =====  ==================================================
field                             short  rule
================================  =====  ==================================================
``num_nodes``                            ≥ 1
``gpus_per_node``                        ≥ 1 (workers per node: GPUs, or CPU slots)
``tensor_model_parallel_size``    TP     world = nodes × gpus_per_node divisible by TP·PP·CP
``pipeline_model_parallel_size``  PP
``context_parallel_size``         CP
``expert_model_parallel_size``    EP     world / PP divisible by EP·ETP
``expert_tensor_parallel_size``   ETP
================================  =====  ==================================================

DP = world / (TP·PP·CP). ETP defaults to 1, NeMo RL's recipe convention (Megatron's own default,
ETP = TP, would reject the Ultra recipe's EP16 on 16 GPUs). The fewest workers that hold given
sizes (``ParallelLayout.on_fewest_workers``) follow from the rule: PP · lcm(TP·CP, EP·ETP).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, PositiveInt

PARALLEL_SIZES: tuple[str, ...] = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
NODE_SIZES: tuple[str, ...] = ("num_nodes", "gpus_per_node")
SHORT_NAMES: Mapping[str, str] = {
    "tensor_model_parallel_size": "TP",
    "pipeline_model_parallel_size": "PP",
    "context_parallel_size": "CP",
    "expert_model_parallel_size": "EP",
    "expert_tensor_parallel_size": "ETP",
}


class LayoutError(ValueError):
    """A layout whose sizes do not divide; the message shows the arithmetic."""

    def __init__(self, message: str, keys: tuple[str, ...]) -> None:
        super().__init__(message)
        self.keys = keys  # the layout fields the rule involves (for naming recipe keys)


class ParallelLayout(BaseModel):
    """Nodes, workers per node and the five parallel sizes of one teacher (validated on creation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_nodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 8
    tensor_model_parallel_size: PositiveInt = 1
    pipeline_model_parallel_size: PositiveInt = 1
    context_parallel_size: PositiveInt = 1
    expert_model_parallel_size: PositiveInt = 1
    expert_tensor_parallel_size: PositiveInt = 1

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def model_parallel_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.model_parallel_size

    @classmethod
    def on_fewest_workers(cls, sizes: Mapping[str, int]) -> ParallelLayout:
        """One node with the fewest workers ``check`` accepts for these parallel sizes (Megatron
        names; absent ones are 1): world = PP · m where TP·CP and EP·ETP both divide m, so
        m = lcm(TP·CP, EP·ETP) (attention data parallelism fills what the experts need)."""
        tp, pp, cp, ep, etp = (int(sizes.get(key, 1)) for key in PARALLEL_SIZES)
        return cls(num_nodes=1, gpus_per_node=pp * math.lcm(tp * cp, ep * etp), **sizes)

    def parallel_sizes(self) -> dict[str, int]:
        """The five sizes by their Megatron names (what ``parallel_state`` is initialised with)."""
        return {key: int(getattr(self, key)) for key in PARALLEL_SIZES}

    def short(self) -> str:
        """``TP2·PP1·CP1·EP1·ETP1`` (for tables and logs)."""
        return "·".join(f"{SHORT_NAMES[k]}{getattr(self, k)}" for k in PARALLEL_SIZES)

    def check(self, who: str) -> None:
        """Raise :class:`LayoutError` (naming ``who`` and showing the arithmetic) if the sizes do
        not divide the world."""
        world = self.world_size
        tp, pp, cp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size, self.context_parallel_size
        if world % (tp * pp * cp):
            raise LayoutError(
                f"{who}: {self.num_nodes} nodes × {self.gpus_per_node} GPUs = {world} GPUs is not divisible "
                f"by TP{tp} × PP{pp} × CP{cp} = {tp * pp * cp}",
                (*NODE_SIZES, *PARALLEL_SIZES[:3]),
            )
        ep, etp = self.expert_model_parallel_size, self.expert_tensor_parallel_size
        per_stage = world // pp
        if per_stage % (ep * etp):
            raise LayoutError(
                f"{who}: expert parallelism does not fit: {world} GPUs / PP{pp} = {per_stage} per stage "
                f"is not divisible by EP{ep} × ETP{etp} = {ep * etp}",
                ("expert_model_parallel_size", "expert_tensor_parallel_size"),
            )
