"""Negative controls for the MoE map (run as a script by test_group_moe.py).

``python moe_controls.py OUT.json CHECKPOINT...``: two ranks at TP1·EP2 build each checkpoint's
model as podium does, several times: as podium loads it, with every rank taking experts from 0
(the EP rank's offset forgotten), with the router's ``norm_topk_prob`` read the wrong way round,
and, for a model with a gated shared expert (Qwen2-MoE), with the gate left out and with the gate
applied without its sigmoid. Rank 0 writes ``{checkpoint: {variant: largest logit difference from
HF transformers}}``. The right map must match and every wrong one must not, or the oracle tests
could not catch those mistakes. One pair of processes serves every checkpoint (the imports are
most of the cost).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import tempfile
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def _gate_without_sigmoid() -> Iterator[None]:
    """Megatron's shared expert scaled by the gate's logit instead of its sigmoid."""
    import torch
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP

    original = SharedExpertMLP.forward

    def forward(self: Any, hidden_states: Any) -> Any:
        output, _ = MLP.forward(self, hidden_states)
        return output * torch.nn.functional.linear(hidden_states, self.gate_weight)

    SharedExpertMLP.forward = forward
    try:
        yield
    finally:
        SharedExpertMLP.forward = original


def _diffs(checkpoint: str, parallel: dict[str, int], world: int) -> dict[str, float]:
    import torch
    from megatron.core import parallel_state

    from podium.apps.tiny_models import hf_oracle_logits, random_batch
    from podium.teacher.model.checkpoint_loader import describe_model
    from podium.teacher.model.hf import RankLayout, load_hf_weights
    from podium.teacher.model.megatron_config import build_transformer_config, padded_vocab_size
    from podium.teacher.model.megatron_model import build_gpt_model

    desc = describe_model(checkpoint)
    batch = random_batch(desc.vocab_size, [12, 12], seed=7)
    ids = batch["input_ids"]
    expected = hf_oracle_logits(checkpoint, ids, torch.full((2,), 13))  # every position valid
    padded = padded_vocab_size(desc.vocab_size, 1)
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    variants: dict[str, tuple[Any, int, Any]] = {
        "right": (desc, ep_rank, contextlib.nullcontext),
        "no_ep_offset": (desc, 0, contextlib.nullcontext),
        "router_flipped": (dataclasses.replace(desc, norm_topk_prob=not desc.norm_topk_prob), ep_rank,
                           contextlib.nullcontext),
    }
    if desc.moe_shared_expert_gate:
        variants["shared_gate_left_out"] = (dataclasses.replace(desc, moe_shared_expert_gate=False), ep_rank,
                                            contextlib.nullcontext)
        variants["shared_gate_without_sigmoid"] = (desc, ep_rank, _gate_without_sigmoid)
    diffs = {}
    for name, (d, rank_for_experts, patch) in variants.items():
        config = build_transformer_config(d, parallel, "fp32")
        model = build_gpt_model(d, config, padded)
        layout = RankLayout(tp_rank=0, tp_size=1, padded_vocab_size=padded, ep_rank=rank_for_experts, ep_size=world)
        load_hf_weights(model, checkpoint, d, layout)
        with torch.no_grad(), patch():
            logits = model(ids, torch.arange(ids.shape[1])[None].expand_as(ids), None)
        diffs[name] = float((logits[..., : desc.vocab_size].float() - expected).abs().max())
    return diffs


def _rank(rank: int, world: int, store: str, checkpoints: list[str], out: str) -> None:
    from podium.teacher.compute.worker import destroy_parallel, init_parallel
    from podium.teacher.cpu.cuda_shims import apply_cuda_shims

    apply_cuda_shims()
    parallel = {"expert_model_parallel_size": world}
    init_parallel(rank, world, store, parallel)
    try:
        result = {checkpoint: _diffs(checkpoint, parallel, world) for checkpoint in checkpoints}
        if rank == 0:
            with open(out, "w") as fh:
                json.dump(result, fh)
    finally:
        destroy_parallel()


def main() -> int:
    import torch.multiprocessing as mp

    out, checkpoints = sys.argv[1], sys.argv[2:]
    tmp = tempfile.mkdtemp(prefix="moe-controls-")
    mp.start_processes(_rank, args=(2, f"file://{tmp}/store", checkpoints, out), nprocs=2, join=True,
                       start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
