"""Per-token logprobs from a (tensor/pipeline/context-parallel) GPTModel, forward only.

This module owns the numerics of ``get_logprobs`` inside one worker:

- NeMo RL's convention (:func:`to_nemo_rl`): ``out[b, i]`` is the logprob of token ``i`` given the
  tokens before it, position 0 is 0, positions at or past ``input_lengths[b]`` are 0. Top-k uses the
  same alignment: ``topk_*[b, i]`` describe the distribution token ``i`` was drawn from, so
  ``logprobs[b, i] == topk_logprobs[b, i, j]`` wherever ``topk_indices[b, i, j] == input_ids[b, i]``.
- :class:`LogprobHead`: installed on the last pipeline stage's GPTModel, it replaces the logits
  + loss step. It takes the final hidden states and computes, by chunks of rows, this rank's slice of
  the logits (only real vocabulary rows, padding rows are skipped) and their log-softmax (one
  vectorised kernel; the separate max/exp/sum passes were ~4x slower on CPU). With TP > 1 each rank
  keeps its slice's log-sum-exp (``amax(x) - amax(log_softmax(x))``), the target's raw logit and a
  local top-k; one all-gather of ``[n]`` log-sum-exps, one all-reduce and (for top-k) one
  all-gather of ``[n, K]`` combine them. This is the vocab-parallel cross entropy, forward only: the
  full vocabulary is never gathered on one rank and the full ``[S, B, V]`` logits never exist.
- :func:`forward_only_stage_loop`: micro-batches through the pipeline stages with
  ``set_input_tensor`` and point-to-point ``isend``/``recv`` (Megatron's schedules hard-code CUDA);
  works with gloo and NCCL. Sends are asynchronous, so stage ``p`` starts micro-batch ``m+1`` while
  stage ``p+1`` works on ``m``.
- CP load-balanced sequence split, and shifting into NeMo RL's alignment (micro-batch planning is
  ``podium.teacher.compute.microbatch``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from podium.protocol.names import INT32_VOCAB
from podium.teacher.compute.microbatch import GEMM_ROWS, round_up

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

# Rows of hidden states per logits chunk: about this many logits elements per chunk (128 MB fp32).
# Large enough that the output weight is streamed only a few times per micro-batch (small chunks
# re-read it per chunk and were 2-3x slower on CPU), small enough that the full [S·B, V] logits
# never exist.
CHUNK_ELEMENTS = 1 << 25


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


# ----------------------------------------------------------------------------------------------
# Context parallel split (load balanced: 2·CP chunks, rank r holds chunks r and 2·CP-1-r)
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# The head: hidden states -> token logprobs (+ top-k), vocab-parallel, chunked
# ----------------------------------------------------------------------------------------------


class LogprobHead:
    """Replaces a last-stage GPTModel's output layer + loss with chunked vocab-parallel logprobs.

    After :meth:`install`, ``model(..., labels=labels)`` returns ``{"logprobs": [b, s]}`` (the
    logprob of ``labels[:, t]`` at ``t``) and, when ``self.top_k`` is set, ``"topk_values"`` /
    ``"topk_indices"`` ``[b, s, K]`` (log-probabilities and global token ids, by descending value,
    exact ties by ascending id). Per call (set before the forward):

    - ``temperature``: the logits are divided by it before everything else (NeMo RL's
      ``apply_temperature_scaling``): logprobs are ``log_softmax(z / T)``;
    - ``want_lse``: also ``"lse"`` ``[b, s]``, the log-sum-exp of ``z / T`` (so top-k *logits* are
      ``topk_values + lse``);
    - ``pending_candidates``: per micro-batch, caller-given token ids ``[b, s, C]``; the output
      ``"candidate_logprobs"`` ``[b, s, C]`` holds their logprobs under the distribution at each
      position (each rank reads the logits of the ids in its vocabulary slice; one all-reduce).
    """

    def __init__(self, vocab_size: int, tp_group: Any, tp_rank: int, tp_size: int,
                 chunk_elements: int = CHUNK_ELEMENTS) -> None:
        self.vocab_size = vocab_size
        self.tp_group = tp_group
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.chunk_elements = chunk_elements
        self.top_k: int | None = None
        self.temperature: float = 1.0
        self.want_lse: bool = False
        # Row masks [b, s] for the next micro-batches, in order (True = this position's next-token
        # logprob is wanted); positions masked out (padding, last token) skip the head entirely.
        self.pending_masks: list[Any] = []
        self.pending_candidates: list[Any] = []  # [b, s, C] caller ids per micro-batch, or empty
        self._weight: Any = None
        self._output_layer: Any = None

    def install(self, model: Any) -> None:
        self._output_layer = model.output_layer

        def capture(hidden_states: Any, weight: Any = None, runtime_gather_output: Any = None) -> tuple[Any, None]:
            self._weight = weight if weight is not None else self._output_layer.weight
            return hidden_states, None

        model.output_layer.forward = capture
        model.compute_language_model_loss = self.compute

    def compute(self, labels: torch.Tensor, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        import torch
        import torch.distributed as dist

        weight = self._weight
        self._weight = None
        seq, batch, hidden_size = hidden.shape
        rows = hidden.reshape(seq * batch, hidden_size)
        targets = labels.t().reshape(seq * batch)
        cands = None
        if self.pending_candidates:
            c = self.pending_candidates.pop(0)  # [b, s, C] -> rows in the hidden states' (s, b) order
            cands = c.transpose(0, 1).reshape(seq * batch, c.shape[-1]).to(rows.device)
        keep = None
        if self.pending_masks:
            mask = self.pending_masks.pop(0)
            keep = mask.t().reshape(seq * batch).nonzero().squeeze(1).to(rows.device)
            rows = rows.index_select(0, keep)
            targets = targets.index_select(0, keep)
            if cands is not None:
                cands = cands.index_select(0, keep)
        n = rows.shape[0]
        # Row counts of the logits GEMM stay multiples of GEMM_ROWS (zero rows, dropped below): a
        # position's logits then never depend on how many positions share its micro-batch (see
        # podium.teacher.compute.microbatch), and its answer is the same batched or alone.
        extra = -n % GEMM_ROWS
        if extra:
            rows = torch.cat([rows, rows.new_zeros((extra, hidden_size))])
        local_vocab = weight.shape[0]
        start = self.tp_rank * local_vocab
        valid = max(0, min(local_vocab, self.vocab_size - start))
        w = weight[:valid]  # padding rows of the vocabulary are never multiplied
        device = rows.device
        tp = self.tp_size
        k = self.top_k
        k_local = min(k, valid) if k else 0
        # TP1: exact logprobs directly. TP>1: this rank's log-sum-exp, the target's raw logit (0 when
        # another rank owns it) and raw top-k logits; combined across ranks below.
        scale = 1.0 / float(self.temperature)
        lse_local = torch.full((n,), float("-inf"), dtype=torch.float32, device=device)
        target_val = torch.zeros(n, dtype=torch.float32, device=device)
        cand_val = torch.zeros(cands.shape, dtype=torch.float32, device=device) if cands is not None else None
        if k:
            top_vals = torch.full((n, k), float("-inf"), dtype=torch.float32, device=device)
            top_idx = torch.zeros((n, k), dtype=torch.int64, device=device)
        if valid > 0 and n > 0:
            step = max(GEMM_ROWS, self.chunk_elements // valid // GEMM_ROWS * GEMM_ROWS)
            in_range = (targets >= start) & (targets < start + valid)
            local_t = (targets - start).clamp(0, valid - 1)
            if cands is not None:
                cand_in = (cands >= start) & (cands < start + valid)
                cand_local = (cands - start).clamp(0, valid - 1)
            for r0 in range(0, n, step):
                r1 = min(n, r0 + step)
                logits = torch.matmul(rows[r0:r0 + round_up(r1 - r0, GEMM_ROWS)], w.t())[: r1 - r0].float()
                if scale != 1.0:
                    logits.mul_(scale)
                logsm = torch.log_softmax(logits, dim=-1)  # one vectorised pass
                if tp == 1:
                    target_val[r0:r1] = logsm.gather(1, local_t[r0:r1, None]).squeeze(1)
                    if cand_val is not None:
                        cand_val[r0:r1] = logsm.gather(1, cand_local[r0:r1])
                    if self.want_lse:  # log-sum-exp: max(x) - max(x - lse) = lse
                        lse_local[r0:r1] = torch.amax(logits, dim=-1) - torch.amax(logsm, dim=-1)
                    source = logsm
                else:
                    # log-sum-exp of this rank's slice: max(x) - max(x - lse) = lse
                    lse_local[r0:r1] = torch.amax(logits, dim=-1) - torch.amax(logsm, dim=-1)
                    raw = logits.gather(1, local_t[r0:r1, None]).squeeze(1)
                    target_val[r0:r1] = torch.where(in_range[r0:r1], raw, torch.zeros_like(raw))
                    if cand_val is not None:
                        raw_c = logits.gather(1, cand_local[r0:r1])
                        cand_val[r0:r1] = torch.where(cand_in[r0:r1], raw_c, torch.zeros_like(raw_c))
                    source = logits
                if k_local:
                    v, i = torch.topk(source, k_local, dim=-1)
                    top_vals[r0:r1, :k_local] = v
                    top_idx[r0:r1, :k_local] = i + start
                del logits, logsm, source
        if tp > 1 and n > 0:  # every TP rank has the same n (same data, same mask)
            gathered = [torch.empty_like(lse_local) for _ in range(tp)]
            dist.all_gather(gathered, lse_local, group=self.tp_group)
            lse = torch.logsumexp(torch.stack(gathered), dim=0)
            dist.all_reduce(target_val, op=dist.ReduceOp.SUM, group=self.tp_group)
            logprobs = target_val - lse
            if cand_val is not None:
                dist.all_reduce(cand_val, op=dist.ReduceOp.SUM, group=self.tp_group)
                cand_val = cand_val - lse[:, None]
        else:
            lse = lse_local if self.want_lse else torch.zeros(n, dtype=torch.float32, device=device)
            logprobs = target_val
        out: dict[str, torch.Tensor] = {"logprobs": _unkeep(logprobs, keep, seq, batch)}
        if self.want_lse:
            out["lse"] = _unkeep(lse, keep, seq, batch)
        if cand_val is not None:
            out["candidate_logprobs"] = _unkeep(cand_val, keep, seq, batch)
        if k:
            if tp > 1 and n > 0:
                gathered_v = [torch.empty_like(top_vals) for _ in range(tp)]
                gathered_i = [torch.empty_like(top_idx) for _ in range(tp)]
                dist.all_gather(gathered_v, top_vals, group=self.tp_group)
                dist.all_gather(gathered_i, top_idx, group=self.tp_group)
                # every rank's top-k, best first with exact ties by id, then the first k overall
                top_vals, top_idx = ties_by_id(torch.cat(gathered_v, dim=1), torch.cat(gathered_i, dim=1))
                top_vals, top_idx = top_vals[:, :k] - lse[:, None], top_idx[:, :k]
            else:
                top_vals, top_idx = ties_by_id(top_vals, top_idx)
            out["topk_values"] = _unkeep(top_vals, keep, seq, batch)
            # narrowed on the device: half the bytes to the host, through Ray, onto the wire
            out["topk_indices"] = _unkeep(top_idx.to(index_dtype(self.vocab_size)), keep, seq, batch)
        return out


def index_dtype(vocab_size: int) -> torch.dtype:
    """The dtype the head answers top-k ids in: int32 when every id fits (any real vocabulary), so
    the narrowing costs nothing on a GPU; the endpoint widens them for a caller asking INT64."""
    import torch

    return torch.int32 if vocab_size <= INT32_VOCAB else torch.int64


def ties_by_id(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k rows (descending values) reordered so exact ties come by ascending id: a deterministic
    order (``torch.topk`` leaves the order of equal values unspecified; with TP it would depend on
    which rank held which id)."""
    import torch

    order = torch.argsort(indices, dim=-1, stable=True)
    values, indices = values.gather(-1, order), indices.gather(-1, order)
    order = torch.argsort(values, dim=-1, descending=True, stable=True)
    return values.gather(-1, order), indices.gather(-1, order)


def _unkeep(rows: torch.Tensor, keep: torch.Tensor | None, seq: int, batch: int) -> torch.Tensor:
    """Per-row results of the kept rows back into ``[b, s, ...]`` (rows not kept are 0)."""
    import torch

    if keep is not None:
        full = torch.zeros((seq * batch, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
        rows = full.index_copy_(0, keep, rows)
    return rows.view(seq, batch, *rows.shape[1:]).transpose(0, 1).contiguous()


# ----------------------------------------------------------------------------------------------
# Forward-only pipeline loop
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageInfo:
    """This rank's place in the pipeline and how to talk to its neighbours."""

    is_first: bool
    is_last: bool
    prev_rank: int | None
    next_rank: int | None
    group: Any
    hidden_size: int
    dtype: Any
    device: Any


def forward_only_stage_loop(
    model: Any,
    microbatches: Sequence[dict[str, torch.Tensor]],
    stage: StageInfo,
) -> list[Any]:
    """Run ``microbatches`` (``input_ids``, ``position_ids``, ``labels`` ``[b, s]``) through this stage.

    Returns the last stage's per-micro-batch outputs (the head's dicts); other stages return ``[]``.
    Every rank of a pipeline must be given the same micro-batch shapes, in the same order.
    """
    import torch
    import torch.distributed as dist

    outputs: list[Any] = []
    pending: list[tuple[Any, Any]] = []
    with torch.no_grad():
        for mb in microbatches:
            batch, seq = mb["labels"].shape
            if not stage.is_first:
                received = torch.empty(seq, batch, stage.hidden_size, dtype=stage.dtype, device=stage.device)
                dist.recv(received, src=stage.prev_rank, group=stage.group)
                model.set_input_tensor(received)
            out = model(
                input_ids=mb["input_ids"] if stage.is_first else None,
                position_ids=mb["position_ids"] if stage.is_first else None,
                attention_mask=None,
                labels=mb["labels"] if stage.is_last else None,
            )
            if stage.is_last:
                outputs.append(out)
            else:
                out = out.contiguous()
                pending.append((dist.isend(out, dst=stage.next_rank, group=stage.group), out))
        for handle, _tensor in pending:
            handle.wait()
    return outputs
