"""How a batch's rows become forward micro-batches: length buckets, a token budget, DP balance.

One rule for every caller of the group (the endpoint's batcher, an in-process trainer, a
benchmark), planned on the driver so that every rank of a data-parallel replica runs the same
micro-batches:

- each row runs at its **bucket length** (:func:`bucket_length`), a function of its own length
  only: a multiple of 4, at most 1/8 more than the row from 32 tokens on (8 buckets per
  octave), rounded up to the layout's ``seq_multiple``. Rows share a micro-batch only with rows of the same bucket, so
  a row is computed with the same shapes whoever it is batched with — the answer of a request is
  the same batched or alone, bit for bit on CPU in fp32 (token counts stay multiples of
  :data:`GEMM_ROWS`; the logprob head pads its GEMMs the same way). Not across MoE layers: how
  many tokens an expert gets depends on the company;
- rows of a bucket fill micro-batches of at most ``max_tokens`` bucketed tokens (at least one row
  each; a row longer than the budget runs alone) and at most ``max_rows`` rows;
- micro-batches go to the data-parallel replicas longest-first, each to the replica with the
  fewest tokens so far (balanced token loads, not equal row counts). With ``lockstep`` (experts
  sharded across the replicas: every forward is a collective over them) every replica runs the
  same number of micro-batches; the short ones get a one-row filler whose answer is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# This BLAS computes a row of a GEMM with fewer than 12 rows, except 4 and 8, by another kernel
# (another summation order): GEMMs whose row count is a multiple of this never take it.
GEMM_ROWS = 4
MIN_BUCKET = GEMM_ROWS
OCTAVE_SHIFT = 3  # 2**3 = 8 buckets per octave: a row runs at most 1/8 longer than it is


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def bucket_length(length: int, seq_multiple: int = 1) -> int:
    """The length a row of ``length`` tokens runs at (a function of the row alone)."""
    length = max(int(length), 1)
    octave = length.bit_length() - 1  # floor(log2(length))
    step = max(MIN_BUCKET, 1 << max(0, octave - OCTAVE_SHIFT))
    return round_up(round_up(length, step), max(1, int(seq_multiple)))


@dataclass(frozen=True)
class MicroBatch:
    """Rows (indices into the batch; ``-1`` for a filler row) run at ``seq_len``."""

    rows: tuple[int, ...]
    seq_len: int

    @property
    def tokens(self) -> int:
        return len(self.rows) * self.seq_len


def plan_microbatches(lengths: Sequence[int], max_tokens: int, *, max_rows: int | None = None,
                      seq_multiple: int = 1) -> list[MicroBatch]:
    """Rows grouped by bucket (longest first, then by row index) into budget-sized micro-batches."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    buckets = [bucket_length(n, seq_multiple) for n in lengths]
    order = sorted(range(len(buckets)), key=lambda i: (-buckets[i], i))
    plan: list[MicroBatch] = []
    current: list[int] = []
    for i in order:
        seq = buckets[i]
        full = current and (buckets[current[0]] != seq or (len(current) + 1) * seq > max_tokens
                            or (max_rows is not None and len(current) >= max_rows))
        if full:
            plan.append(MicroBatch(tuple(current), buckets[current[0]]))
            current = []
        current.append(i)
    if current:
        plan.append(MicroBatch(tuple(current), buckets[current[0]]))
    return plan


def assign_replicas(plan: Sequence[MicroBatch], replicas: int, *, lockstep: bool = False,
                    seq_multiple: int = 1) -> list[list[MicroBatch]]:
    """The micro-batches of each data-parallel replica (see the module doc)."""
    shards: list[list[MicroBatch]] = [[] for _ in range(replicas)]
    loads = [0] * replicas
    for mb in sorted(plan, key=lambda m: -m.tokens):  # stable: equal loads keep the plan's order
        d = min(range(replicas), key=lambda r: (loads[r], len(shards[r]), r))
        shards[d].append(mb)
        loads[d] += mb.tokens
    if lockstep:
        most = max(len(s) for s in shards)
        filler = MicroBatch((-1,), bucket_length(1, seq_multiple))
        for shard in shards:
            shard.extend([filler] * (most - len(shard)))
    return shards


def computed_tokens(shards: Sequence[Sequence[MicroBatch]]) -> int:
    """Token positions the replicas compute (rows × bucket length, fillers included)."""
    return sum(mb.tokens for shard in shards for mb in shard)
