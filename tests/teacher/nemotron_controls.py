"""Negative controls for the Nemotron-H map (run as a script by test_group_nemotron.py).

``python nemotron_controls.py OUT.json CHECKPOINT``: two ranks at TP2 with expert-TP 2 (each routed
expert's MLP split over the two ranks) build the hybrid model as podium does, several times, and rank
0 writes ``{variant: largest logit difference from HF transformers}``. The right map must match and
every wrong one must not, or the oracle tests could not catch those mistakes:

- ``right``: as podium loads it;
- ``in_proj_contiguous``: the Mamba ``in_proj`` split over TP as contiguous rows instead of part by
  part (``[z | x | B | C | dt]`` each split);
- ``expert_bias_dropped``: the router's ``e_score_correction_bias`` not used to pick experts;
- ``latent_skipped``: the latent projections left at zero (the routed experts add nothing);
- ``etp_unpaired``: each rank's expert ``down_proj`` columns from the other rank's half (a rank's
  ``fc1`` rows and ``fc2`` columns are no longer the same hidden units);
- ``etp_swapped`` (not a mistake): both halves from the other rank — still paired, so right: the
  halves' order does not matter, their pairing does;
- ``etp_ignored``: the experts read whole, as if expert-TP were 1: the loader refuses the shape (the
  value is its message, ``refused: ...``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable
from typing import Any

PARALLEL = {"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 2}


def _diffs(checkpoint: str, parallel: dict[str, int]) -> dict[str, float | str]:
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from podium.apps.tiny_models import hf_oracle_logits, random_batch
    from podium.teacher.model.checkpoint_loader import describe_model
    from podium.teacher.model.hf import RankLayout, load_hf_weights
    from podium.teacher.model.hf.registry import WEIGHT_MAPS
    from podium.teacher.model.hybrid_model import build_hybrid_model
    from podium.teacher.model.megatron_config import build_transformer_config, padded_vocab_size

    desc = describe_model(checkpoint)
    batch = random_batch(desc.vocab_size, [12, 12], seed=7)
    ids = batch["input_ids"]
    expected = hf_oracle_logits(checkpoint, ids, torch.full((2,), 13))  # every position valid
    tp = parallel["tensor_model_parallel_size"]
    padded = padded_vocab_size(desc.vocab_size, tp)
    layout = RankLayout(tp_rank=parallel_state.get_tensor_model_parallel_rank(), tp_size=tp, padded_vocab_size=padded,
                        etp_rank=parallel_state.get_expert_tensor_parallel_rank(),
                        etp_size=parallel_state.get_expert_tensor_parallel_world_size())
    right = WEIGHT_MAPS["nemotron_h"]

    def contiguous_in_proj(r: Any, layer: int | None, local: str) -> Any:
        if local == "mixer.in_proj.weight":
            name = f"backbone.layers.{layer}.mixer.in_proj.weight"
            return r.ckpt.read(name, rows=r.part(r.ckpt.shape(name)[0]))
        return right(r, layer, local)

    def latent_skipped(r: Any, layer: int | None, local: str) -> Any:
        tensor = right(r, layer, local)
        return tensor * 0 if local.endswith("_latent_proj.weight") else tensor

    def experts_as(fc1: Callable[[Any], Any], fc2: Callable[[Any], Any]) -> Any:
        """The right map, but the routed experts' fc1 / fc2 read for the expert-TP coordinates
        ``fc1(layout)`` / ``fc2(layout)``."""
        def source(r: Any, layer: int | None, local: str) -> Any:
            if ".local_experts." not in local:
                return right(r, layer, local)
            moved = (fc1 if "linear_fc1" in local else fc2)(r.lay)
            return right(type(r)(r.ckpt, r.desc, moved), layer, local)
        return source

    def own(lay: Any) -> Any:
        return lay

    def other(lay: Any) -> Any:
        return dataclasses.replace(lay, etp_rank=lay.etp_size - 1 - lay.etp_rank)

    def whole(lay: Any) -> Any:
        return dataclasses.replace(lay, etp_rank=0, etp_size=1)

    variants = {"right": (desc, right), "in_proj_contiguous": (desc, contiguous_in_proj),
                "expert_bias_dropped": (dataclasses.replace(desc, moe_expert_bias=False), right),
                "latent_skipped": (desc, latent_skipped), "etp_unpaired": (desc, experts_as(own, other)),
                "etp_swapped": (desc, experts_as(other, other)), "etp_ignored": (desc, experts_as(whole, whole))}
    diffs: dict[str, float | str] = {}
    for name, (d, source) in variants.items():
        model = build_hybrid_model(d, build_transformer_config(d, parallel, "fp32"), padded)
        WEIGHT_MAPS["nemotron_h"] = source
        try:
            load_hf_weights(model, checkpoint, d, layout)
        except ValueError as exc:  # a map the loader refuses (etp_ignored): its message
            diffs[name] = f"refused: {exc}"
            continue
        finally:
            WEIGHT_MAPS["nemotron_h"] = right
        with torch.no_grad():
            logits = model(ids, torch.arange(ids.shape[1])[None].expand_as(ids), None)
        logits = gather_from_tensor_model_parallel_region(logits.transpose(0, 1).contiguous()).transpose(0, 1)
        diffs[name] = float((logits[..., : desc.vocab_size].float() - expected).abs().max())
    return diffs


def _rank(rank: int, world: int, store: str, checkpoint: str, out: str) -> None:
    from podium.teacher.compute.worker import destroy_parallel, init_parallel
    from podium.teacher.cpu.cuda_shims import apply_cuda_shims

    apply_cuda_shims()
    init_parallel(rank, world, store, PARALLEL)
    try:
        result = _diffs(checkpoint, PARALLEL)
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
