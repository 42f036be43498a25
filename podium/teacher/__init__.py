"""podium.teacher: one teacher, in four layers, each a package that imports only those below it.

- :mod:`~podium.teacher.endpoint` (serving): the HTTP endpoint on the head node, its admission,
  the batching of every caller's requests into batches for the group, its metrics. It knows a group only by
  :mod:`podium.teacher.seam` and never imports model building;
- :mod:`~podium.teacher.compute`: the worker group on Ray (placement, rendezvous, micro-batches,
  data-parallel shards) and each rank's worker, its logprob head and pipeline stage loop;
- :mod:`~podium.teacher.model` (model building): checkpoints (HF, torch_dist, conversion), the
  TransformerConfig, megatron-core's GPT and hybrid models; never imports serving or compute;
- :mod:`~podium.teacher.cpu`: named stand-ins for CUDA-only kernels, applied on a CPU-only
  machine; imports none of the above.

Beneath them: :mod:`~podium.teacher.seam` (what serving knows of a group) and
:mod:`~podium.teacher.megatron_compat` (the one adapter over megatron-core's releases, which model
building and the CPU stand-ins both need).

tests/test_structure.py checks these directions. Every module opens with what it owns; torch, ray
and megatron are imported only inside the functions that need them, so importing this package or
``podium.teacher.compute.group`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TeacherWorkerGroup", "convert_hf_to_torch_dist"]


def __getattr__(name: str) -> Any:
    if name == "TeacherWorkerGroup":
        from podium.teacher.compute.group import TeacherWorkerGroup

        return TeacherWorkerGroup
    if name == "convert_hf_to_torch_dist":
        from podium.teacher.model.convert import convert_hf_to_torch_dist

        return convert_hf_to_torch_dist
    raise AttributeError(f"module 'podium.teacher' has no attribute {name!r}")
