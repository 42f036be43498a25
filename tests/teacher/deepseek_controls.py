"""Negative controls for DeepSeek-V3 (run as a script by test_group_deepseek.py; scaffold: ``controls.py``).

``python deepseek_controls.py OUT.json CHECKPOINT...``: two ranks at TP1·EP2 build each checkpoint's
model as podium does, and again with one of its features left out. A checkpoint with YaRN
(``tiny_deepseek_v3``): the plain RoPE instead of YaRN, YaRN without ``mscale_all_dim`` (the softmax
scale and the rotary concentration of 1), the expert groups, the routed scaling factor. A checkpoint
whose rotary dims are stored as halves (``tiny_deepseek_v3_qproj``): its rotary rows not interleaved
on load. Rank 0 writes ``{checkpoint: {variant: largest logit difference from HF transformers}}``.
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
    variants = {"right": desc}
    if desc.rope_scaling:
        variants.update(
            no_yarn=dataclasses.replace(desc, rope_scaling=None),
            no_mscale_all_dim=dataclasses.replace(desc, rope_scaling={**desc.rope_scaling, "mscale": 1.0,
                                                                      "mscale_all_dim": 0.0}),
            no_groups=dataclasses.replace(desc, moe_router_num_groups=0, moe_router_group_topk=0),
            no_scale=dataclasses.replace(desc, moe_routed_scaling_factor=None),
        )
    if not desc.rope_interleave:
        variants["halves_not_interleaved"] = dataclasses.replace(desc, rope_interleave=True)
    result: controls.Diffs = {}
    for name, d in variants.items():
        model = controls.loaded(d, checkpoint, parallel, controls.expert_layout(padded, parallel))
        result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
