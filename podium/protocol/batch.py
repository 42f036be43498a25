"""The one validation of a ``get_logprobs`` batch: the rows a call sends (what it asks of them is a
:class:`~podium.protocol.query.Query`).

The endpoint runs :func:`validate_batch` once per request, before anything reaches the group; the
in-process group runs it for callers that hand it a plain mapping. A :class:`Batch` is the proof
that it ran: the group trusts one and checks nothing again. Every refusal is a :class:`BatchError`
whose message names the input, the row and the value at fault (the endpoint answers it with 400).

What a valid batch is: ``input_ids`` integer ``[B, S]`` with ``B, S ≥ 1``; ``input_lengths``
integer ``[B]`` with ``1 ≤ length ≤ S`` and ``≤ max_sequence_length``; every id in a row's first
``length`` positions inside ``0..vocab_size-1`` (what follows is padding, never looked at). The
:class:`Batch` holds the ids cut to the longest row, int64, padding set to 0 (causal: positions past
a row's length cannot change its logprobs; they come back as 0), and the caller's width ``S``, to
which the outputs are padded back.

Only numpy is imported; torch tensors and lists are accepted through :func:`as_int_array`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from podium.protocol.names import CANDIDATE_IDS, INPUT_IDS, INPUT_LENGTHS

MAX_CANDIDATES = 1024  # candidate ids per position a request may ask about

# Keys of a NeMo RL batch that cannot change a teacher's logit: accepted in a mapping and never
# sent (NeMo RL's distillation loop hands the teacher its whole train batch). Only these: any
# other key is refused by :func:`batch_inputs`, because dropping it could change the answer.
IGNORED_KEYS = frozenset({
    "token_mask", "sample_mask", "loss_multiplier",  # loss masks (NeMo RL's DistillationLossDataDict)
    "advantages", "baseline", "total_reward", "rewards",  # RL bookkeeping
    "prev_logprobs", "generation_logprobs", "reference_policy_logprobs", "teacher_reference_logprobs",
    "teacher_topk_logits", "teacher_topk_indices",  # answers of earlier calls
    "agent_ref", "idx", "task_name", "stop_strings", "extra_env_info", "length", "truncated",
})
# Keys that change the answer and that podium cannot serve: each refused with the reason.
REFUSED_KEYS = {
    "routed_experts": "router replay (MoE routing given by the caller) is not supported",
    "token_type_ids": "multimodal inputs are not supported: podium teachers are text-only",
    "mm_token_type_ids": "multimodal inputs are not supported: podium teachers are text-only",
    "imgs_sizes": "multimodal inputs are not supported: podium teachers are text-only",
    "num_frames": "multimodal inputs are not supported: podium teachers are text-only",
}


class BatchError(ValueError):
    """A batch or option the teacher refuses; the message says which input, row and value;
    ``param``: the request parameter it blames, where one is (a front names its own field for it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Batch:
    """A validated batch (see the module doc); build it with :func:`validate_batch`."""

    input_ids: np.ndarray  # int64 [B, longest], padding zeroed
    input_lengths: np.ndarray  # int64 [B]
    width: int  # S as sent: outputs are [B, width]
    candidate_ids: np.ndarray | None = None  # int64 [B, longest, C], 0 where not looked at

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.input_lengths.sum())

    @property
    def candidates(self) -> int | None:
        """C of ``candidate_ids [B, S, C]``, or None without them."""
        return None if self.candidate_ids is None else int(self.candidate_ids.shape[-1])

    def pad(self, array: Any) -> Any:
        """An output computed on the cut ids (``[B, longest, ...]``) padded with zeros to the caller's
        width (numpy or torch, as given): what a group returns for this batch."""
        missing = self.width - int(array.shape[1])
        if missing <= 0:
            return array
        if hasattr(array, "new_zeros"):  # torch
            import torch

            return torch.cat([array, array.new_zeros((array.shape[0], missing, *array.shape[2:]))], dim=1)
        return np.pad(array, [(0, 0), (0, missing)] + [(0, 0)] * (array.ndim - 2))


def as_int_array(value: Any, name: str) -> np.ndarray:
    """An integer numpy array from a torch tensor, numpy array or nested list (no copy when possible)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged lists
        raise BatchError(f"input {name!r} is not a regular array: {exc}") from None
    if array.dtype.kind not in "iu" or array.dtype == np.bool_:
        raise BatchError(f"input {name!r} must hold integer token ids, got dtype {array.dtype}")
    return array


def refused_key(key: str) -> str | None:
    """Why a batch key is refused (None: it is an input, or cannot change a logit)."""
    if key in (INPUT_IDS, INPUT_LENGTHS, CANDIDATE_IDS) or key in IGNORED_KEYS:
        return None
    if key in REFUSED_KEYS:
        return REFUSED_KEYS[key]
    if key.startswith("pixel_values") or key.endswith("_grid_thw"):
        return "multimodal inputs are not supported: podium teachers are text-only"
    return (f"not an input of podium's ({INPUT_IDS}, {INPUT_LENGTHS}, {CANDIDATE_IDS}) nor a key known not to "
            "change a logit (podium.protocol.batch.IGNORED_KEYS); it is not dropped silently: remove it")


def batch_inputs(data: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` and ``input_lengths`` of a NeMo RL-style mapping, as integer numpy arrays;
    a key that is neither an input nor in :data:`IGNORED_KEYS` is a :class:`BatchError` naming it."""
    if not isinstance(data, Mapping):  # a list iterates too: say what it is, not what its items are
        raise BatchError(f"batch must be a mapping with {INPUT_IDS!r} and {INPUT_LENGTHS!r}, "
                         f"got {type(data).__name__}")
    try:
        for key in data:
            reason = refused_key(str(key))
            if reason:
                raise BatchError(f"batch key {key!r} refused: {reason}")
        ids, lengths = data[INPUT_IDS], data[INPUT_LENGTHS]
    except KeyError as exc:
        raise BatchError(f"batch has no {exc.args[0]!r} (keys: {sorted(data)})") from None
    return as_int_array(ids, INPUT_IDS), as_int_array(lengths, INPUT_LENGTHS)


def validate_batch(ids: Any, lengths: Any, *, vocab_size: int,
                   max_sequence_length: int | None = None, candidate_ids: Any = None) -> Batch:
    """Check ``ids``/``lengths`` (and ``candidate_ids [B, S, C]``: ids whose logprobs are wanted at
    each position, next-token alignment) against the teacher; the :class:`Batch`."""
    ids = as_int_array(ids, INPUT_IDS)
    lengths = as_int_array(lengths, INPUT_LENGTHS)
    if ids.ndim != 2:
        raise BatchError(f"input {INPUT_IDS!r}: shape {list(ids.shape)} must be [B, S]")
    if lengths.ndim != 1:
        raise BatchError(f"input {INPUT_LENGTHS!r}: shape {list(lengths.shape)} must be [B]")
    batch, seq = ids.shape
    if lengths.shape[0] != batch:
        raise BatchError(f"shape mismatch: {INPUT_IDS} has B={batch} rows but {INPUT_LENGTHS} has {lengths.shape[0]}")
    if batch == 0 or seq == 0:
        raise BatchError(f"empty batch: {INPUT_IDS} has shape {list(ids.shape)}")
    lengths = lengths.astype(np.int64, copy=True)
    bad = np.flatnonzero((lengths < 1) | (lengths > seq))
    if bad.size:
        b = int(bad[0])
        raise BatchError(f"input_lengths out of range: input_lengths[{b}] = {int(lengths[b])} not in 1..{seq} "
                         f"(S = {seq}); {bad.size} bad row(s)")
    longest = int(lengths.max())
    if max_sequence_length is not None and longest > max_sequence_length:
        b = int(np.argmax(lengths))
        raise BatchError(f"input_lengths[{b}] = {longest} exceeds the teacher's max_sequence_length "
                         f"{max_sequence_length}")
    valid = np.arange(longest)[None, :] < lengths[:, None]
    cut = ids[:, :longest]
    lo, hi = int(cut.min()), int(cut.max())  # whole array first: cheap, and usually decides
    if lo < 0 or hi >= vocab_size:
        bad_ids = ((cut < 0) | (cut >= vocab_size)) & valid
        if bad_ids.any():
            rows, cols = np.nonzero(bad_ids)
            b, s = int(rows[0]), int(cols[0])
            raise BatchError(f"input_ids outside the vocabulary: input_ids[{b}, {s}] = {int(cut[b, s])} "
                             f"not in 0..{vocab_size - 1} ({rows.size} such token(s))")
    if bool(valid.all()) and cut.dtype == np.int64 and cut.flags.writeable and cut.flags.c_contiguous:
        clean = cut  # a writable int64 view of the caller's buffer: no copy
    else:
        clean = np.ascontiguousarray(cut, dtype=np.int64).copy()
        clean[~valid] = 0
    cands = None if candidate_ids is None else _candidates(candidate_ids, batch, seq, lengths, vocab_size)
    return Batch(clean, lengths, int(seq), cands)


def _candidates(raw: Any, batch: int, seq: int, lengths: np.ndarray, vocab_size: int) -> np.ndarray:
    """``candidate_ids`` checked at the positions that are computed (``t < length - 1``: the
    distribution of a next token that is in the row) and cut to the longest row; 0 elsewhere."""
    cands = as_int_array(raw, CANDIDATE_IDS)
    if cands.ndim != 3 or cands.shape[:2] != (batch, seq):
        raise BatchError(f"input {CANDIDATE_IDS!r}: shape {list(cands.shape)} must be [B, S, C] = "
                         f"[{batch}, {seq}, C] like {INPUT_IDS}")
    if not 1 <= cands.shape[2] <= MAX_CANDIDATES:
        raise BatchError(f"input {CANDIDATE_IDS!r}: C = {cands.shape[2]} ids per position not in 1..{MAX_CANDIDATES}")
    longest = int(lengths.max())
    cut = cands[:, :longest]
    used = (np.arange(longest)[None, :] < (lengths[:, None] - 1))[..., None]
    bad = ((cut < 0) | (cut >= vocab_size)) & used
    if bad.any():
        b, t, c = (int(x[0]) for x in np.nonzero(bad))
        raise BatchError(f"{CANDIDATE_IDS} outside the vocabulary: {CANDIDATE_IDS}[{b}, {t}, {c}] = "
                         f"{int(cut[b, t, c])} not in 0..{vocab_size - 1} ({int(bad.sum())} such id(s))")
    return np.where(used, cut, 0).astype(np.int64)
