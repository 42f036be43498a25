"""What the endpoint and the launcher know of a worker group: the seam between serving and compute.

- :class:`GroupFacts`: the facts a group states once it is up (its vocabulary, the longest row it
  takes, the multiple a row's length is padded to, its data-parallel size and micro-batch budget,
  the checkpoint it loaded, its default temperature, its parallel layout). The endpoint sizes its
  batches and publishes its model info from them; the launcher's lifecycle fingerprints the
  tokenizer of ``checkpoint_path``.
- :class:`BatchStats`: what the group's last batch computed (the endpoint's metrics read it).
- :class:`ServedGroup`: what the endpoint serves: ``TeacherWorkerGroup``, or a test's or
  benchmark's stand-in. Every field is declared here, typed: a renamed field fails the type check
  (mypy) and the stand-ins, never a silent default.

Nothing here imports torch, Ray or megatron-core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from podium.protocol.batch import Batch
from podium.protocol.query import Query


@dataclass(frozen=True)
class GroupFacts:
    """A group's facts (see the module doc)."""

    vocab_size: int  # the checkpoint's vocabulary (not padded): ids are 0..vocab_size-1
    max_sequence_length: int | None = None  # the longest row the model takes (None: no bound)
    sequence_length_multiple: int = 1  # what TP/CP pad a row's length to (internal padding)
    data_parallel_size: int = 1
    max_tokens_per_microbatch: int | None = None  # the micro-batch token budget (None: the endpoint's default)
    checkpoint_path: str | None = None  # the checkpoint the group loaded (its tokenizer is the teacher's)
    temperature: float = 1.0  # the teacher's default temperature (its recipe's generation.temperature)
    parallel_sizes: Mapping[str, int] = field(default_factory=dict)  # tensor/pipeline/context/expert/... sizes
    hidden_size: int | None = None  # the hidden_states payload's width (None: not offered)
    hidden_states_refusal: str | None = None  # why hidden_states is refused (logits not output_layer(h))


@dataclass(frozen=True)
class BatchStats:
    """What one batch of the group computed: its rows and tokens, the micro-batches it ran and the
    token positions they computed (rows × bucket length: padding included), its seconds."""

    rows: int
    tokens: int
    microbatches: int
    computed_tokens: int
    seconds: float
    dp_tokens: tuple[int, ...] = ()  # the token positions each data-parallel copy of the model computed


@dataclass(frozen=True)
class RankLiveness:
    """One rank as the watch saw it: when its task of a call last returned (wall clock), and how
    long its task of the last call took."""

    rank: int
    where: str  # its node's address and its process: "127.0.0.12, pid 4242"
    last_forward_end: float | None = None
    last_call_seconds: float | None = None


@dataclass(frozen=True)
class Liveness:
    """What a group's watch knows now: how long the call computing has run (None: idle), why the
    watch fired (None: it has not), and each rank (:class:`RankLiveness`)."""

    call_age_s: float | None = None
    stuck: str | None = None
    ranks: tuple[RankLiveness, ...] = ()

    @property
    def slowest(self) -> RankLiveness | None:
        """The rank whose task of the last call took longest (None before any call)."""
        timed = [r for r in self.ranks if r.last_call_seconds is not None]
        return max(timed, key=lambda r: (r.last_call_seconds, -r.rank)) if timed else None


class ServedGroup(Protocol):
    """What the endpoint serves (see the module doc).

    ``compute`` takes a validated :class:`~podium.protocol.batch.Batch` and
    :class:`~podium.protocol.query.Query` (trusted: checked once, by the endpoint) and returns the
    query's outputs ``[rows, width, ...]``. ``broken``: ``None``, or why the group can serve no
    more (a worker died); the endpoint then answers not ready, and a failed batch 503.
    ``last_batch``: the stats of the group's last batch, or None. ``liveness``: what the group's
    watch of its calls knows (:class:`Liveness`; a stand-in without a watch says ``Liveness()``)."""

    @property
    def facts(self) -> GroupFacts: ...

    @property
    def broken(self) -> str | None: ...

    @property
    def last_batch(self) -> BatchStats | None: ...

    @property
    def liveness(self) -> Liveness: ...

    def compute(self, batch: Batch, query: Query) -> Mapping[str, Any]: ...
