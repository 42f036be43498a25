"""Where each position's answer goes, without processes: NeMo RL's alignment, the next-token
alignment of top-k logits and candidates, the CP split."""

from __future__ import annotations

import pytest
import torch

from podium.teacher.compute.alignment import cp_split, cp_unsplit, next_token_labels, next_token_outputs, to_nemo_rl


def test_next_token_outputs_are_logits_and_stop_before_the_last_token():
    lengths = torch.tensor([3, 1])
    topk = torch.full((2, 3, 2), -1.0)  # logprobs of two ids at each position
    lse = torch.full((2, 3), 4.0)
    out = next_token_outputs(lengths, topk_values=topk, topk_indices=torch.ones(2, 3, 2, dtype=torch.long), lse=lse,
                             candidate_logprobs=torch.full((2, 3, 1), -2.0))
    # position t describes the token after t: rows 0..length-2 only (a 1-token row has none)
    assert torch.equal(out["topk_logits"][0], torch.tensor([[3.0, 3.0], [3.0, 3.0], [0.0, 0.0]]))
    assert torch.all(out["topk_logits"][1] == 0) and torch.all(out["topk_logit_indices"][1] == 0)
    assert torch.equal(out["candidate_logprobs"][0, :, 0], torch.tensor([-2.0, -2.0, 0.0]))


def test_nemo_rl_alignment():
    ids = torch.tensor([[5, 6, 7, 8], [1, 2, 0, 0]])
    lengths = torch.tensor([4, 2])
    assert torch.equal(next_token_labels(ids), torch.tensor([[6, 7, 8, 0], [2, 0, 0, 0]]))
    per_position = torch.tensor([[-1.0, -2.0, -3.0, -9.0], [-4.0, -9.0, -9.0, -9.0]])
    out = to_nemo_rl(per_position, lengths)["logprobs"]
    assert torch.equal(out, torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -4.0, 0.0, 0.0]]))
    vals = per_position[..., None].repeat(1, 1, 2)
    idx = torch.ones(2, 4, 2, dtype=torch.long)
    shifted = to_nemo_rl(per_position, lengths, vals, idx)
    assert torch.equal(shifted["topk_indices"][1], torch.tensor([[0, 0], [1, 1], [0, 0], [0, 0]]))
    assert shifted["topk_logprobs"].dtype == torch.float32


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_cp_split_round_trip(cp):
    x = torch.arange(2 * 16).view(2, 16)
    pieces = [cp_split(x, cp, r) for r in range(cp)]
    if cp == 2:
        assert pieces[0][0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert torch.equal(cp_unsplit(pieces, cp), x)
