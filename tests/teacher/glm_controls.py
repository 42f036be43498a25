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
    from megatron.core import parallel_state

    from podium.teacher.model.hf import RankLayout, load_hf_weights
    from podium.teacher.model.megatron_config import build_transformer_config, padded_vocab_size
    from podium.teacher.model.megatron_model import build_gpt_model

    desc, ids, expected = controls.reference(checkpoint)
    padded = padded_vocab_size(desc.vocab_size, 1)
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    variants = {
        "right": desc,
        "no_groups": dataclasses.replace(desc, moe_router_num_groups=0, moe_router_group_topk=0),
        "full_rotary": dataclasses.replace(desc, rotary_percent=1.0),
        "no_scale": dataclasses.replace(desc, moe_routed_scaling_factor=None),
    }
    result: controls.Diffs = {}
    for name, d in variants.items():
        model = build_gpt_model(d, build_transformer_config(d, parallel, "fp32"), padded)
        layout = RankLayout(tp_rank=0, tp_size=1, padded_vocab_size=padded, ep_rank=ep_rank,
                            ep_size=parallel["expert_model_parallel_size"])
        load_hf_weights(model, checkpoint, d, layout)
        result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
