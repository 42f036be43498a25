"""podium.teacher: one teacher's compute (Megatron-core on Ray) and its HTTP endpoint.

Modules (each imports torch/ray/megatron only inside the functions that need them, so importing
this package, or ``podium.teacher.group``, stays cheap):

- ``group``: ``TeacherWorkerGroup`` — placement, rendezvous, ``get_logprobs``, ``shutdown``;
- ``worker``: the Ray actor (one rank): parallel state, model, forward-only logprobs;
- ``checkpoint_loader``: which checkpoint (HF dir / torch_dist / cached hub id) and this rank's model;
- ``hf``: HF checkpoints: architecture description, safetensors slices, per-family weight maps;
- ``megatron_config``: the TransformerConfig (parallel layout, overrides, MoE routing, vocab padding);
- ``megatron_model``: the layer spec (TE or local + SDPA attention) and the GPTModel;
- ``megatron_patches``: inference speed-ups podium installs into megatron-core (RoPE, SwiGLU);
- ``logprobs``: vocab-parallel logprobs/top-k, NeMo RL alignment, the pipeline stage loop;
- ``torch_dist``: Megatron dist_checkpointing load (resharding) and save;
- ``convert``: ``convert_hf_to_torch_dist`` (temp dir + rename);
- ``cuda_shims``: CPU-only shims for megatron-core;
- ``endpoint``: the Open Inference Protocol server (its wire is ``podium.protocol``; it serves and
  reports, the launcher's lifecycle publishes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TeacherWorkerGroup", "convert_hf_to_torch_dist"]


def __getattr__(name: str) -> Any:
    if name == "TeacherWorkerGroup":
        from podium.teacher.group import TeacherWorkerGroup

        return TeacherWorkerGroup
    if name == "convert_hf_to_torch_dist":
        from podium.teacher.convert import convert_hf_to_torch_dist

        return convert_hf_to_torch_dist
    raise AttributeError(f"module 'podium.teacher' has no attribute {name!r}")
