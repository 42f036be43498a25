"""The head's label rank (``HeadCall.want_rank``, the ``target_rank`` output): 1 + the ids whose
logit is larger than the label's, at TP1 and at TP2 (two gloo processes, each a vocabulary slice),
equal to counting on the full ``log_softmax``; the alignment shift to NeMo RL's convention."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from harness.head_model import HeadModel

from podium.teacher.compute.alignment import shifted_ranks
from podium.teacher.compute.head import HeadCall, HeadInputs, LogprobHead

SEQ, BATCH, HIDDEN, VOCAB, PADDED = 6, 3, 8, 13, 16






def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(PADDED, HIDDEN, generator=gen)
    weight[VOCAB:] = 100.0  # padding rows never count
    hidden = torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return weight, hidden, labels


def _expected(weight: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    ref = torch.log_softmax(hidden @ weight[:VOCAB].t() / temperature, dim=-1).transpose(0, 1)  # [b, s, v]
    own = ref.gather(-1, labels[..., None])
    return (ref > own).sum(-1) + 1


def _run(head: LogprobHead, weight: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor,
         call: HeadCall, wanted: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    model = HeadModel(weight)
    head.install(model)
    out, _ = model.output_layer.forward(hidden)
    with head.serving(call, [HeadInputs(wanted=wanted)]):
        return model.compute_language_model_loss(labels, out)


def test_rank_at_tp1_counts_larger_logits() -> None:
    weight, hidden, labels = _inputs()
    for temperature, chunk in ((1.0, 7), (0.7, 1 << 20)):
        head = LogprobHead(VOCAB, None, 0, 1, chunk_elements=chunk)
        out = _run(head, weight, hidden, labels, HeadCall(temperature=temperature, want_rank=True))
        assert torch.equal(out["rank"], _expected(weight, hidden, labels, temperature))
    wanted = torch.ones(BATCH, SEQ, dtype=torch.bool)
    wanted[:, -2:] = False
    out = _run(LogprobHead(VOCAB, None, 0, 1), weight, hidden, labels, HeadCall(want_rank=True), wanted)
    assert torch.equal(out["rank"][:, :-2], _expected(weight, hidden, labels, 1.0)[:, :-2])
    assert not out["rank"][:, -2:].any()  # positions not wanted are 0
    assert "rank" not in _run(LogprobHead(VOCAB, None, 0, 1), weight, hidden, labels, HeadCall())


def _tp_rank(rank: int, store: str, queue: mp.Queue) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        weight, hidden, labels = _inputs()
        head = LogprobHead(VOCAB, dist.group.WORLD, rank, 2, chunk_elements=7)
        out = _run(head, weight[rank * PADDED // 2:(rank + 1) * PADDED // 2], hidden, labels,
                   HeadCall(temperature=0.7, top_k=3, want_rank=True))
        queue.put((rank, out["rank"].tolist()))  # plain lists: no shared memory to outlive the process
    finally:
        dist.destroy_process_group()


def test_rank_at_tp2_equals_tp1(tmp_path: Path) -> None:
    # a file store, not a port chosen then freed: another test's process can take that port first
    store = str(tmp_path / "store")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_tp_rank, args=(r, store, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    weight, hidden, labels = _inputs()
    expected = _expected(weight, hidden, labels, 0.7)
    assert got[0] == expected.tolist() and got[1] == expected.tolist()


def test_shifted_ranks_follow_logprobs_alignment() -> None:
    ranks = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
    out = shifted_ranks(ranks, torch.tensor([3, 4]))
    assert out.tolist() == [[0, 5, 6, 0], [0, 1, 2, 3]]
