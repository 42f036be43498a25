"""The routed-expert layers of the Llama-family MoE models (Qwen3-MoE, Qwen2-MoE, Mixtral, GLM-4.5): HF
tensors into megatron-core's ``MoELayer`` (local spec, ``SequentialMLP``), each rank reading only
its experts and its slices of them.

This module owns ``moe_layer_sources``, which the ``llama`` map (:mod:`.dense`) hands an MoE layer's
``mlp.*`` parameters. Layouts:

- the router ``[E, h]`` whole on every rank, and GLM-4.5's per-expert bias
  (``gate.e_score_correction_bias``, Megatron's fp32 buffer ``router.expert_bias``) whole too;
- routed experts: this EP rank's, each split over expert-TP as a SwiGLU MLP over TP
  (``SliceReader.routed_expert``; fc1 ``cat[gate_r, up_r]``, fc2 the rank's columns); the HF names
  of the router and the expert projections per architecture are ``description.MOE_NAMES``;
- shared expert (Qwen2-MoE ``shared_expert``, Megatron ``SharedExpertMLP``): split over the
  attention TP like a dense SwiGLU MLP; its gate ``[1, h]`` (``shared_expert_gate``) whole on every
  rank. Megatron computes ``sigmoid(x · gateᵀ) · shared(x)`` and adds it to the routed output, as
  transformers' ``Qwen2MoeSparseMoeBlock`` does. GLM-4.5's ``shared_experts`` (``n_shared_experts``
  experts as one MLP) the same, without a gate. The HF block name per architecture is
  ``description.SHARED_EXPERT_NAMES``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podium.teacher.model.hf.description import MOE_NAMES, SHARED_EXPERT_NAMES
from podium.teacher.model.hf.slices import SliceReader

if TYPE_CHECKING:  # pragma: no cover
    import torch

_SHARED = "mlp.shared_experts."


def moe_layer_sources(r: SliceReader, layer: int, local: str) -> torch.Tensor | None:
    """An MoE layer's ``mlp.*`` parameter (router, this rank's experts, shared expert) -> its tensor."""
    block, router, (gate, up, down) = MOE_NAMES[r.desc.architecture]
    p = f"model.layers.{layer}.{block}"
    if local == "mlp.router.weight":
        return r.ckpt.read(p + f"{router}.weight")
    if local == "mlp.router.expert_bias":
        return r.ckpt.read(p + f"{router}.e_score_correction_bias")
    if local.startswith(_SHARED):
        return _shared_expert_sources(r, p, local[len(_SHARED):])
    expert = r.routed_expert(local)
    if expert is None:
        return None
    e = f"{p}experts.{expert.expert}."
    if expert.fc == "linear_fc1":
        return r.gated(e + f"{gate}.weight", e + f"{up}.weight", expert.hidden)
    return r.ckpt.read(e + f"{down}.weight", cols=expert.hidden)


def _shared_expert_sources(r: SliceReader, p: str, local: str) -> torch.Tensor | None:
    """The shared expert (Qwen2-MoE's ``shared_expert``, GLM-4.5's ``shared_experts``: split over the
    attention TP as a dense SwiGLU MLP) and Qwen2-MoE's ``shared_expert_gate`` ``[1, h]`` (whole)."""
    if local == "gate_weight":
        return r.ckpt.read(p + "shared_expert_gate.weight")
    ffn = r.part(r.desc.moe_shared_ffn_hidden_size)
    s = p + SHARED_EXPERT_NAMES[r.desc.architecture] + "."
    if local == "linear_fc1.weight":
        return r.gated(s + "gate_proj.weight", s + "up_proj.weight", ffn)
    if local == "linear_fc2.weight":
        return r.ckpt.read(s + "down_proj.weight", cols=ffn)
    return None
