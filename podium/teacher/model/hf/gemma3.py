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
- the output layer is tied to the embedding (``tie_word_embeddings``, Gemma's default);
- a multimodal checkpoint (``Gemma3ForConditionalGeneration``) holds the language model under
  ``language_model.`` (``language_model.model.layers.N…``, ``language_model.lm_head``): the same
  names read under that prefix (:class:`LanguageModelView`); the vision tower is not read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


LANGUAGE_MODEL = "language_model."


class LanguageModelView:
    """A checkpoint's tensors as the text model names them, read under ``language_model.``."""

    def __init__(self, ckpt: Any) -> None:
        self.ckpt = ckpt
        self.path = ckpt.path

    def __contains__(self, name: str) -> bool:
        return LANGUAGE_MODEL + name in self.ckpt

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.ckpt.shape(LANGUAGE_MODEL + name))

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        return self.ckpt.read(LANGUAGE_MODEL + name, rows=rows, cols=cols)


def _text_reader(r: SliceReader) -> SliceReader:
    """``r``, or for a multimodal checkpoint a reader of its language model's names."""
    if "model.embed_tokens.weight" in r.ckpt or LANGUAGE_MODEL + "model.embed_tokens.weight" not in r.ckpt:
        return r
    return SliceReader(LanguageModelView(r.ckpt), r.desc, r.lay)  # type: ignore[arg-type]


def _one_plus(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    return 1.0 + tensor.to(torch.float32)


def gemma3_sources(r: SliceReader, layer: int | None, local: str) -> torch.Tensor | None:
    """(reader, global layer or None, local-spec name) -> the rank's tensor (see the module doc)."""
    r = _text_reader(r)
    if layer is None:
        if local == "decoder.final_layernorm.weight":
            return _one_plus(r.ckpt.read("model.norm.weight"))
        return llama_sources(r, layer, local)
    if local in _LAYER_NORMS:
        return _one_plus(r.ckpt.read(f"model.layers.{layer}.{_LAYER_NORMS[local]}"))
    return llama_sources(r, layer, local)
