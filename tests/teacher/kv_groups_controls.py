"""Negative controls for fewer KV groups than TP (run as a script by test_kv_groups.py; scaffold:
``controls.py``).

``python kv_groups_controls.py OUT.json CHECKPOINT...``: two ranks at TP2 build each checkpoint's
model (one KV group each) as podium does, then with the fused QKV sliced wrongly:

- ``old_slicing``: the rule for whole groups per rank (``groups // TP`` of them: none here), as the
  loader did before it knew this case; the slices are empty, which the loader refuses (an empty
  slice once loaded as zeros, like a missing bias);
- ``split_per_projection``: q, k and v each cut in TP parts and stacked ``[q_r; k_r; v_r]`` (the
  right shape, not Megatron's rows).

Rank 0 writes ``{checkpoint: {variant: largest logit difference from HF transformers, or the
loader's error}}``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import controls

PARALLEL = {"tensor_model_parallel_size": controls.WORLD}


def _old_slicing(self: Any, read: Callable[[int, slice], Any]) -> Any:
    from podium.teacher.model.hf.slices import fuse_qkv

    d, lay = self.desc, self.lay
    per = d.num_query_groups // lay.tp_size
    g0, g1 = lay.tp_rank * per, (lay.tp_rank + 1) * per
    qpg, hd = d.num_attention_heads // d.num_query_groups, d.head_dim
    q = read(0, slice(g0 * qpg * hd, g1 * qpg * hd))
    return fuse_qkv(q, read(1, slice(g0 * hd, g1 * hd)), read(2, slice(g0 * hd, g1 * hd)), g1 - g0, qpg, hd)


def _split_per_projection(self: Any, read: Callable[[int, slice], Any]) -> Any:
    import torch

    d, lay = self.desc, self.lay
    sizes = (d.num_attention_heads * d.head_dim, d.num_query_groups * d.head_dim, d.num_query_groups * d.head_dim)
    parts = []
    for part, total in enumerate(sizes):
        per = total // lay.tp_size
        parts.append(read(part, slice(lay.tp_rank * per, (lay.tp_rank + 1) * per)))
    return torch.cat(parts)


@contextlib.contextmanager
def _qkv_as(method: Callable[..., Any] | None) -> Iterator[None]:
    from podium.teacher.model.hf.slices import SliceReader

    original = SliceReader.qkv
    if method is not None:
        SliceReader.qkv = method  # type: ignore[method-assign]  # the control swaps the slicing
    try:
        yield
    finally:
        SliceReader.qkv = original  # type: ignore[method-assign]


def diffs(checkpoint: str, parallel: dict[str, int]) -> controls.Diffs:
    from megatron.core import parallel_state

    from podium.teacher.model.hf import RankLayout, load_hf_weights
    from podium.teacher.model.megatron_config import build_transformer_config, padded_vocab_size
    from podium.teacher.model.megatron_model import build_gpt_model

    desc, ids, expected = controls.reference(checkpoint)
    assert desc.num_query_groups == 1, desc
    tp, rank = parallel["tensor_model_parallel_size"], parallel_state.get_tensor_model_parallel_rank()
    padded = padded_vocab_size(desc.vocab_size, tp)
    layout = RankLayout(tp_rank=rank, tp_size=tp, padded_vocab_size=padded)
    result: controls.Diffs = {}
    variants = (("right", None), ("old_slicing", _old_slicing), ("split_per_projection", _split_per_projection))
    for name, method in variants:
        model = build_gpt_model(desc, build_transformer_config(desc, parallel, "fp32"), padded)
        try:
            with _qkv_as(method):
                load_hf_weights(model, checkpoint, desc, layout)
        except ValueError as exc:
            result[name] = str(exc)
            continue
        result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
