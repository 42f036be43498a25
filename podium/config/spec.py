"""The planned teacher: one frozen record per unique teacher checkpoint.

A ``TeacherSpec`` is what the planner produces and what every later part consumes (the launcher
sizes its allocation from it, the worker group builds its model from it, the rendezvous names it by
its ``key``). It imports nothing heavy, so login-node commands can use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class TeacherSpec:
    key: str  # stable content hash (12 hex chars) of what makes this teacher distinct
    name: str  # readable name: the teacher's first alias
    aliases: tuple[str, ...]  # every agent alias served by this teacher, in recipe order
    model_name: str  # normalised local checkpoint path, or an HF hub id left as written
    num_nodes: int
    gpus_per_node: int  # workers per node: GPUs, or CPU slots on a CPU-only cluster
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1
    precision: str = "bf16"
    micro_batch_size: int = 1
    megatron_cfg_overrides: Mapping[str, Any] = field(default_factory=dict)
    # Effective launcher settings for this teacher (the `podium:` section with the teacher's own
    # overrides merged in), as plain data: {"cluster", "slurm", "ray", "server", ...}.
    launcher: Mapping[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def model_parallel_size(self) -> int:
        return (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.context_parallel_size
        )

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.model_parallel_size

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the `plan --json` row and the run directory's record)."""
        return {
            "key": self.key,
            "name": self.name,
            "aliases": list(self.aliases),
            "model_name": self.model_name,
            "num_nodes": self.num_nodes,
            "gpus_per_node": self.gpus_per_node,
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "context_parallel_size": self.context_parallel_size,
            "expert_model_parallel_size": self.expert_model_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "precision": self.precision,
            "micro_batch_size": self.micro_batch_size,
            "megatron_cfg_overrides": dict(self.megatron_cfg_overrides),
            "launcher": _plain(self.launcher),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TeacherSpec":
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["aliases"] = tuple(fields.get("aliases", ()))
        return cls(**fields)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
