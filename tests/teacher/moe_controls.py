"""Negative controls for the MoE map (run as a script by test_group_moe.py).

``python moe_controls.py CHECKPOINT OUT.json``: two ranks at TP1·EP2 build the checkpoint's model
as podium does, three times: as podium loads it, with every rank taking experts from 0 (the EP
rank's offset forgotten), and with the router's ``norm_topk_prob`` read the wrong way round; rank 0
writes each one's largest logit difference from HF transformers. The right map must match and the
two wrong ones must not, or the oracle tests could not catch those mistakes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile


def _rank(rank: int, world: int, store: str, checkpoint: str, out: str) -> None:
    import torch
    from megatron.core import parallel_state

    from podium.teacher.checkpoint_loader import describe_model
    from podium.teacher.cuda_shims import apply_cuda_shims
    from podium.teacher.hf_checkpoint import RankLayout, load_hf_weights
    from podium.teacher.megatron_model import build_gpt_model, build_transformer_config, padded_vocab_size
    from podium.teacher.worker import destroy_parallel, init_parallel
    from podium.tiny import hf_oracle_logits, random_batch

    apply_cuda_shims()
    parallel = {"expert_model_parallel_size": world}
    init_parallel(rank, world, store, parallel)
    try:
        desc = describe_model(checkpoint)
        batch = random_batch(desc.vocab_size, [12, 12], seed=7)
        ids = batch["input_ids"]
        expected = hf_oracle_logits(checkpoint, ids, torch.full((2,), 13))  # every position valid
        padded = padded_vocab_size(desc.vocab_size, 1)
        ep_rank = parallel_state.get_expert_model_parallel_rank()
        variants = {
            "right": (desc, ep_rank),
            "no_ep_offset": (desc, 0),
            "router_flipped": (dataclasses.replace(desc, norm_topk_prob=not desc.norm_topk_prob), ep_rank),
        }
        diffs = {}
        for name, (d, rank_for_experts) in variants.items():
            config = build_transformer_config(d, parallel, "fp32")
            model = build_gpt_model(d, config, padded)
            layout = RankLayout(tp_rank=0, tp_size=1, padded_vocab_size=padded, ep_rank=rank_for_experts,
                                ep_size=world)
            load_hf_weights(model, checkpoint, d, layout)
            with torch.no_grad():
                logits = model(ids, torch.arange(ids.shape[1])[None].expand_as(ids), None)
            diffs[name] = float((logits[..., : desc.vocab_size].float() - expected).abs().max())
        if rank == 0:
            with open(out, "w") as fh:
                json.dump(diffs, fh)
    finally:
        destroy_parallel()


def main() -> int:
    import torch.multiprocessing as mp

    checkpoint, out = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="moe-controls-")
    mp.start_processes(_rank, args=(2, f"file://{tmp}/store", checkpoint, out), nprocs=2, join=True,
                       start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
