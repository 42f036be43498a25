"""Negative controls for gpt-oss (run as a script by test_group_gpt_oss.py; scaffold: ``controls.py``).

``python gpt_oss_controls.py OUT.json CHECKPOINT[=ORACLE]...``: two ranks at TP1·EP2 (two experts each) build
each checkpoint's model as podium does, and again with one of its features left out: no attention
sinks (megatron's plain softmax), the window on every layer, plain RoPE instead of YaRN, the SwiGLU
unclamped, without its ``+1`` on the up projection, the router's bias zeroed. Rank 0 writes
``{checkpoint: {variant: largest logit difference from HF transformers}}``; podium's own build at
EP2 is the ``right`` variant. ``CHECKPOINT=ORACLE``: HF runs ``ORACLE`` (an MXFP4 checkpoint's
dequantized copy: transformers needs accelerate to read MXFP4) and only ``right`` is built.
"""

from __future__ import annotations

import dataclasses
import sys

import controls

PARALLEL = {"expert_model_parallel_size": controls.WORLD}


def diffs(argument: str, parallel: dict[str, int]) -> controls.Diffs:
    import torch

    from podium.teacher.model.checkpoint_loader import describe_model
    from podium.teacher.model.megatron_config import padded_vocab_size

    checkpoint, _, oracle = argument.partition("=")
    _, ids, expected = controls.reference(oracle or checkpoint)
    desc = describe_model(checkpoint)
    padded = padded_vocab_size(desc.vocab_size, 1)
    variants = {
        "right": desc,
        "no_sinks": dataclasses.replace(desc, attention_sinks=False),
        "window_on_every_layer": desc,
        "no_yarn": dataclasses.replace(desc, position_embedding_type="rope", rope_scaling=None),
        "no_clamp": dataclasses.replace(desc, activation_clamp=None),
        "no_glu_offset": dataclasses.replace(desc, glu_linear_offset=0.0),
        "no_router_bias": desc,
    }
    if oracle:
        variants = {"right": desc}
    result: controls.Diffs = {}
    layout = controls.expert_layout(padded, parallel)
    for name, d in variants.items():
        try:
            model = controls.loaded(d, checkpoint, parallel, layout,
                                    window_on_every_layer=name == "window_on_every_layer")
        except ValueError as exc:  # e.g. sinks with nowhere to go
            result[name] = str(exc)
            continue
        if name == "no_router_bias":
            with torch.no_grad():
                for module_name, param in model.named_parameters():
                    if module_name.endswith("router.bias"):
                        param.zero_()
        result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
