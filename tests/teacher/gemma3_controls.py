"""Negative controls for Gemma 3 (run as a script by test_group_gemma3.py; scaffold: ``controls.py``).

``python gemma3_controls.py OUT.json CHECKPOINT...``: two ranks at TP2 build each checkpoint's model as
podium does, and again with one of Gemma's pieces left out: the window on every layer (megatron's
default, what podium's attention did before), the sliding layers on the global RoPE base (no
``local_rope``), the embedding unscaled (no ``embedding_scale``), the default softmax scale
(``query_pre_attn_scalar`` ignored), the global RoPE without its linear scaling. Rank 0 writes
``{checkpoint: {variant: largest logit difference from HF transformers}}``.
"""

from __future__ import annotations

import dataclasses
import sys

import controls

PARALLEL = {"tensor_model_parallel_size": controls.WORLD}


def diffs(checkpoint: str, parallel: dict[str, int]) -> controls.Diffs:
    from megatron.core import parallel_state

    from podium.teacher.model.hf import RankLayout
    from podium.teacher.model.megatron_config import padded_vocab_size

    desc, ids, expected = controls.reference(checkpoint)
    tp = parallel["tensor_model_parallel_size"]
    padded = padded_vocab_size(desc.vocab_size, tp)
    variants = {
        "right": desc,
        "window_on_every_layer": desc,
        "no_local_rope": dataclasses.replace(desc, local_rotary_base=desc.rotary_base),
        "no_embedding_scale": dataclasses.replace(desc, embedding_scale=None),
        "default_softmax_scale": dataclasses.replace(desc, softmax_scale=None),
        "no_rope_scaling": dataclasses.replace(desc, rope_scaling=None),
    }
    result: controls.Diffs = {}
    layout = RankLayout(parallel_state.get_tensor_model_parallel_rank(), tp, padded)
    for name, d in variants.items():
        model = controls.loaded(d, checkpoint, parallel, layout, window_on_every_layer=name == "window_on_every_layer")
        result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
