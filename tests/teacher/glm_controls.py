"""Negative controls for GLM-4.5 (run as a script by test_group_glm.py; scaffold: ``controls.py``).

``python glm_controls.py OUT.json CHECKPOINT...``: two ranks at TP1·EP2 build each checkpoint's model
as podium does, and again with one of its features left out: the expert groups (plain top-k over
all experts), RoPE on the whole head instead of ``partial_rotary_factor`` of it, the routed scaling
factor. Rank 0 writes ``{checkpoint: {variant: largest logit difference from HF transformers}}``.
"""

from __future__ import annotations

import dataclasses
import sys

import controls

PARALLEL = {"expert_model_parallel_size": controls.WORLD}


def diffs(checkpoint: str, parallel: dict[str, int]) -> controls.Diffs:
    from podium.teacher.model.megatron_config import padded_vocab_size

    desc, ids, expected = controls.reference(checkpoint)
    padded = padded_vocab_size(desc.vocab_size, 1)
    variants = {
        "right": desc,
        "no_groups": dataclasses.replace(desc, moe_router_num_groups=0, moe_router_group_topk=0),
        "full_rotary": dataclasses.replace(desc, rotary_percent=1.0),
        "no_scale": dataclasses.replace(desc, moe_routed_scaling_factor=None),
    }
    result: controls.Diffs = {}
    for name, d in variants.items():
        model = controls.loaded(d, checkpoint, parallel, controls.expert_layout(padded, parallel))
        result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
