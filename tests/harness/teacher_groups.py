"""What the teacher tests share: a real worker group started for a test, and its comparisons with the
HF oracle.

Expensive things are shared: the Ray cluster is per session (``ray_cluster``), tiny checkpoints are
per session (``tests/fixtures/checkpoints.py``), and each test module keeps one group per layout in
module-scoped fixtures built with :func:`start_group`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures.checkpoints import hf_oracle_log_softmax, hf_oracle_logits, hf_oracle_logprobs, random_batch

from podium.config.spec import TeacherSpec

TOL = 1e-4  # fp32, max abs difference against HF transformers

# Ragged right-padded batches (lengths include 1 and full width; odd batch sizes exercise DP padding).
RAGGED_LENGTHS = (7, 16, 1, 11, 16, 2, 9)


def teacher_cfg(checkpoint: Path | str, nodes: int = 1, per_node: int = 1, tp: int = 1, pp: int = 1,
                **extra: Any) -> TeacherSpec:
    name = f"{Path(str(checkpoint)).name}-tp{tp}pp{pp}"
    fields: dict[str, Any] = dict(key=f"test-tp{tp}-pp{pp}", name=name, aliases=(name,), model_name=str(checkpoint),
                                  num_nodes=nodes, gpus_per_node=per_node, tensor_model_parallel_size=tp,
                                  pipeline_model_parallel_size=pp, precision="fp32", micro_batch_size=2)
    fields.update(extra)
    return TeacherSpec(**fields)


def start_group(checkpoint: Path | str, **layout: Any) -> Iterator[Any]:
    """Generator for a module-scoped fixture: a group, shut down at the end of the module."""
    from podium.teacher.compute.group import TeacherWorkerGroup

    group = TeacherWorkerGroup(teacher_cfg(checkpoint, **layout))
    try:
        yield group
    finally:
        shut_down_and_check(group)


def shut_down_and_check(group: Any) -> None:
    """``group.shutdown()`` and what it must have done (it returns True on every path, so its
    value proves nothing): the placement group is removed, every worker actor is gone, a second
    shutdown is harmless and the group refuses further calls."""
    import ray

    pg = group._placement_group
    actors = list(group._actors)
    assert pg is not None and actors, "the group holds no placement group or workers before shutdown"
    group.shutdown()
    group.shutdown()  # harmless when repeated
    assert ray.util.placement_group_table()[pg.id.hex()]["state"] == "REMOVED"
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.info.remote(), timeout=60)
    with pytest.raises(RuntimeError, match="shut down"):
        group.get_logprobs(random_batch(group.facts.vocab_size, [2]))


def ragged_batch(vocab_size: int, lengths: tuple[int, ...] = RAGGED_LENGTHS, seed: int = 0,
                 width: int | None = None) -> dict[str, torch.Tensor]:
    return random_batch(vocab_size, list(lengths), seq_len=width, seed=seed)


def assert_matches_oracle(group: Any, checkpoint: Path | str, batch: dict[str, torch.Tensor], top_k: int | None = None,
                          **kw: Any) -> dict[str, torch.Tensor]:
    """Logprobs (and top-k logprobs) = the oracle's, at the call's temperature or else the teacher's."""
    out = group.get_logprobs(batch, top_k=top_k, **kw)
    temperature = kw.get("temperature") or group.spec.temperature
    expected = hf_oracle_logprobs(checkpoint, batch["input_ids"], batch["input_lengths"], temperature)
    got = out["logprobs"]
    assert got.dtype == torch.float32 and got.shape == batch["input_ids"].shape
    diff = (got - expected).abs().max().item()
    assert diff <= TOL, f"max abs diff vs HF {diff:.3g} > {TOL}"
    # convention: position 0 and padding are exactly 0
    lengths = batch["input_lengths"]
    pad = torch.arange(got.shape[1])[None, :] >= lengths[:, None]
    assert torch.all(got[:, 0] == 0) and torch.all(got[pad] == 0)
    if top_k:
        assert_topk_matches(out, checkpoint, batch, top_k, temperature)
    return out


def assert_topk_matches(out: dict[str, torch.Tensor], checkpoint: Path | str, batch: dict[str, torch.Tensor], k: int,
                        temperature: float = 1.0) -> None:
    logsm = hf_oracle_log_softmax(checkpoint, batch["input_ids"], batch["input_lengths"], temperature)
    ref_vals, ref_idx = torch.topk(logsm, k, dim=-1)
    vals, idx = out["topk_logprobs"], out["topk_indices"]
    assert vals.dtype == torch.float32 and idx.dtype == torch.int32  # narrowed on the device (index_dtype)
    assert vals.shape == idx.shape == (*batch["input_ids"].shape, k)
    lengths = batch["input_lengths"]
    valid = torch.arange(vals.shape[1])[None, :] < lengths[:, None]
    valid[:, 0] = False
    assert (vals[valid] - ref_vals[valid]).abs().max().item() <= TOL
    assert torch.equal(idx[valid], ref_idx[valid])
    assert torch.all(vals[~valid] == 0) and torch.all(idx[~valid] == 0)
    # the target token's logprob, where it is in the top-k, equals logprobs
    hit = (idx == batch["input_ids"][..., None]) & valid[..., None]
    lp = out["logprobs"][..., None].expand_as(vals)
    assert torch.allclose(vals[hit], lp[hit], atol=1e-5)


NEXT_TOKEN_OUTPUTS = ("logprobs", "topk_logits", "topk_logit_indices", "candidate_logprobs")


def assert_next_token_outputs_match(group: Any, checkpoint: Path | str, batch: dict[str, torch.Tensor], k: int,
                                    temperature: float, n_candidates: int = 3, seed: int = 0) -> None:
    """NeMo RL's ``get_topk_logits`` form and candidate logprobs = the oracle's, in one call:
    ``topk_logits`` = ``torch.topk`` of ``z / T`` at every position ``t < length - 1`` (the token
    after ``t``), ids included; ``candidate_logprobs`` = ``log_softmax(z / T)`` of random ids there;
    zeros from ``length - 1`` on; and ``logprobs`` at the same temperature."""
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    gen = torch.Generator().manual_seed(seed)
    cands = torch.randint(0, group.facts.vocab_size, (*ids.shape, n_candidates), generator=gen)
    out = group.get_logprobs(batch, top_k=k, temperature=temperature, outputs=NEXT_TOKEN_OUTPUTS, candidate_ids=cands)
    assert set(out) == set(NEXT_TOKEN_OUTPUTS)
    logits = hf_oracle_logits(checkpoint, ids, lengths, temperature)
    ref_vals, ref_idx = torch.topk(logits, k, dim=-1)
    vals, idx = out["topk_logits"], out["topk_logit_indices"]
    assert vals.dtype == torch.float32 and idx.dtype == torch.int32 and vals.shape == (*ids.shape, k)
    valid = torch.arange(ids.shape[1])[None, :] < (lengths[:, None] - 1)
    assert (vals[valid] - ref_vals[valid]).abs().max().item() <= TOL
    assert torch.equal(idx[valid], ref_idx[valid])
    assert torch.all(vals[~valid] == 0) and torch.all(idx[~valid] == 0)
    ref_cand = torch.log_softmax(logits, dim=-1).gather(-1, cands)
    got = out["candidate_logprobs"]
    assert got.shape == cands.shape and (got[valid] - ref_cand[valid]).abs().max().item() <= TOL
    assert torch.all(got[~valid] == 0)
    expected = hf_oracle_logprobs(checkpoint, ids, lengths, temperature)
    assert (out["logprobs"] - expected).abs().max().item() <= TOL
