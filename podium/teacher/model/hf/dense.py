"""The transformer maps: HF tensors of the Llama family and of GPT-2 into megatron-core's GPTModel
(local-spec names), each rank reading only its slices (:mod:`.slices` holds the layouts).

This module owns ``llama_sources`` (Llama, Mistral, Qwen2/Qwen3 and the attention and dense layers
of the Llama-family MoE models, whose ``mlp.*`` on an MoE layer :mod:`.moe` maps) and
``gpt2_sources``. Beyond the shared layouts:

- Llama: q/k/v fused per KV group (``SliceReader.qkv``), ``o_proj`` the rank's columns; SwiGLU
  ``gate_proj``/``up_proj`` as ``linear_fc1`` (``SliceReader.gated``), ``down_proj`` the rank's
  columns; Qwen's q/k norms whole. A bias the HF model lacks (Megatron has one because of
  ``add_bias_linear``) is an empty tensor: the loader zeroes it.
- GPT-2's Conv1D weights are ``[in, out]``: sliced on the other axis and transposed; its fused
  ``c_attn`` holds q | k | v side by side (one group per head).
- tied output layer (``tie_word_embeddings``): the last PP stage's ``output_layer.weight`` comes
  from the embedding tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podium.teacher.model.hf.moe import moe_layer_sources
from podium.teacher.model.hf.slices import SliceReader

if TYPE_CHECKING:  # pragma: no cover
    import torch


def llama_sources(r: SliceReader, layer: int | None, local: str) -> torch.Tensor | None:
    """(reader, global layer or None, local-spec name) -> the rank's tensor (see the module doc)."""
    d = r.desc
    if layer is None:
        return _llama_outside_layers(r, local)
    if d.is_moe and d.moe_layers[layer] and local.startswith("mlp."):
        return moe_layer_sources(r, layer, local)
    p = f"model.layers.{layer}."
    if local == "input_layernorm.weight":
        return r.ckpt.read(p + "input_layernorm.weight")
    if local == "pre_mlp_layernorm.weight":
        return r.ckpt.read(p + "post_attention_layernorm.weight")
    if local.startswith("self_attention."):
        return _llama_attention(r, p, local[len("self_attention."):])
    if local.startswith("mlp."):
        return _llama_mlp(r, p, local[len("mlp."):])
    return None


def _llama_outside_layers(r: SliceReader, local: str) -> torch.Tensor | None:
    """The embedding, the final norm and the output layer."""
    d = r.desc
    if local == "embedding.word_embeddings.weight":
        return r.vocab_rows("model.embed_tokens.weight")
    if local == "decoder.final_layernorm.weight":
        return r.ckpt.read("model.norm.weight")
    if local == "output_layer.weight":
        name = "model.embed_tokens.weight" if d.tied_embeddings else "lm_head.weight"
        if not d.tied_embeddings and name not in r.ckpt and "model.embed_tokens.weight" in r.ckpt:
            raise ValueError(f"checkpoint {r.ckpt.path}: tensor 'lm_head.weight' is missing")
        return r.vocab_rows(name)
    return None


def _llama_attention(r: SliceReader, p: str, local: str) -> torch.Tensor | None:
    import torch

    d = r.desc
    if local in ("linear_qkv.weight", "linear_qkv.bias"):
        kind = local.rsplit(".", 1)[1]
        if kind == "bias" and not d.qkv_bias:
            return torch.zeros(0)  # sentinel: bias exists only because of add_bias_linear
        names = [p + f"self_attn.{x}_proj.{kind}" for x in "qkv"]
        return r.qkv(lambda part, rows: r.ckpt.read(names[part], rows=rows))
    if local == "q_layernorm.weight":
        return r.ckpt.read(p + "self_attn.q_norm.weight")
    if local == "k_layernorm.weight":
        return r.ckpt.read(p + "self_attn.k_norm.weight")
    if local == "linear_proj.weight":
        return r.ckpt.read(p + "self_attn.o_proj.weight", cols=r.part(d.num_attention_heads * d.head_dim))
    if local == "linear_proj.bias":
        return r.ckpt.read(p + "self_attn.o_proj.bias") if d.attn_out_bias else torch.zeros(0)
    return None


def _llama_mlp(r: SliceReader, p: str, local: str) -> torch.Tensor | None:
    import torch

    d = r.desc
    ffn = r.part(d.ffn_hidden_size)
    if local == "linear_fc1.weight":
        return r.gated(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", ffn)
    if local == "linear_fc1.bias":
        return r.gated(p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias", ffn) if d.mlp_bias else torch.zeros(0)
    if local == "linear_fc2.weight":
        return r.ckpt.read(p + "mlp.down_proj.weight", cols=ffn)
    if local == "linear_fc2.bias":
        return r.ckpt.read(p + "mlp.down_proj.bias") if d.mlp_bias else torch.zeros(0)
    return None


def gpt2_sources(r: SliceReader, layer: int | None, local: str) -> torch.Tensor | None:
    """(reader, global layer or None, local-spec name) -> the rank's tensor (see the module doc)."""
    t = "transformer." if "transformer.wte.weight" in r.ckpt else ""  # GPT2LMHeadModel's prefix or none
    if layer is None:
        if local in ("embedding.word_embeddings.weight", "output_layer.weight"):
            return r.vocab_rows(t + "wte.weight")
        if local == "embedding.position_embeddings.weight":
            return r.ckpt.read(t + "wpe.weight")
        if local.startswith("decoder.final_layernorm."):
            return r.ckpt.read(t + "ln_f." + local.rsplit(".", 1)[1])
        return None
    p = f"{t}h.{layer}."
    kind = local.rsplit(".", 1)[1]
    if local.startswith("input_layernorm."):
        return r.ckpt.read(p + "ln_1." + kind)
    if local.startswith("pre_mlp_layernorm."):
        return r.ckpt.read(p + "ln_2." + kind)
    if local in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        return _gpt2_qkv(r, p + f"attn.c_attn.{kind}", kind)
    h, ffn = r.desc.hidden_size, r.part(r.desc.ffn_hidden_size)
    if local == "self_attention.linear_proj.weight":
        return r.ckpt.read(p + "attn.c_proj.weight", rows=r.part(h)).t()
    if local == "self_attention.linear_proj.bias":
        return r.ckpt.read(p + "attn.c_proj.bias")
    if local == "mlp.linear_fc1.weight":
        return r.ckpt.read(p + "mlp.c_fc.weight", cols=ffn).t()
    if local == "mlp.linear_fc1.bias":
        return r.ckpt.read(p + "mlp.c_fc.bias", rows=ffn)
    if local == "mlp.linear_fc2.weight":
        return r.ckpt.read(p + "mlp.c_proj.weight", rows=ffn).t()
    if local == "mlp.linear_fc2.bias":
        return r.ckpt.read(p + "mlp.c_proj.bias")
    return None


def _gpt2_qkv(r: SliceReader, name: str, kind: str) -> torch.Tensor:
    """GPT-2's fused ``c_attn`` (one group per head, q | k | v side by side) as Megatron's ``linear_qkv``."""
    h = r.desc.hidden_size

    def read(part: int, rows: slice) -> torch.Tensor:
        where = slice(part * h + rows.start, part * h + rows.stop)
        # Conv1D [in, 3h]: take the rank's columns, then transpose to [out, in]
        return r.ckpt.read(name, cols=where).t() if kind == "weight" else r.ckpt.read(name, rows=where)

    return r.qkv(read)
