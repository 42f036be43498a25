"""The one validation of a ``get_logprobs`` batch and its options.

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

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from podium.protocol.names import INPUT_IDS, INPUT_LENGTHS, MICRO_BATCH_SIZE, TOP_K
from podium.protocol.oip import brief


class BatchError(ValueError):
    """A batch or option the teacher refuses; the message says which input, row and value."""


@dataclass(frozen=True)
class Batch:
    """A validated batch (see the module doc); build it with :func:`validate_batch`."""

    input_ids: np.ndarray  # int64 [B, longest], padding zeroed
    input_lengths: np.ndarray  # int64 [B]
    width: int  # S as sent: outputs are [B, width]

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.input_lengths.sum())

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


def batch_inputs(data: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` and ``input_lengths`` of a NeMo RL-style mapping, as integer numpy arrays."""
    try:
        ids, lengths = data[INPUT_IDS], data[INPUT_LENGTHS]
    except KeyError as exc:
        raise BatchError(f"batch has no {exc.args[0]!r} (keys: {sorted(data)})") from None
    except TypeError:
        raise BatchError(f"batch must be a mapping with {INPUT_IDS!r} and {INPUT_LENGTHS!r}, "
                         f"got {type(data).__name__}") from None
    return as_int_array(ids, INPUT_IDS), as_int_array(lengths, INPUT_LENGTHS)


def validate_batch(ids: Any, lengths: Any, *, vocab_size: int,
                   max_sequence_length: Optional[int] = None) -> Batch:
    """Check ``ids``/``lengths`` against the teacher (see the module doc); the :class:`Batch`."""
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
    return Batch(clean, lengths, int(seq))


def _int_option(value: Any, name: str, lo: int, hi: Optional[int]) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise BatchError(f"parameter {name!r} must be an integer, got {brief(value)}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise BatchError(f"parameter {name!r} = {value} is out of range ({bound})")
    return value


def validate_options(*, top_k: Any = None, micro_batch_size: Any = None,
                     vocab_size: int, max_top_k: Optional[int] = None) -> tuple[Optional[int], Optional[int]]:
    """``(top_k, micro_batch_size)`` checked: ``top_k`` in ``1..min(max_top_k, vocab)``,
    ``micro_batch_size ≥ 1``; ``None`` means not asked for."""
    limit = min(max_top_k, vocab_size) if max_top_k else vocab_size
    return (_int_option(top_k, TOP_K, 1, limit),
            _int_option(micro_batch_size, MICRO_BATCH_SIZE, 1, None))
