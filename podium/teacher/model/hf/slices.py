"""The rank's slice of an HF tensor: the arithmetic every family's weight map shares.

This module owns :class:`RankLayout` (what a rank holds) and :class:`SliceReader`, which reads a
rank's part of a checkpoint tensor. Layouts (Megatron side, TP rank ``r`` of ``tp``; "the rank's
part" of ``n`` rows is ``[r·n/tp, (r+1)·n/tp)``):

- ``part``: the rank's part of a column-parallel output (rows) or a row-parallel input (columns);
  biases of row-parallel layers are whole.
- ``gated``: a SwiGLU ``linear_fc1``, ``cat[gate_r, up_r]`` — the gate and up halves are each split
  across ranks (partition stride 2).
- ``vocab_rows``: rows ``[r·Vp/tp, (r+1)·Vp/tp)`` of the padded vocabulary (embedding, output layer);
  rows at or past the real vocabulary are zeros (their logits are masked at the head).
- ``qkv``: Megatron's fused ``linear_qkv``, per query group ``[q_0 … q_{n/g-1}, k, v]`` × ``head_dim``
  rows, the rank's groups ``[r·g/tp, (r+1)·g/tp)``. With fewer KV groups than TP (``tp`` a multiple
  of ``g``) the rank holds, as Megatron's column-parallel ``linear_qkv`` does, rows
  ``[r·R/tp, (r+1)·R/tp)`` of the whole fused matrix (``R`` rows): a ``g/tp`` share of one group,
  cut across its q/k/v parts (Megatron all-gathers the fused output and each rank keeps group
  ``r // (tp/g)``, then its own query heads of it).
- ``routed_expert``: a routed expert's ``linear_fc1``/``linear_fc2`` (local spec, ``SequentialMLP``):
  local expert ``i`` of EP rank ``e`` is HF expert ``e·E/EP + i``, split over expert-TP as an MLP
  over TP (the expert-TP rank's part of the hidden units: ``fc1`` rows, ``fc2`` columns).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from podium.teacher.model.hf.description import ModelDescription
from podium.teacher.model.hf.safetensors_io import SafetensorsCheckpoint

if TYPE_CHECKING:  # pragma: no cover
    import torch

_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")


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


@dataclass(frozen=True)
class ExpertSlice:
    """A routed expert's parameter on this rank: the HF expert, which of its two linear layers, and
    the expert-TP rank's hidden units (``linear_fc1``'s rows, ``linear_fc2``'s columns)."""

    expert: int
    fc: str  # "linear_fc1" | "linear_fc2"
    hidden: slice


class SliceReader:
    """A rank's slices of one checkpoint's tensors (see the module doc for each layout)."""

    def __init__(self, ckpt: SafetensorsCheckpoint, desc: ModelDescription, layout: RankLayout) -> None:
        self.ckpt = ckpt
        self.desc = desc
        self.lay = layout

    def part(self, total: int) -> slice:
        """The TP rank's part of ``total`` rows (or columns)."""
        size = total // self.lay.tp_size
        return slice(self.lay.tp_rank * size, (self.lay.tp_rank + 1) * size)

    def gated(self, gate: str, up: str, rows: slice) -> torch.Tensor:
        """A SwiGLU ``linear_fc1``: rows ``rows`` of the gate, then the same rows of the up projection."""
        import torch

        return torch.cat([self.ckpt.read(gate, rows=rows), self.ckpt.read(up, rows=rows)])

    def vocab_rows(self, name: str) -> torch.Tensor:
        """The rank's rows of the padded vocabulary (zeros past the checkpoint's rows)."""
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
            return fuse_qkv(q, k, v, g1 - g0, qpg, hd)
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

    def routed_expert(self, local: str) -> ExpertSlice | None:
        """The routed expert a local-spec parameter name is on this rank (None: not a routed expert's)."""
        match = _EXPERT_RE.match(local)
        if match is None:
            return None
        d, lay = self.desc, self.lay
        size = d.moe_ffn_hidden_size // lay.etp_size
        return ExpertSlice(expert=lay.ep_rank * (d.num_experts // lay.ep_size) + int(match.group(1)),
                           fc=match.group(2), hidden=slice(lay.etp_rank * size, (lay.etp_rank + 1) * size))


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, q_per_group: int,
             head_dim: int) -> torch.Tensor:
    """[q rows of the rank's groups], [k rows], [v rows] -> Megatron's per-group [q…, k, v] rows."""
    import torch

    rest = q.shape[1:]
    q = q.reshape(groups, q_per_group * head_dim, *rest)
    k = k.reshape(groups, head_dim, *rest)
    v = v.reshape(groups, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (q_per_group + 2) * head_dim, *rest)


if TYPE_CHECKING:  # pragma: no cover
    # A family's map: (reader, global layer index or None for the embedding/final norm/head,
    # local-spec parameter name) -> the rank's tensor, an empty tensor for a bias the HF model lacks
    # (zeros), None for a name the map does not know.
    WeightMap = Callable[[SliceReader, int | None, str], torch.Tensor | None]
