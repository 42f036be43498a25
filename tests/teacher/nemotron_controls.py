"""Negative controls for the Nemotron-H map (run as a script by test_group_nemotron.py).

``python nemotron_controls.py OUT.json CHECKPOINT``: two ranks at TP2 build the hybrid model as
podium does, several times: as podium loads it; with the Mamba ``in_proj`` split over TP as
contiguous rows instead of part by part (``[z | x | B | C | dt]`` each split); with the router's
expert bias dropped (``e_score_correction_bias`` not used to pick experts); with the latent
projections skipped (left at zero: the routed experts add nothing). Rank 0 writes ``{variant:
largest logit difference from HF transformers}``. The right map must match and every wrong one must
not, or the oracle tests could not catch those mistakes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from typing import Any


def _diffs(checkpoint: str, parallel: dict[str, int]) -> dict[str, float]:
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from podium.teacher.checkpoint_loader import describe_model
    from podium.teacher.hf import RankLayout, load_hf_weights, weights
    from podium.teacher.hybrid_model import build_hybrid_model
    from podium.teacher.megatron_config import build_transformer_config, padded_vocab_size
    from podium.tiny import hf_oracle_logits, random_batch

    desc = describe_model(checkpoint)
    batch = random_batch(desc.vocab_size, [12, 12], seed=7)
    ids = batch["input_ids"]
    expected = hf_oracle_logits(checkpoint, ids, torch.full((2,), 13))  # every position valid
    tp = parallel["tensor_model_parallel_size"]
    padded = padded_vocab_size(desc.vocab_size, tp)
    layout = RankLayout(tp_rank=parallel_state.get_tensor_model_parallel_rank(), tp_size=tp, padded_vocab_size=padded)
    right = weights._MAPS["nemotron_h"]

    def contiguous_in_proj(r: Any, layer: int | None, local: str) -> Any:
        if local == "mixer.in_proj.weight":
            name = f"backbone.layers.{layer}.mixer.in_proj.weight"
            return r.ckpt.read(name, rows=r.part(r.ckpt.shape(name)[0]))
        return right(r, layer, local)

    def latent_skipped(r: Any, layer: int | None, local: str) -> Any:
        tensor = right(r, layer, local)
        return tensor * 0 if local.endswith("_latent_proj.weight") else tensor

    variants = {"right": (desc, right), "in_proj_contiguous": (desc, contiguous_in_proj),
                "expert_bias_dropped": (dataclasses.replace(desc, moe_expert_bias=False), right),
                "latent_skipped": (desc, latent_skipped)}
    diffs = {}
    for name, (d, source) in variants.items():
        model = build_hybrid_model(d, build_transformer_config(d, parallel, "fp32"), padded)
        weights._MAPS["nemotron_h"] = source
        try:
            load_hf_weights(model, checkpoint, d, layout)
        finally:
            weights._MAPS["nemotron_h"] = right
        with torch.no_grad():
            logits = model(ids, torch.arange(ids.shape[1])[None].expand_as(ids), None)
        logits = gather_from_tensor_model_parallel_region(logits.transpose(0, 1).contiguous()).transpose(0, 1)
        diffs[name] = float((logits[..., : desc.vocab_size].float() - expected).abs().max())
    return diffs


def _rank(rank: int, world: int, store: str, checkpoint: str, out: str) -> None:
    from podium.teacher.cuda_shims import apply_cuda_shims
    from podium.teacher.worker import destroy_parallel, init_parallel

    apply_cuda_shims()
    parallel = {"tensor_model_parallel_size": world}
    init_parallel(rank, world, store, parallel)
    try:
        result = _diffs(checkpoint, parallel)
        if rank == 0:
            with open(out, "w") as fh:
                json.dump(result, fh)
    finally:
        destroy_parallel()


def main() -> int:
    import torch.multiprocessing as mp

    out, checkpoint = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp(prefix="nemotron-controls-")
    mp.start_processes(_rank, args=(2, f"file://{tmp}/store", checkpoint, out), nprocs=2, join=True,
                       start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
