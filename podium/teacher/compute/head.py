"""The logprob head: a last pipeline stage's hidden states -> token logprobs, top-k, candidates.

:class:`LogprobHead`, installed on the last stage's GPTModel, replaces the logits + loss step. It
takes the final hidden states and computes, by chunks of rows, this rank's slice of the logits
(only real vocabulary rows, padding rows are skipped) and their log-softmax (one vectorised
kernel; the separate max/exp/sum passes were ~4x slower on CPU). With TP > 1 each rank keeps its
slice's log-sum-exp (``amax(x) - amax(log_softmax(x))``), the target's raw logit and a local
top-k; one all-gather of ``[n]`` log-sum-exps, one all-reduce and (for top-k) one all-gather of
``[n, K]`` combine them. This is the vocab-parallel cross entropy, forward only: the full
vocabulary is never gathered on one rank and the full ``[S, B, V]`` logits never exist.

What a call asks of the head is an argument: a :class:`HeadCall` for the whole call and one
:class:`HeadInputs` per micro-batch, given for the duration of the call by
:meth:`LogprobHead.serving`; megatron's forward hands the head each micro-batch's hidden states.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from podium.config.teacher_keys import Fp32LmHead
from podium.protocol.names import INT32_VOCAB
from podium.teacher.compute.microbatch import GEMM_ROWS, round_up
from podium.teacher.model.output_gemm import OutputGemm

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

# Rows of hidden states per logits chunk: about this many logits elements per chunk (128 MB fp32).
# Large enough that the output weight is streamed only a few times per micro-batch (small chunks
# re-read it per chunk and were 2-3x slower on CPU), small enough that the full [S·B, V] logits
# never exist.
CHUNK_ELEMENTS = 1 << 25


@dataclass(frozen=True)
class HeadCall:
    """What the head computes in one call, for each of its micro-batches.

    ``temperature``: the logits are divided by it before everything else (NeMo RL's
    ``apply_temperature_scaling``): logprobs are ``log_softmax(z / T)``. ``top_k``: also
    ``"topk_values"`` / ``"topk_indices"`` ``[b, s, K]`` (log-probabilities and global token ids,
    by descending value, exact ties by ascending id). ``want_lse``: also ``"lse"`` ``[b, s]``, the
    log-sum-exp of ``z / T`` (so top-k *logits* are ``topk_values + lse``). ``want_rank``: also
    ``"rank"`` ``[b, s]``, the 1-based rank of the label in its distribution (1 + the ids of larger
    logit; at TP>1 a second pass over the vocabulary slices, counted against the combined label
    logit). ``payload``: also a full-vocabulary payload ``[b, s, D]`` (``"hidden_states"`` or
    ``"logits"``, in ``payload_datatype``: :mod:`podium.teacher.compute.payload`)."""

    temperature: float = 1.0
    top_k: int | None = None
    want_lse: bool = False
    want_rank: bool = False
    payload: str | None = None
    payload_datatype: str = "FP32"


@dataclass(frozen=True)
class HeadInputs:
    """One micro-batch's inputs to the head beside its hidden states and labels.

    ``wanted``: bool ``[b, s]``, the positions whose next-token distribution is needed (the others,
    padding and each row's last token, skip the head and come back as 0; None: every position).
    ``candidates``: caller-given ids ``[b, s, C]``; the output ``"candidate_logprobs"`` ``[b, s, C]``
    holds their logprobs under the distribution at each position."""

    wanted: Any = None
    candidates: Any = None


@dataclass
class _Partial:
    """This rank's share of a micro-batch's answer over its vocabulary slice (kept rows only)."""

    lse: Any  # [n] log-sum-exp of the slice (exact at TP1 only where asked)
    target: Any  # [n] the target's logprob (TP1) or raw logit (TP>1, 0 when another rank owns it)
    candidates: Any  # [n, C] likewise, or None
    top_values: Any  # [n, K] or None
    top_indices: Any  # [n, K] global ids, or None
    rank: Any = None  # [n] int64: 1 + ids of larger logit than the target (TP1; TP>1 after _rank), or None


class LogprobHead:
    """Replaces a last-stage GPTModel's output layer + loss with chunked vocab-parallel logprobs.

    After :meth:`install`, within :meth:`serving`, ``model(..., labels=labels)`` returns
    ``{"logprobs": [b, s]}`` (the logprob of ``labels[:, t]`` at ``t``) and what the call's
    :class:`HeadCall` asks (see there; ``"candidate_logprobs"`` with the micro-batch's candidates)."""

    def __init__(self, vocab_size: int, tp_group: Any, tp_rank: int, tp_size: int,
                 chunk_elements: int = CHUNK_ELEMENTS, fp32_lm_head: Fp32LmHead = False) -> None:
        self.vocab_size = vocab_size
        self.fp32_lm_head = fp32_lm_head  # the output GEMM's logits precision (podium.teacher.model.output_gemm)
        self.tp_group = tp_group
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.chunk_elements = chunk_elements
        self._weight: Any = None
        self._output_layer: Any = None
        self._serving: tuple[HeadCall, collections.deque[HeadInputs]] | None = None

    def install(self, model: Any) -> None:
        """The model's output layer hands its input (and weight) to the head; its loss is the head."""
        self._output_layer = model.output_layer

        def capture(hidden_states: Any, weight: Any = None, runtime_gather_output: Any = None) -> tuple[Any, None]:
            self._weight = weight if weight is not None else self._output_layer.weight
            return hidden_states, None

        model.output_layer.forward = capture
        model.compute_language_model_loss = self._on_loss

    @contextlib.contextmanager
    def serving(self, call: HeadCall, inputs: Sequence[HeadInputs]) -> Iterator[None]:
        """Within: the model's forwards compute ``call``, the ``i``-th forward with ``inputs[i]``."""
        self._serving = (call, collections.deque(inputs))
        try:
            yield
        finally:
            self._serving = None

    def _on_loss(self, labels: torch.Tensor, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """megatron's loss hook: the next micro-batch of the call being served."""
        if self._serving is None or not self._serving[1]:
            raise RuntimeError("LogprobHead: a forward outside LogprobHead.serving, or more forwards than inputs")
        call, pending = self._serving
        weight, self._weight = self._weight, None
        return self.compute(labels, hidden, weight, call, pending.popleft())

    def compute(self, labels: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, call: HeadCall,
                inputs: HeadInputs) -> dict[str, torch.Tensor]:
        """The head's answer for one micro-batch: hidden ``[s, b, h]``, labels ``[b, s]``, this
        rank's slice of the output weight ``[V/TP, h]``."""
        seq, batch, _ = hidden.shape
        rows, targets, cands, keep = _kept_rows(labels, hidden, inputs)
        partial = self._local(rows, targets, cands, weight, call)
        logprobs, lse, cand_logprobs = self._combine(partial, call)
        out: dict[str, torch.Tensor] = {"logprobs": _unkeep(logprobs, keep, seq, batch)}
        if call.want_lse:
            out["lse"] = _unkeep(lse, keep, seq, batch)
        if cand_logprobs is not None:
            out["candidate_logprobs"] = _unkeep(cand_logprobs, keep, seq, batch)
        if call.want_rank:
            out["rank"] = _unkeep(self._rank(rows, partial, weight, call), keep, seq, batch)
        if call.top_k:
            top_values, top_indices = self._top_k(partial, lse, call.top_k)
            out["topk_values"] = _unkeep(top_values, keep, seq, batch)
            # narrowed on the device: half the bytes to the host, through Ray, onto the wire
            out["topk_indices"] = _unkeep(top_indices.to(index_dtype(self.vocab_size)), keep, seq, batch)
        if call.payload is not None:
            out.update(self._payload(hidden, weight, call))
        return out

    def _payload(self, hidden: torch.Tensor, weight: torch.Tensor, call: HeadCall) -> dict[str, torch.Tensor]:
        from podium.teacher.compute.payload import payload_outputs

        assert call.payload is not None
        return payload_outputs(call.payload, hidden, weight, datatype=call.payload_datatype,
                               temperature=call.temperature, vocab_size=self.vocab_size, tp_group=self.tp_group,
                               tp_size=self.tp_size, chunk_elements=self.chunk_elements,
                               fp32_lm_head=self.fp32_lm_head)

    def _local(self, rows: torch.Tensor, targets: torch.Tensor, cands: torch.Tensor | None, weight: torch.Tensor,
               call: HeadCall) -> _Partial:
        """This rank's vocabulary slice of every kept row, a chunk of rows at a time. TP1: exact
        logprobs directly. TP>1: the slice's log-sum-exp, the target's raw logit (0 when another
        rank owns it) and raw top-k logits, combined across ranks by :meth:`_combine`."""
        import torch

        n = targets.shape[0]
        local_vocab = weight.shape[0]
        start = self.tp_rank * local_vocab
        valid = max(0, min(local_vocab, self.vocab_size - start))
        gemm = OutputGemm(weight[:valid], self.fp32_lm_head)  # padding rows of the vocabulary are never multiplied
        device, k = rows.device, call.top_k
        k_local = min(k, valid) if k else 0
        scale = 1.0 / float(call.temperature)
        part = _Partial(
            lse=torch.full((n,), float("-inf"), dtype=torch.float32, device=device),
            target=torch.zeros(n, dtype=torch.float32, device=device),
            candidates=torch.zeros(cands.shape, dtype=torch.float32, device=device) if cands is not None else None,
            top_values=torch.full((n, k), float("-inf"), dtype=torch.float32, device=device) if k else None,
            top_indices=torch.zeros((n, k), dtype=torch.int64, device=device) if k else None,
            rank=torch.ones(n, dtype=torch.int64, device=device) if call.want_rank and self.tp_size == 1 else None,
        )
        if valid == 0 or n == 0:
            return part
        step = max(GEMM_ROWS, self.chunk_elements // valid // GEMM_ROWS * GEMM_ROWS)
        in_range = (targets >= start) & (targets < start + valid)
        local_t = (targets - start).clamp(0, valid - 1)
        cand_in: Any = None
        cand_local: Any = None
        if cands is not None:
            cand_in = (cands >= start) & (cands < start + valid)
            cand_local = (cands - start).clamp(0, valid - 1)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            logits = gemm(rows[r0:r0 + round_up(r1 - r0, GEMM_ROWS)])[: r1 - r0]
            if scale != 1.0:
                logits.mul_(scale)
            logsm = torch.log_softmax(logits, dim=-1)  # one vectorised pass
            if self.tp_size == 1:
                part.target[r0:r1] = logsm.gather(1, local_t[r0:r1, None]).squeeze(1)
                if part.candidates is not None:
                    part.candidates[r0:r1] = logsm.gather(1, cand_local[r0:r1])
                if call.want_lse:  # log-sum-exp: max(x) - max(x - lse) = lse
                    part.lse[r0:r1] = torch.amax(logits, dim=-1) - torch.amax(logsm, dim=-1)
                if part.rank is not None:  # compared within the same values: exact
                    part.rank[r0:r1] += (logsm > part.target[r0:r1, None]).sum(dim=-1)
                source = logsm
            else:
                # log-sum-exp of this rank's slice: max(x) - max(x - lse) = lse
                part.lse[r0:r1] = torch.amax(logits, dim=-1) - torch.amax(logsm, dim=-1)
                raw = logits.gather(1, local_t[r0:r1, None]).squeeze(1)
                part.target[r0:r1] = torch.where(in_range[r0:r1], raw, torch.zeros_like(raw))
                if part.candidates is not None:
                    raw_c = logits.gather(1, cand_local[r0:r1])
                    part.candidates[r0:r1] = torch.where(cand_in[r0:r1], raw_c, torch.zeros_like(raw_c))
                source = logits
            if k_local:
                v, i = torch.topk(source, k_local, dim=-1)
                part.top_values[r0:r1, :k_local] = v
                part.top_indices[r0:r1, :k_local] = i + start
            del logits, logsm, source
        return part

    def _combine(self, part: _Partial, call: HeadCall) -> tuple[Any, Any, Any]:
        """The kept rows' logprobs, log-sum-exps and candidate logprobs over the whole vocabulary:
        at TP>1 one all-gather of the slices' log-sum-exps and an all-reduce of the raw logits."""
        import torch
        import torch.distributed as dist

        n = part.target.shape[0]
        if self.tp_size > 1 and n > 0:  # every TP rank has the same n (same data, same mask)
            gathered = [torch.empty_like(part.lse) for _ in range(self.tp_size)]
            dist.all_gather(gathered, part.lse, group=self.tp_group)
            lse = torch.logsumexp(torch.stack(gathered), dim=0)
            dist.all_reduce(part.target, op=dist.ReduceOp.SUM, group=self.tp_group)
            cand_logprobs = part.candidates
            if cand_logprobs is not None:
                dist.all_reduce(cand_logprobs, op=dist.ReduceOp.SUM, group=self.tp_group)
                cand_logprobs = cand_logprobs - lse[:, None]
            return part.target - lse, lse, cand_logprobs
        lse = part.lse if call.want_lse else torch.zeros(n, dtype=torch.float32, device=part.target.device)
        return part.target, lse, part.candidates

    def _rank(self, rows: torch.Tensor, part: _Partial, weight: torch.Tensor, call: HeadCall) -> torch.Tensor:
        """The kept rows' 1-based label ranks. TP1: counted in :meth:`_local`. TP>1: each rank counts
        the logits of its slice above the label's (``part.target``, combined by :meth:`_combine`:
        the owner's value plus zeros, so bit-equal to what the owner's same-chunked GEMM gives),
        one all-reduce sums the counts."""
        import torch
        import torch.distributed as dist

        if part.rank is not None:
            return part.rank
        n = part.target.shape[0]
        local_vocab = weight.shape[0]
        valid = max(0, min(local_vocab, self.vocab_size - self.tp_rank * local_vocab))
        count = torch.zeros(n, dtype=torch.int64, device=rows.device)
        if valid and n:
            gemm, scale = OutputGemm(weight[:valid], self.fp32_lm_head), 1.0 / float(call.temperature)
            step = max(GEMM_ROWS, self.chunk_elements // valid // GEMM_ROWS * GEMM_ROWS)  # as _local: same values
            for r0 in range(0, n, step):
                r1 = min(n, r0 + step)
                logits = gemm(rows[r0:r0 + round_up(r1 - r0, GEMM_ROWS)])[: r1 - r0]
                if scale != 1.0:
                    logits.mul_(scale)
                count[r0:r1] = (logits > part.target[r0:r1, None]).sum(dim=-1)
                del logits
        if n:
            dist.all_reduce(count, op=dist.ReduceOp.SUM, group=self.tp_group)
        return count + 1

    def _top_k(self, part: _Partial, lse: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept rows' top-k logprobs and ids over the whole vocabulary: at TP>1 every rank's
        top-k gathered, best first with exact ties by id, then the first k overall."""
        import torch
        import torch.distributed as dist

        if self.tp_size > 1 and part.target.shape[0] > 0:
            gathered_v = [torch.empty_like(part.top_values) for _ in range(self.tp_size)]
            gathered_i = [torch.empty_like(part.top_indices) for _ in range(self.tp_size)]
            dist.all_gather(gathered_v, part.top_values, group=self.tp_group)
            dist.all_gather(gathered_i, part.top_indices, group=self.tp_group)
            values, indices = ties_by_id(torch.cat(gathered_v, dim=1), torch.cat(gathered_i, dim=1))
            return values[:, :k] - lse[:, None], indices[:, :k]
        return ties_by_id(part.top_values, part.top_indices)


def _kept_rows(labels: torch.Tensor, hidden: torch.Tensor,
               inputs: HeadInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The hidden states, targets and candidates of the wanted positions, as rows in the hidden
    states' ``(s, b)`` order, and which positions they are (None: all). Row counts of the logits
    GEMM stay multiples of :data:`GEMM_ROWS` (zero rows, dropped again): a position's logits then
    never depend on how many positions share its micro-batch (see
    :mod:`podium.teacher.compute.microbatch`), and its answer is the same batched or alone."""
    import torch

    seq, batch, hidden_size = hidden.shape
    rows = hidden.reshape(seq * batch, hidden_size)
    targets = labels.t().reshape(seq * batch)
    cands = None
    if inputs.candidates is not None:
        c = inputs.candidates  # [b, s, C] -> rows in the hidden states' (s, b) order
        cands = c.transpose(0, 1).reshape(seq * batch, c.shape[-1]).to(rows.device)
    keep = None
    if inputs.wanted is not None:
        keep = inputs.wanted.t().reshape(seq * batch).nonzero().squeeze(1).to(rows.device)
        rows = rows.index_select(0, keep)
        targets = targets.index_select(0, keep)
        if cands is not None:
            cands = cands.index_select(0, keep)
    extra = -rows.shape[0] % GEMM_ROWS
    if extra:
        rows = torch.cat([rows, rows.new_zeros((extra, hidden_size))])
    return rows, targets, cands, keep


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
