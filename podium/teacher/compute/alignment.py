"""Where each position's answer goes: NeMo RL's alignment, the next-token alignment, the CP split.

- NeMo RL's convention (:func:`to_nemo_rl`): ``out[b, i]`` is the logprob of token ``i`` given the
  tokens before it, position 0 is 0, positions at or past ``input_lengths[b]`` are 0. Top-k uses the
  same alignment: ``topk_*[b, i]`` describe the distribution token ``i`` was drawn from, so
  ``logprobs[b, i] == topk_logprobs[b, i, j]`` wherever ``topk_indices[b, i, j] == input_ids[b, i]``.
- The next-token alignment (:func:`next_token_outputs`, NeMo RL's ``get_topk_logits``): position
  ``t`` describes the distribution of the token after ``t``; zero where ``t ≥ length - 1``.
- Context parallelism's load-balanced sequence split (:func:`cp_split`, :func:`cp_unsplit`): the
  sequence in ``2·CP`` chunks, rank ``r`` holding chunks ``r`` and ``2·CP-1-r``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch


def next_token_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """``labels[:, t] = input_ids[:, t+1]`` (the last column is a dummy 0)."""
    import torch

    labels = torch.zeros_like(input_ids)
    labels[:, :-1] = input_ids[:, 1:]
    return labels


def to_nemo_rl(
    token_logprobs: torch.Tensor,
    lengths: torch.Tensor,
    topk_values: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Shift per-position outputs (position t predicts t+1) into NeMo RL's alignment and mask.

    ``token_logprobs [B, S]`` holds log p(input_ids[t+1] | ≤ t) at ``t``; the result holds it at
    ``t+1``, with position 0 and positions at or past the length set to 0 (indices to 0 too).
    """
    import torch

    batch, seq = token_logprobs.shape
    valid = torch.arange(seq, device=lengths.device)[None, :] < lengths[:, None]
    valid[:, 0] = False
    out = torch.zeros(batch, seq, dtype=torch.float32)
    out[:, 1:] = token_logprobs[:, :-1].float()
    result = {"logprobs": out * valid}
    if topk_values is not None and topk_indices is not None:
        k = topk_values.shape[-1]
        vals = torch.zeros(batch, seq, k, dtype=torch.float32)
        idx = torch.zeros(batch, seq, k, dtype=topk_indices.dtype)
        vals[:, 1:] = topk_values[:, :-1].float()
        idx[:, 1:] = topk_indices[:, :-1]
        result["topk_logprobs"] = vals * valid[..., None]
        result["topk_indices"] = idx * valid[..., None]
    return result


def shifted_ranks(ranks: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The head's label ranks (position ``t``: the rank of token ``t+1``) in NeMo RL's alignment
    (position ``i``: token ``i``'s), 0 at position 0 and at or past the length; int64."""
    import torch

    batch, seq = ranks.shape
    valid = torch.arange(seq, device=lengths.device)[None, :] < lengths[:, None]
    valid[:, 0] = False
    out = torch.zeros(batch, seq, dtype=torch.int64)
    out[:, 1:] = ranks[:, :-1].long()
    return out * valid


def next_token_outputs(
    lengths: torch.Tensor,
    *,
    topk_values: torch.Tensor | None = None,
    topk_indices: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    candidate_logprobs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-position outputs in the *next-token* alignment (NeMo RL's ``get_topk_logits``: position
    ``t`` describes the distribution of the token after ``t``), zero where ``t ≥ length - 1``.

    ``topk_logits = topk_values + lse``: the temperature-scaled logits of the top-k ids (the head
    computed their log-probabilities and the log-sum-exp). ``candidate_logprobs`` are already in
    this alignment.
    """
    import torch

    out: dict[str, torch.Tensor] = {}
    present = [t for t in (topk_values, candidate_logprobs) if t is not None]
    if not present:
        return out
    seq = present[0].shape[1]
    valid = (torch.arange(seq)[None, :] < (lengths[:, None] - 1))[..., None]
    if topk_values is not None and topk_indices is not None and lse is not None:
        out["topk_logits"] = ((topk_values + lse[..., None]) * valid).float()
        out["topk_logit_indices"] = topk_indices * valid  # in the head's dtype (index_dtype)
    if candidate_logprobs is not None:
        out["candidate_logprobs"] = (candidate_logprobs * valid).float()
    return out


def cp_chunk_ids(cp_size: int, cp_rank: int) -> tuple[int, int]:
    return cp_rank, 2 * cp_size - 1 - cp_rank


def cp_split(tensor: torch.Tensor, cp_size: int, cp_rank: int, seq_dim: int = 1) -> torch.Tensor:
    """This CP rank's two chunks of ``tensor`` along ``seq_dim`` (length divisible by 2·CP)."""
    import torch

    if cp_size == 1:
        return tensor
    chunks = tensor.chunk(2 * cp_size, dim=seq_dim)
    a, b = cp_chunk_ids(cp_size, cp_rank)
    return torch.cat([chunks[a], chunks[b]], dim=seq_dim)


def cp_unsplit(pieces: Sequence[torch.Tensor], cp_size: int, seq_dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`cp_split` given every CP rank's piece, in CP rank order."""
    import torch

    if cp_size == 1:
        return pieces[0]
    chunks: list[Any] = [None] * (2 * cp_size)
    for rank, piece in enumerate(pieces):
        first, second = piece.chunk(2, dim=seq_dim)
        a, b = cp_chunk_ids(cp_size, rank)
        chunks[a], chunks[b] = first, second
    return torch.cat(chunks, dim=seq_dim)
