"""The Nemotron-H map: HF ``backbone.*`` tensors into megatron-core's hybrid model (local spec, see
:mod:`podium.teacher.model.hybrid_model`), each rank reading only its slices.

This module owns ``nemotron_h_sources``, the ``nemotron_h`` family's map. Layouts (TP rank ``r``
of ``tp``; "the rank's part" of ``n`` rows is ``[r·n/tp, (r+1)·n/tp)``), as Megatron-Bridge's
``nemotron_h_bridge`` maps them:

- Mamba ``in_proj`` ``[z | x | B | C | dt]`` (``d_inner``, ``d_inner``, ``g·n``, ``g·n``, heads rows):
  split over TP **part by part** — the rank's z, x, B, C and dt rows, concatenated in that order
  (Megatron's column-parallel ``in_proj`` splits its output in ``tp`` contiguous pieces, and each
  rank reads its piece as its own ``[z | x | B | C | dt]``). ``conv1d`` weight and bias likewise per
  part over ``[x | B | C]``. ``A_log``, ``D``, ``dt_bias`` (per head) and the gated ``norm`` (per
  channel of ``d_inner``) the rank's part; ``out_proj`` the rank's input columns.
- attention: q/k/v fused per KV group, the rank's rows of it (``SliceReader.qkv``: whole groups, or a
  share of one where there are fewer KV groups than TP), ``o_proj`` the rank's columns; no
  positional embedding.
- the ``-`` layer's MLP (``up_proj``/``down_proj``, squared ReLU, not gated) split over TP.
- MoE: ``gate.weight`` -> ``router.weight`` and ``gate.e_score_correction_bias`` ->
  ``router.expert_bias`` (a buffer, kept fp32), both whole; the latent projections whole (Megatron
  duplicates them on every rank); the routed experts only this EP rank's, each split over expert-TP
  (``SliceReader.routed_expert``; not gated: ``linear_fc1`` the expert-TP rank's part of
  ``up_proj``'s rows, ``linear_fc2`` the same part of ``down_proj``'s columns — the same hidden
  units, or the sum over the expert-TP ranks is wrong); the shared expert over the attention TP
  (Megatron's ``SharedExpertMLP`` uses the TP group, not the expert-TP one).
- each layer's one pre-norm (``backbone.layers.N.norm``) is the Megatron layer's ``norm`` (Mamba),
  ``input_layernorm`` (attention) or ``pre_mlp_layernorm`` (MLP, MoE).
- MTP heads (``mtp.*``) are not part of a teacher: never read (``load_hf_weights`` says so once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podium.teacher.megatron_compat import mamba_conv1d_params
from podium.teacher.model.hf.slices import SliceReader

if TYPE_CHECKING:  # pragma: no cover
    import torch

_NORMS = ("norm.weight", "input_layernorm.weight", "pre_mlp_layernorm.weight")


def _mamba(r: SliceReader, p: str, local: str) -> torch.Tensor | None:
    import torch

    d = r.desc
    inner = d.mamba_num_heads * d.mamba_head_dim
    bc = d.mamba_num_groups * d.mamba_state_dim
    m = p + "mixer."

    def per_part(name: str, sizes: tuple[int, ...], start: int = 0) -> torch.Tensor:
        """The rank's part of each consecutive block of ``sizes`` rows, concatenated."""
        pieces = []
        for size in sizes:
            part = r.part(size)
            pieces.append(r.ckpt.read(name, rows=slice(start + part.start, start + part.stop)))
            start += size
        return torch.cat(pieces)

    if local == "mixer.in_proj.weight":
        return per_part(m + "in_proj.weight", (inner, inner, bc, bc, d.mamba_num_heads))
    conv1d = mamba_conv1d_params()  # mixer.conv1d_weight/_bias from megatron-core 0.19
    if local in conv1d:
        return per_part(m + conv1d[local], (inner, bc, bc))
    if local in ("mixer.A_log", "mixer.D", "mixer.dt_bias"):
        return r.ckpt.read(m + local.split(".", 1)[1], rows=r.part(d.mamba_num_heads))
    if local == "mixer.norm.weight":
        return r.ckpt.read(m + "norm.weight", rows=r.part(inner))
    if local == "mixer.out_proj.weight":
        return r.ckpt.read(m + "out_proj.weight", cols=r.part(inner))
    return None


def _moe(r: SliceReader, p: str, local: str) -> torch.Tensor | None:
    d = r.desc
    m = p + "mixer."
    whole = {"mlp.router.weight": "gate.weight", "mlp.router.expert_bias": "gate.e_score_correction_bias",
             "mlp.fc1_latent_proj.weight": "fc1_latent_proj.weight",
             "mlp.fc2_latent_proj.weight": "fc2_latent_proj.weight"}
    if local in whole:
        return r.ckpt.read(m + whole[local])
    if local == "mlp.shared_experts.linear_fc1.weight":
        return r.ckpt.read(m + "shared_experts.up_proj.weight", rows=r.part(d.moe_shared_ffn_hidden_size))
    if local == "mlp.shared_experts.linear_fc2.weight":
        return r.ckpt.read(m + "shared_experts.down_proj.weight", cols=r.part(d.moe_shared_ffn_hidden_size))
    expert = r.routed_expert(local)
    if expert is None:
        return None
    e = f"{m}experts.{expert.expert}."
    if expert.fc == "linear_fc1":
        return r.ckpt.read(e + "up_proj.weight", rows=expert.hidden)
    return r.ckpt.read(e + "down_proj.weight", cols=expert.hidden)


def nemotron_h_sources(r: SliceReader, layer: int | None, local: str) -> torch.Tensor | None:
    """(reader, global layer or None, local-spec name) -> the rank's tensor (see module doc)."""
    d = r.desc
    if layer is None:
        if local == "embedding.word_embeddings.weight":
            return r.vocab_rows("backbone.embeddings.weight")
        if local == "decoder.final_norm.weight":
            return r.ckpt.read("backbone.norm_f.weight")
        if local == "output_layer.weight":
            return r.vocab_rows("backbone.embeddings.weight" if d.tied_embeddings else "lm_head.weight")
        return None
    p = f"backbone.layers.{layer}."
    if local in _NORMS:
        return r.ckpt.read(p + "norm.weight")
    kind = d.hybrid_pattern[layer]
    if kind == "M":
        return _mamba(r, p, local)
    if kind == "E":
        return _moe(r, p, local)
    if kind == "*":
        if local == "self_attention.linear_qkv.weight":
            names = [p + f"mixer.{x}_proj.weight" for x in "qkv"]
            return r.qkv(lambda part, rows: r.ckpt.read(names[part], rows=rows))
        if local == "self_attention.linear_proj.weight":
            return r.ckpt.read(p + "mixer.o_proj.weight", cols=r.part(d.num_attention_heads * d.head_dim))
        return None
    if local == "mlp.linear_fc1.weight":
        return r.ckpt.read(p + "mixer.up_proj.weight", rows=r.part(d.ffn_hidden_size))
    if local == "mlp.linear_fc2.weight":
        return r.ckpt.read(p + "mixer.down_proj.weight", cols=r.part(d.ffn_hidden_size))
    return None
