"""HF tensors into a Megatron-core GPTModel, each rank reading only its slices.

This module owns ``load_hf_weights``: for every parameter the rank's model holds, the HF tensor(s)
it comes from and the rank's slice of them (one name/layout map per family, ``_MAPS``), copied into
the parameter. No rank reads a full tensor it only holds part of, nothing is written next to the
checkpoint.

Layouts (Megatron side, TP rank ``r`` of ``tp``):

- ``linear_qkv``: per query group ``[q_0 … q_{n/g-1}, k, v]`` × ``head_dim`` rows, the rank's groups
  ``[r·g/tp, (r+1)·g/tp)``; HF's separate q/k/v (Llama family) or GPT-2's fused Conv1D columns.
  With fewer KV groups than TP (``tp`` a multiple of ``g``) the rank holds, as Megatron's
  column-parallel ``linear_qkv`` does, rows ``[r·R/tp, (r+1)·R/tp)`` of the whole fused matrix (``R``
  rows): a ``g/tp`` share of one group, cut across its q/k/v parts (Megatron all-gathers the fused
  output and each rank keeps group ``r // (tp/g)``, then its own query heads of it).
- ``linear_fc1`` (SwiGLU): ``cat[gate_r, up_r]`` — the gate and up halves are each split across ranks
  (partition stride 2).
- row-parallel ``linear_proj``/``linear_fc2``: the rank's input columns; biases whole.
- vocabulary (embedding, output layer): rows ``[r·Vp/tp, (r+1)·Vp/tp)`` of the padded vocabulary;
  rows at or past the real vocabulary are zeros (their logits are masked at the head).
- routed experts (local spec, ``SequentialMLP``): the router ``[E, h]`` whole on every rank;
  EP rank ``e`` holds experts ``[e·E/EP, (e+1)·E/EP)``, each split over expert-TP as a dense
  SwiGLU MLP over TP (fc1 ``cat[gate_r, up_r]``, fc2 the rank's columns).
- shared expert (Qwen2-MoE ``shared_expert``, Megatron ``SharedExpertMLP``): split over the
  attention TP like a dense SwiGLU MLP; its gate ``[1, h]`` (``shared_expert_gate``) whole on every
  rank. Megatron computes ``sigmoid(x · gateᵀ) · shared(x)`` and adds it to the routed output, as
  transformers' ``Qwen2MoeSparseMoeBlock`` does.
- GPT-2's Conv1D weights are ``[in, out]``: sliced on the other axis and transposed.
- tied output layer (``tie_word_embeddings``): the last PP stage's ``output_layer.weight`` comes
  from the embedding tensor.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from podium.teacher.model.hf.description import MOE_NAMES, ModelDescription
from podium.teacher.model.hf.nemotron_h import nemotron_h_sources
from podium.teacher.model.hf.safetensors_io import SafetensorsCheckpoint

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

# TransformerEngine spec names -> local spec names (the maps below speak local-spec names).
_TE_TO_LOCAL = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
    "mixer.in_proj.layer_norm_weight": "norm.weight",  # a Mamba layer's pre-norm (hybrid TE spec)
}

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class RankLayout:
    """What a rank holds: its TP coordinates, the padded vocabulary and, for routed experts, its
    expert-parallel rank (which experts) and expert-TP rank (which slice of each)."""

    tp_rank: int
    tp_size: int
    padded_vocab_size: int
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1


class _Reader:
    """Slice arithmetic shared by the family maps."""

    def __init__(self, ckpt: SafetensorsCheckpoint, desc: ModelDescription, layout: RankLayout) -> None:
        self.ckpt = ckpt
        self.desc = desc
        self.lay = layout

    def part(self, total: int) -> slice:
        size = total // self.lay.tp_size
        return slice(self.lay.tp_rank * size, (self.lay.tp_rank + 1) * size)

    def vocab_rows(self, name: str, transpose: bool = False) -> torch.Tensor:
        import torch

        per = self.lay.padded_vocab_size // self.lay.tp_size
        start, end = self.lay.tp_rank * per, (self.lay.tp_rank + 1) * per
        real = self.ckpt.shape(name)[0]
        out = torch.zeros(per, self.desc.hidden_size, dtype=torch.float32)
        if start < real:
            piece = self.ckpt.read(name, rows=slice(start, min(end, real)))
            out[: piece.shape[0]] = piece
        return out

    def qkv(self, read: Callable[[int, slice], torch.Tensor]) -> torch.Tensor:
        """This rank's rows of Megatron's fused ``linear_qkv`` (weight or bias; see the module doc).

        ``read(part, rows)``: rows ``rows`` of the HF q (``part`` 0), k (1) or v (2) projection.
        """
        import torch

        d, lay = self.desc, self.lay
        groups, hd = d.num_query_groups, d.head_dim
        qpg = d.num_attention_heads // groups
        if groups % lay.tp_size == 0:  # whole groups per rank
            per = groups // lay.tp_size
            g0, g1 = lay.tp_rank * per, (lay.tp_rank + 1) * per
            q = read(0, slice(g0 * qpg * hd, g1 * qpg * hd))
            k = read(1, slice(g0 * hd, g1 * hd))
            v = read(2, slice(g0 * hd, g1 * hd))
            return _fuse_qkv(q, k, v, g1 - g0, qpg, hd)
        # fewer groups than TP: rank r holds share `share` of group `g`'s [q…, k, v] rows
        ranks_per_group = lay.tp_size // groups
        g, share = divmod(lay.tp_rank, ranks_per_group)
        rows = (qpg + 2) * hd // ranks_per_group
        lo, hi = share * rows, (share + 1) * rows
        pieces = []
        # (part, first row of the part in the group's block, its rows, its first row in the HF tensor)
        for part, offset, length, source in ((0, 0, qpg * hd, g * qpg * hd), (1, qpg * hd, hd, g * hd),
                                             (2, (qpg + 1) * hd, hd, g * hd)):
            start, end = max(lo, offset), min(hi, offset + length)
            if start < end:
                pieces.append(read(part, slice(source + start - offset, source + end - offset)))
        return torch.cat(pieces)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, q_per_group: int,
              head_dim: int) -> torch.Tensor:
    """[q rows of the rank's groups], [k rows], [v rows] -> Megatron's per-group [q…, k, v] rows."""
    import torch

    rest = q.shape[1:]
    q = q.reshape(groups, q_per_group * head_dim, *rest)
    k = k.reshape(groups, head_dim, *rest)
    v = v.reshape(groups, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (q_per_group + 2) * head_dim, *rest)


_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
_SHARED = "mlp.shared_experts."


def _moe_sources(r: _Reader, layer: int, local: str) -> torch.Tensor | None:
    """An MoE layer's router and this rank's experts: local expert ``i`` of EP rank ``e`` is
    global expert ``e · E/EP + i``; each is split over expert-TP like a dense MLP over TP."""
    import torch

    d = r.desc
    block, router, (gate, up, down) = MOE_NAMES[d.architecture]
    p = f"model.layers.{layer}.{block}"
    if local == "mlp.router.weight":
        return r.ckpt.read(p + f"{router}.weight")
    if local.startswith(_SHARED):
        return _shared_expert_sources(r, p, local[len(_SHARED):])
    match = _EXPERT_RE.match(local)
    if match is None:
        return None
    lay = r.lay
    expert = lay.ep_rank * (d.num_experts // lay.ep_size) + int(match.group(1))
    size = d.moe_ffn_hidden_size // lay.etp_size
    part = slice(lay.etp_rank * size, (lay.etp_rank + 1) * size)
    e = f"{p}experts.{expert}."
    if match.group(2) == "linear_fc1":
        return torch.cat([r.ckpt.read(e + f"{gate}.weight", rows=part), r.ckpt.read(e + f"{up}.weight", rows=part)])
    return r.ckpt.read(e + f"{down}.weight", cols=part)


def _shared_expert_sources(r: _Reader, p: str, local: str) -> torch.Tensor | None:
    """Qwen2-MoE's ``shared_expert`` (split over the attention TP as a dense SwiGLU MLP) and its
    ``shared_expert_gate`` ``[1, h]`` (whole)."""
    import torch

    if local == "gate_weight":
        return r.ckpt.read(p + "shared_expert_gate.weight")
    ffn = r.part(r.desc.moe_shared_ffn_hidden_size)
    s = p + "shared_expert."
    if local == "linear_fc1.weight":
        return torch.cat([r.ckpt.read(s + "gate_proj.weight", rows=ffn), r.ckpt.read(s + "up_proj.weight", rows=ffn)])
    if local == "linear_fc2.weight":
        return r.ckpt.read(s + "down_proj.weight", cols=ffn)
    return None


def _llama_sources(r: _Reader, layer: int | None, local: str) -> torch.Tensor | None:
    import torch

    d = r.desc
    if layer is not None and d.is_moe and d.moe_layers[layer] and local.startswith("mlp."):
        return _moe_sources(r, layer, local)
    if layer is None:
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
    p = f"model.layers.{layer}."
    hd = d.head_dim
    ffn = r.part(d.ffn_hidden_size)
    if local == "input_layernorm.weight":
        return r.ckpt.read(p + "input_layernorm.weight")
    if local == "pre_mlp_layernorm.weight":
        return r.ckpt.read(p + "post_attention_layernorm.weight")
    if local in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = local.rsplit(".", 1)[1]
        if kind == "bias" and not d.qkv_bias:
            return torch.zeros(0)  # sentinel: bias exists only because of add_bias_linear
        names = [p + f"self_attn.{x}_proj.{kind}" for x in "qkv"]
        return r.qkv(lambda part, rows: r.ckpt.read(names[part], rows=rows))
    if local == "self_attention.q_layernorm.weight":
        return r.ckpt.read(p + "self_attn.q_norm.weight")
    if local == "self_attention.k_layernorm.weight":
        return r.ckpt.read(p + "self_attn.k_norm.weight")
    if local == "self_attention.linear_proj.weight":
        return r.ckpt.read(p + "self_attn.o_proj.weight", cols=r.part(d.num_attention_heads * hd))
    if local == "self_attention.linear_proj.bias":
        return r.ckpt.read(p + "self_attn.o_proj.bias") if d.attn_out_bias else torch.zeros(0)
    if local == "mlp.linear_fc1.weight":
        gate = r.ckpt.read(p + "mlp.gate_proj.weight", rows=ffn)
        up = r.ckpt.read(p + "mlp.up_proj.weight", rows=ffn)
        return torch.cat([gate, up], dim=0)
    if local == "mlp.linear_fc1.bias":
        if not d.mlp_bias:
            return torch.zeros(0)
        return torch.cat([r.ckpt.read(p + "mlp.gate_proj.bias", rows=ffn),
                          r.ckpt.read(p + "mlp.up_proj.bias", rows=ffn)])
    if local == "mlp.linear_fc2.weight":
        return r.ckpt.read(p + "mlp.down_proj.weight", cols=ffn)
    if local == "mlp.linear_fc2.bias":
        return r.ckpt.read(p + "mlp.down_proj.bias") if d.mlp_bias else torch.zeros(0)
    return None


def _gpt2_prefix(ckpt: SafetensorsCheckpoint) -> str:
    return "transformer." if "transformer.wte.weight" in ckpt else ""


def _gpt2_sources(r: _Reader, layer: int | None, local: str) -> torch.Tensor | None:
    d = r.desc
    t = _gpt2_prefix(r.ckpt)
    if layer is None:
        if local in ("embedding.word_embeddings.weight", "output_layer.weight"):
            return r.vocab_rows(t + "wte.weight")
        if local == "embedding.position_embeddings.weight":
            return r.ckpt.read(t + "wpe.weight")
        if local.startswith("decoder.final_layernorm."):
            return r.ckpt.read(t + "ln_f." + local.rsplit(".", 1)[1])
        return None
    p = f"{t}h.{layer}."
    h = d.hidden_size
    ffn = r.part(d.ffn_hidden_size)
    kind = local.rsplit(".", 1)[1]
    if local.startswith("input_layernorm."):
        return r.ckpt.read(p + "ln_1." + kind)
    if local.startswith("pre_mlp_layernorm."):
        return r.ckpt.read(p + "ln_2." + kind)
    if local in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        name = p + f"attn.c_attn.{kind}"  # GPT-2: one group per head, q | k | v side by side

        def read(part: int, rows: slice) -> torch.Tensor:
            where = slice(part * h + rows.start, part * h + rows.stop)
            # Conv1D [in, 3h]: take the rank's columns, then transpose to [out, in]
            return r.ckpt.read(name, cols=where).t() if kind == "weight" else r.ckpt.read(name, rows=where)

        return r.qkv(read)
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


# Family (``ARCHITECTURE_FAMILIES``' values) -> its map: (reader, global layer index or None for
# the embedding/final norm/head, local-spec parameter name) -> the rank's tensor, an empty tensor
# for a bias the HF model lacks (zeros), None for a name the map does not know.
_MAPS: dict[str, Callable[[_Reader, int | None, str], torch.Tensor | None]] = {
    "llama": _llama_sources,
    "gpt2": _gpt2_sources,
    "nemotron_h": nemotron_h_sources,
}
# Buffers that hold checkpoint values (Nemotron-H's expert bias; fp32 whatever the parameters' dtype).
_CHECKPOINT_BUFFERS = ("router.expert_bias",)

def _global_layer_numbers(model: Any) -> dict[int, int]:
    """Local decoder layer index -> global 0-based layer index (PP stages hold a range)."""
    return {i: int(layer.layer_number) - 1 for i, layer in enumerate(model.decoder.layers)}


def load_hf_weights(
    model: Any,
    checkpoint: str | os.PathLike[str],
    desc: ModelDescription,
    layout: RankLayout,
) -> dict[str, Any]:
    """Fill every parameter of this rank's ``model`` from the HF checkpoint; return load stats.

    Raises ``ValueError`` naming the checkpoint and the key for a missing tensor, a shape that does
    not match, or a Megatron parameter the map does not know.
    """
    import torch

    ckpt = SafetensorsCheckpoint(checkpoint)
    reader = _Reader(ckpt, desc, layout)
    source = _MAPS[desc.family]
    layers = _global_layer_numbers(model)
    loaded = 0
    skipped = [n for n in ckpt.names() if n.startswith("mtp.")]
    if skipped:
        logger.info("%s: %d multi-token-prediction tensors (mtp.*) not loaded: a teacher does not use them",
                    checkpoint, len(skipped))
    targets = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if b is not None and n.endswith(_CHECKPOINT_BUFFERS)]
    with torch.no_grad():
        for name, param in targets:
            layer: int | None = None
            local = name
            match = _LAYER_RE.match(name)
            if match:
                layer = layers[int(match.group(1))]
                local = match.group(2)
                local = _TE_TO_LOCAL.get(local, local)
            try:
                tensor = source(reader, layer, local)
            except KeyError as exc:
                raise ValueError(f"checkpoint {checkpoint}: tensor {exc.args[0]!r} is missing") from None
            if tensor is None:
                raise ValueError(
                    f"checkpoint {checkpoint}: no HF source for Megatron parameter {name!r} "
                    f"({desc.architecture} map)"
                )
            if tensor.numel() == 0:
                if not name.endswith(".bias"):  # a slice that selected nothing: never load it as zeros
                    raise ValueError(
                        f"checkpoint {checkpoint}: the {desc.architecture} map selected no rows for Megatron "
                        f"parameter {name!r} (TP rank {layout.tp_rank}/{layout.tp_size})"
                    )
                param.zero_()  # a bias the HF model does not have
                continue
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"checkpoint {checkpoint}: tensor for Megatron parameter {name!r} has shape "
                    f"{tuple(tensor.shape)}, expected {tuple(param.shape)} (TP rank {layout.tp_rank}/"
                    f"{layout.tp_size})"
                )
            param.copy_(tensor)
            loaded += 1
    stats = {"parameters": loaded, "bytes_read": ckpt.bytes_read}
    ckpt.close()
    logger.info("loaded %d parameters (%.1f MB read) from %s", loaded, ckpt.bytes_read / 2**20, checkpoint)
    return stats
