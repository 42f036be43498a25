"""What one rank of a teacher reports once it is set up: :class:`RankInfo`, typed.

Each worker returns one from ``TeacherWorker.setup`` (it crosses Ray pickled); the group reads its
layout (which rank answers each data-parallel replica) and states its facts
(:class:`~podium.teacher.seam.GroupFacts`) from rank 0's. Tests and benchmarks read the rest
(where each rank runs, what it loaded, how long it took).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RankInfo:
    """One rank's place in its group, and what it loaded."""

    rank: int
    node_ip: str
    pid: int
    tp_rank: int
    pp_rank: int
    cp_rank: int
    dp_rank: int
    dp_size: int
    ep_rank: int
    etp_rank: int
    is_output: bool  # the rank whose answer its replica's rows come back in (last stage, TP 0, CP 0)
    checkpoint_kind: str  # "hf" or "torch_dist"
    checkpoint_path: str  # what it loaded (a hub id resolved to its snapshot)
    architecture: str
    vocab_size: int
    padded_vocab_size: int
    max_position_embeddings: int
    sequence_length_multiple: int  # what CP requires of a micro-batch's length
    load_seconds: float
    setup_seconds: float
    torch_threads: int
    device: str
    parameters_bytes: int
    load_stats: Mapping[str, Any] = field(default_factory=dict)
    cuda_shims: tuple[str, ...] = ()
    hidden_size: int | None = None  # the width of the hidden_states payload
    hidden_states_refusal: str | None = None  # why this teacher cannot offer hidden_states (payload.py)
