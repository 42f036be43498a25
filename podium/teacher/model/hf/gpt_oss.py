"""gpt-oss (``GptOssForCausalLM``): its description and its map, HF tensors into megatron-core's
GPTModel (local-spec names, every layer MoE with ``SequentialMLP`` experts), each rank reading only
its slices.

This module owns ``describe_gpt_oss`` (the ``gpt_oss`` describer of :mod:`.description`) and
``gpt_oss_sources``. The description: attention with q/k/v and o_proj biases and a learnt sink per
head (megatron's ``softmax_type="learnable"``), sliding-window layers by ``layer_types`` (default:
every other layer, the first sliding), YaRN RoPE (``rope_parameters``, or 4.x's ``rope_scaling``;
YaRN's fields go on the TransformerConfig: ``megatron_config.set_yarn``); every layer MoE, a router
with a bias (top-k of the logits, softmax over the k) and experts with biases and transformers'
clamped SwiGLU ``(clamp(up, ±l) + 1) · g·σ(1.702·g)``, ``g = clamp(gate, max=l)``, ``l`` the
config's ``swiglu_limit`` (megatron: ``quick_gelu`` with ``glu_linear_offset`` 1 and
``activation_func_clamp_value`` l). What megatron-core cannot express is refused at plan
(:func:`podium.config.architecture.field_problems`).

The map: attention, norms, embedding and output layer are named as in
the Llama family (:mod:`.dense` reads them: q/k/v fused per KV group with their biases, ``o_proj``
the rank's columns and its whole bias); what differs:

- ``self_attn.sinks`` ``[heads]``: the core attention's ``softmax_offset``, the rank's heads;
- ``mlp.router.weight`` ``[E, h]`` and ``mlp.router.bias`` ``[E]``, whole on every rank;
- the experts fused per layer: ``mlp.experts.gate_up_proj`` ``[E, h, 2·ffn]`` (gate and up
  *interleaved* along the last dimension: gate unit ``j`` is column ``2j``, up unit ``j`` column
  ``2j + 1``), ``gate_up_proj_bias`` ``[E, 2·ffn]`` likewise, ``down_proj`` ``[E, ffn, h]``,
  ``down_proj_bias`` ``[E, h]``. Local expert ``i`` of EP rank ``e`` is expert ``e·E/EP + i``; its
  expert-TP part of the hidden units ``[a, b)`` is columns ``[2a, 2b)`` of ``gate_up_proj`` (fc1
  ``cat[gate, up]`` transposed) and rows ``[a, b)`` of ``down_proj`` (fc2, transposed); fc2's bias
  is whole (megatron adds it once, after the reduction);
- MXFP4 experts (``quantization_config.quant_method`` ``mxfp4``): ``gate_up_proj_blocks`` /
  ``_scales`` and ``down_proj_blocks`` / ``_scales`` in place of the two weights, rows being output
  units (:mod:`.mxfp4`). The rank reads its expert's rows (fc1: the ``[2a, 2b)`` rows; fc2: the
  expert's blocks, its columns cut after dequantizing) and dequantizes them alone: no tensor
  larger than one expert's projection is ever dequantized.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from podium.config.architecture import GEMMA3_LAYER_TYPES, field_problems
from podium.config.quantization import quant_method
from podium.config.rope import gpt_oss_rope
from podium.teacher.model.hf.dense import llama_sources
from podium.teacher.model.hf.description import ModelDescription, decoder_fields, expert_count
from podium.teacher.model.hf.mxfp4 import dequantize_mxfp4
from podium.teacher.model.hf.slices import SliceReader

if TYPE_CHECKING:  # pragma: no cover
    import torch

_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def describe_gpt_oss(config: Mapping[str, Any], arch: str, family: str, checkpoint: str) -> ModelDescription:
    """gpt-oss's :class:`ModelDescription` (see the module doc of :mod:`.description`)."""
    problems = field_problems(config)  # the plan's rule
    if problems:
        raise ValueError(f"checkpoint {checkpoint}: {arch} with {'; '.join(problems)}")
    layers = int(config["num_hidden_layers"])
    experts, topk = expert_count(config, arch, checkpoint, ("num_local_experts", "num_experts"),
                                 ("num_experts_per_tok", "experts_per_token"))
    kinds = list(config.get("layer_types") or
                 [GEMMA3_LAYER_TYPES[0] if (i + 1) % 2 else GEMMA3_LAYER_TYPES[1] for i in range(layers)])
    if len(kinds) != layers:
        raise ValueError(f"checkpoint {checkpoint}: {arch} with {len(kinds)} layer_types for {layers} layers")
    sliding = tuple(kind == GEMMA3_LAYER_TYPES[0] for kind in kinds)
    window = config.get("sliding_window", 128)
    rope = gpt_oss_rope(config)
    yarn = rope["rope_type"] == "yarn"
    scaling: dict[str, Any] | None = None
    if yarn:
        scaling = {"rope_type": "yarn", "truncate": bool(rope.get("truncate", True)),
                   **{k: rope[k] for k in _YARN_KEYS if rope.get(k) is not None}}
        if "factor" not in scaling:  # transformers: max_position_embeddings / original_max_position_embeddings
            original = int(scaling["original_max_position_embeddings"])
            scaling["factor"] = int(config.get("max_position_embeddings", 131072)) / original
    return ModelDescription(
        architecture=arch,
        family=family,
        **decoder_fields(config, max_positions=131072, eps=1e-5),
        activation="quick_geglu",
        position_embedding_type="yarn" if yarn else "rope",
        rotary_base=float(rope["rope_theta"]),
        rope_scaling=scaling,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,  # the experts' and the router's biases (megatron: add_bias_linear)
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window and any(sliding) else None,
        window_layers=sliding if window and any(sliding) else (),
        attention_sinks=True,
        glu_linear_offset=1.0,
        activation_clamp=float(config.get("swiglu_limit", 7.0)),
        expert_quantization=quant_method(config),
        num_experts=experts,
        moe_topk=topk,
        moe_ffn_hidden_size=int(config["intermediate_size"]),
        norm_topk_prob=True,  # top-k of the router's logits, softmax over those k
        moe_layers=(True,) * layers,
        hf_config=dict(config),
    )


SINKS = "self_attention.core_attention.softmax_offset"
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.(weight|bias)$")


def gpt_oss_sources(r: SliceReader, layer: int | None, local: str) -> torch.Tensor | None:
    """(reader, global layer or None, local-spec name) -> the rank's tensor (see the module doc)."""
    if layer is None or not (local.startswith("mlp.") or local == SINKS):
        return llama_sources(r, layer, local)
    p = f"model.layers.{layer}."
    if local == SINKS:
        return r.ckpt.read(p + "self_attn.sinks", rows=r.part(r.desc.num_attention_heads))
    if local in ("mlp.router.weight", "mlp.router.bias"):
        return r.ckpt.read(p + local)
    match = _EXPERT.match(local)
    if match is None:
        return None
    d, lay = r.desc, r.lay
    expert = lay.ep_rank * (d.num_experts // lay.ep_size) + int(match.group(1))
    size = d.moe_ffn_hidden_size // lay.etp_size
    a, b = lay.etp_rank * size, (lay.etp_rank + 1) * size
    fc, kind = match.group(2), match.group(3)
    e = p + "mlp.experts."
    if fc == "linear_fc1":
        if kind == "bias":
            fused = r.ckpt.read_at(e + "gate_up_proj_bias", expert, slice(2 * a, 2 * b))
        elif d.expert_quantization == "mxfp4":  # rows: interleaved gate/up units
            fused = _mxfp4_rows(r, e + "gate_up_proj", expert, slice(2 * a, 2 * b))
        else:  # [h, 2·ffn] columns -> units as rows
            fused = r.ckpt.read_at(e + "gate_up_proj", expert, slice(None), slice(2 * a, 2 * b)).t()
        return _deinterleave(fused)
    if kind == "bias":
        return r.ckpt.read_at(e + "down_proj_bias", expert)
    if d.expert_quantization == "mxfp4":  # rows: hidden; columns: the expert's ffn units
        return _mxfp4_rows(r, e + "down_proj", expert, slice(None))[:, a:b].contiguous()
    return r.ckpt.read_at(e + "down_proj", expert, slice(a, b)).t().contiguous()


def _deinterleave(fused: torch.Tensor) -> torch.Tensor:
    """Gate/up units interleaved along the first dimension -> megatron's ``cat[gate, up]``."""
    import torch

    return torch.cat([fused[0::2], fused[1::2]]).contiguous()


def _mxfp4_rows(r: SliceReader, name: str, expert: int, rows: slice) -> torch.Tensor:
    """Rows ``rows`` of expert ``expert``'s MXFP4 tensor ``name`` (``name_blocks`` and
    ``name_scales``), dequantized to float32 ``[rows, columns]``."""
    blocks = r.ckpt.read_at(name + "_blocks", expert, rows)
    scales = r.ckpt.read_at(name + "_scales", expert, rows)
    return dequantize_mxfp4(blocks, scales)
