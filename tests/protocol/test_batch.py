"""Batch validation, the rule defined once for the client and the teacher: cut to the longest row,
padding zeroed, every bad batch named; candidate ids checked where they are used."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from podium.protocol.batch import BatchError, batch_inputs, validate_batch


def test_batch_is_cut_to_the_longest_row_with_padding_zeroed() -> None:
    ids = np.array([[5, 6, 7, 9, 9], [8, 999, -1, 9, 9]])  # past each length: anything, even out of vocab
    batch = validate_batch(ids, [3, 1], vocab_size=10)
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]] and batch.width == 5
    assert batch.input_ids.dtype == np.int64 and batch.tokens == 4 and batch.rows == 2


def test_a_full_int64_batch_is_not_copied() -> None:
    ids = np.arange(12, dtype=np.int64).reshape(3, 4) % 7
    batch = validate_batch(ids, np.array([4, 4, 4]), vocab_size=7)
    assert np.shares_memory(batch.input_ids, ids)


@pytest.mark.parametrize(("ids", "lengths", "message"), [
    ([[1, 2]], [3], r"input_lengths\[0\] = 3 not in 1..2"),
    ([[1, 2]], [0], r"input_lengths\[0\] = 0 not in 1..2"),
    ([[1, 12]], [2], r"input_ids\[0, 1\] = 12 not in 0..9"),
    ([[1, -2]], [2], r"input_ids\[0, 1\] = -2"),
    ([1, 2], [2], r"shape \[2\] must be \[B, S\]"),
    ([[1, 2]], [2, 2], "shape mismatch"),
    (np.zeros((0, 3), int), np.zeros(0, int), "empty batch"),
    ([[1.5, 2.0]], [2], "must hold integer token ids, got dtype float64"),
    ([[1, 2]] * 2, [[2, 2]], r"shape \[1, 2\] must be \[B\]"),
])
def test_every_bad_batch_names_what_is_wrong(ids, lengths, message) -> None:
    with pytest.raises(BatchError, match=message):
        validate_batch(np.asarray(ids), np.asarray(lengths), vocab_size=10)


def test_torch_inputs() -> None:
    ids, lengths = batch_inputs({"input_ids": torch.tensor([[1, 2]]), "input_lengths": torch.tensor([2])})
    assert ids.dtype == np.int64 and lengths.tolist() == [2]
    with pytest.raises(BatchError, match="batch has no 'input_lengths'"):
        batch_inputs({"input_ids": ids})
    with pytest.raises(BatchError, match="exceeds the teacher's max_sequence_length 1"):
        validate_batch(ids, lengths, vocab_size=10, max_sequence_length=1)


def test_candidate_ids_are_checked_where_they_are_computed() -> None:
    ids = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    cands = np.zeros((2, 4, 2), dtype=np.int64)
    cands[0, 3] = 999  # position 3 of row 0 (length 3) is never computed: anything goes there
    batch = validate_batch(ids, [3, 2], vocab_size=10, candidate_ids=cands)
    assert batch.candidate_ids.shape == (2, 3, 2) and not batch.candidate_ids[0, 2:].any()
    cands[1, 0, 1] = 10
    with pytest.raises(BatchError, match=r"candidate_ids\[1, 0, 1\] = 10 not in 0..9"):
        validate_batch(ids, [3, 2], vocab_size=10, candidate_ids=cands)
    with pytest.raises(BatchError, match=r"shape \[2, 4\] must be \[B, S, C\] = \[2, 4, C\]"):
        validate_batch(ids, [3, 2], vocab_size=10, candidate_ids=cands[..., 0])
