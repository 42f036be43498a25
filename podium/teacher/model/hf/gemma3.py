"""The Gemma 3 map: HF tensors of ``Gemma3ForCausalLM`` into megatron-core's GPTModel (local-spec
names, with the post-norms of :mod:`podium.teacher.model.gemma3`), each rank reading only its slices.

This module owns ``gemma3_sources``. Gemma 3 names its attention and MLP as the Llama family does
(:mod:`.dense` reads them: q/k/v fused per KV group, ``o_proj`` the rank's columns, gate/up as a
gated ``linear_fc1``); what differs:

- every norm is Gemma's ``(1 + w)`` RMSNorm storing ``w``: Megatron's RMSNorm multiplies by its
  weight, so the map loads ``1 + w`` (computed in fp32, as transformers computes ``1.0 + w.float()``);
- the four norms of a layer: ``input_layernorm`` (before the attention), ``post_attention_layernorm``
  (after it: ``self_attention.linear_proj.post_norm``), ``pre_feedforward_layernorm`` (Megatron's
  ``pre_mlp_layernorm``), ``post_feedforward_layernorm`` (``mlp.linear_fc2.post_norm``); q/k norms
  ``self_attn.{q,k}_norm``, the final norm ``model.norm``;
- the output layer is tied to the embedding (``tie_word_embeddings``, Gemma's default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podium.teacher.model.gemma3 import POST_NORM
from podium.teacher.model.hf.dense import llama_sources
from podium.teacher.model.hf.slices import SliceReader

if TYPE_CHECKING:  # pragma: no cover
    import torch

# local-spec name in a layer -> Gemma's norm under ``model.layers.N.``
_LAYER_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    f"self_attention.linear_proj.{POST_NORM}.weight": "post_attention_layernorm.weight",
    "pre_mlp_layernorm.weight": "pre_feedforward_layernorm.weight",
    f"mlp.linear_fc2.{POST_NORM}.weight": "post_feedforward_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}


def _one_plus(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    return 1.0 + tensor.to(torch.float32)


def gemma3_sources(r: SliceReader, layer: int | None, local: str) -> torch.Tensor | None:
    """(reader, global layer or None, local-spec name) -> the rank's tensor (see the module doc)."""
    if layer is None:
        if local == "decoder.final_layernorm.weight":
            return _one_plus(r.ckpt.read("model.norm.weight"))
        return llama_sources(r, layer, local)
    if local in _LAYER_NORMS:
        return _one_plus(r.ckpt.read(f"model.layers.{layer}.{_LAYER_NORMS[local]}"))
    return llama_sources(r, layer, local)
