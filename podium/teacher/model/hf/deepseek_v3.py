"""The DeepSeek-V3 / Kimi K2 map: HF multi-latent attention into megatron-core's ``MLASelfAttention``
(local spec names), each rank reading only its slices; every other name is the Llama family's
(:func:`.dense.llama_sources`: norms, the dense first layers' MLPs, and the MoE layers of
:mod:`.moe`: router with its ``e_score_correction_bias``, routed experts, ``shared_experts``).

Layouts (TP rank ``r``; heads are contiguous rows, so a rank's heads are "its part"):

- ``linear_q_down_proj`` (``q_a_proj``, ``[q_lora_rank, h]``) and ``linear_kv_down_proj``
  (``kv_a_proj_with_mqa``, ``[kv_lora_rank + qk_rope_head_dim, h]``): column-parallel in the local
  spec, the rank's part of the rows (megatron gathers the latent);
- ``linear_q_up_proj`` (``q_b_proj``) or, without a query latent, ``linear_q_proj`` (``q_proj``):
  the rank's heads, ``[nope | rope]`` rows per head; ``linear_kv_up_proj`` (``kv_b_proj``): the rank's
  heads, ``[k_nope | v]`` per head; ``linear_proj`` (``o_proj``): the rank's heads' columns;
- ``q_layernorm`` / ``kv_layernorm``: ``q_a_layernorm`` / ``kv_a_layernorm``, whole.

megatron-core's MLA reads the rotary dimensions as interleaved pairs (DeepSeek's layout,
``rope_interleave`` true). A checkpoint with ``rope_interleave: false`` stores them as two halves:
its rotary rows are interleaved here (``[a0, b0, a1, b1, …]`` from ``[a…, b…]``), which gives the
same dot products.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podium.teacher.model.hf.dense import llama_sources
from podium.teacher.model.hf.slices import SliceReader

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from podium.teacher.model.hf.description import ModelDescription


def deepseek_v3_sources(r: SliceReader, layer: int | None, local: str) -> torch.Tensor | None:
    """(reader, global layer or None, local-spec name) -> the rank's tensor (see the module doc)."""
    if layer is None or not local.startswith("self_attention."):
        return llama_sources(r, layer, local)
    d = r.desc
    p = f"model.layers.{layer}.self_attn."
    local = local[len("self_attention."):]
    heads = r.part(d.num_attention_heads)
    q_head = d.qk_nope_head_dim + d.qk_rope_head_dim
    if local == "linear_q_down_proj.weight":
        return r.ckpt.read(p + "q_a_proj.weight", rows=r.part(d.q_lora_rank))
    if local == "q_layernorm.weight":
        return r.ckpt.read(p + "q_a_layernorm.weight")
    if local in ("linear_q_up_proj.weight", "linear_q_proj.weight"):
        name = "q_b_proj" if local == "linear_q_up_proj.weight" else "q_proj"
        rows = slice(heads.start * q_head, heads.stop * q_head)
        return _rope_rows(r.ckpt.read(p + name + ".weight", rows=rows), q_head, d.qk_nope_head_dim, d)
    if local == "linear_kv_down_proj.weight":
        # the rotary key's rows are the last qk_rope_head_dim: interleave them before the rank's part
        whole = _rope_rows(r.ckpt.read(p + "kv_a_proj_with_mqa.weight"), d.kv_lora_rank + d.qk_rope_head_dim,
                           d.kv_lora_rank, d)
        return whole[r.part(d.kv_lora_rank + d.qk_rope_head_dim)]
    if local == "kv_layernorm.weight":
        return r.ckpt.read(p + "kv_a_layernorm.weight")
    if local == "linear_kv_up_proj.weight":
        per = d.qk_nope_head_dim + d.v_head_dim
        return r.ckpt.read(p + "kv_b_proj.weight", rows=slice(heads.start * per, heads.stop * per))
    if local == "linear_proj.weight":
        return r.ckpt.read(p + "o_proj.weight", cols=slice(heads.start * d.v_head_dim, heads.stop * d.v_head_dim))
    return None


def _rope_rows(weight: torch.Tensor, block: int, start: int, d: ModelDescription) -> torch.Tensor:
    """``weight``'s rows in blocks of ``block``, each block's rows from ``start`` on rotary: as they
    are for an interleaved checkpoint, else each rotary half-pair interleaved (see the module doc)."""
    if d.rope_interleave:
        return weight
    rope = block - start
    blocks = weight.reshape(-1, block, *weight.shape[1:]).clone()
    halves = blocks[:, start:].reshape(blocks.shape[0], 2, rope // 2, *weight.shape[1:])
    blocks[:, start:] = halves.transpose(1, 2).reshape(blocks.shape[0], rope, *weight.shape[1:])
    return blocks.reshape(weight.shape)
