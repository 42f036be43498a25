"""Negative controls for the Nemotron-H map (run as a script by test_group_nemotron.py; scaffold:
``controls.py``).

``python nemotron_controls.py OUT.json CHECKPOINT``: two ranks at TP2 with expert-TP 2 (each routed
expert's MLP split over the two ranks) build the hybrid model as podium does, several times, and rank
0 writes ``{checkpoint: {variant: largest logit difference from HF transformers}}``:

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
import sys
from collections.abc import Callable
from typing import Any

import controls

PARALLEL = {"tensor_model_parallel_size": controls.WORLD, "expert_tensor_parallel_size": controls.WORLD}


def _variants(desc: Any, right: Any) -> dict[str, tuple[Any, Any]]:
    """variant -> (the description to build the model from, the map to load it with)."""

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

    return {"right": (desc, right), "in_proj_contiguous": (desc, contiguous_in_proj),
            "expert_bias_dropped": (dataclasses.replace(desc, moe_expert_bias=False), right),
            "latent_skipped": (desc, latent_skipped), "etp_unpaired": (desc, experts_as(own, other)),
            "etp_swapped": (desc, experts_as(other, other)), "etp_ignored": (desc, experts_as(whole, whole))}


def diffs(checkpoint: str, parallel: dict[str, int]) -> controls.Diffs:
    from megatron.core import parallel_state

    from podium.teacher.model.hf import RankLayout, load_hf_weights
    from podium.teacher.model.hf.registry import WEIGHT_MAPS
    from podium.teacher.model.hybrid_model import build_hybrid_model
    from podium.teacher.model.megatron_config import build_transformer_config, padded_vocab_size

    desc, ids, expected = controls.reference(checkpoint)
    tp = parallel["tensor_model_parallel_size"]
    padded = padded_vocab_size(desc.vocab_size, tp)
    layout = RankLayout(tp_rank=parallel_state.get_tensor_model_parallel_rank(), tp_size=tp, padded_vocab_size=padded,
                        etp_rank=parallel_state.get_expert_tensor_parallel_rank(),
                        etp_size=parallel_state.get_expert_tensor_parallel_world_size())
    right = WEIGHT_MAPS["nemotron_h"]
    result: controls.Diffs = {}
    for name, (d, source) in _variants(desc, right).items():
        model = build_hybrid_model(d, build_transformer_config(d, parallel, "fp32"), padded)
        WEIGHT_MAPS["nemotron_h"] = source
        try:
            load_hf_weights(model, checkpoint, d, layout)
        except ValueError as exc:  # a map the loader refuses (etp_ignored): its message
            result[name] = f"refused: {exc}"
            continue
        finally:
            WEIGHT_MAPS["nemotron_h"] = right
        result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
