"""Negative controls for the MoE map (run as a script by test_group_moe.py; scaffold: ``controls.py``).

``python moe_controls.py OUT.json CHECKPOINT...``: two ranks at TP1·EP2 build each checkpoint's
model as podium does, several times: as podium loads it, with every rank taking experts from 0
(the EP rank's offset forgotten), with the router's ``norm_topk_prob`` read the wrong way round,
and, for a model with a gated shared expert (Qwen2-MoE), with the gate left out and with the gate
applied without its sigmoid. Rank 0 writes ``{checkpoint: {variant: largest logit difference from
HF transformers}}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

import controls

PARALLEL = {"expert_model_parallel_size": controls.WORLD}


@contextlib.contextmanager
def _gate_without_sigmoid() -> Iterator[None]:
    """Megatron's shared expert scaled by the gate's logit instead of its sigmoid."""
    import torch
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP

    original = SharedExpertMLP.forward

    def forward(self: Any, hidden_states: Any) -> Any:
        output, _ = MLP.forward(self, hidden_states)
        return output * torch.nn.functional.linear(hidden_states, self.gate_weight)

    SharedExpertMLP.forward = forward
    try:
        yield
    finally:
        SharedExpertMLP.forward = original


def diffs(checkpoint: str, parallel: dict[str, int]) -> controls.Diffs:
    from megatron.core import parallel_state

    from podium.teacher.model.hf import RankLayout, load_hf_weights
    from podium.teacher.model.megatron_config import build_transformer_config, padded_vocab_size
    from podium.teacher.model.megatron_model import build_gpt_model

    desc, ids, expected = controls.reference(checkpoint)
    padded = padded_vocab_size(desc.vocab_size, 1)
    ep_rank, ep_size = parallel_state.get_expert_model_parallel_rank(), parallel["expert_model_parallel_size"]
    variants: dict[str, tuple[Any, int, Any]] = {
        "right": (desc, ep_rank, contextlib.nullcontext),
        "no_ep_offset": (desc, 0, contextlib.nullcontext),
        "router_flipped": (dataclasses.replace(desc, norm_topk_prob=not desc.norm_topk_prob), ep_rank,
                           contextlib.nullcontext),
    }
    if desc.moe_shared_expert_gate:
        variants["shared_gate_left_out"] = (dataclasses.replace(desc, moe_shared_expert_gate=False), ep_rank,
                                            contextlib.nullcontext)
        variants["shared_gate_without_sigmoid"] = (desc, ep_rank, _gate_without_sigmoid)
    result: controls.Diffs = {}
    for name, (d, rank_for_experts, patch) in variants.items():
        model = build_gpt_model(d, build_transformer_config(d, parallel, "fp32"), padded)
        layout = RankLayout(tp_rank=0, tp_size=1, padded_vocab_size=padded, ep_rank=rank_for_experts, ep_size=ep_size)
        load_hf_weights(model, checkpoint, d, layout)
        with patch():
            result[name] = controls.logit_diff(model, ids, expected, desc.vocab_size)
    return result


if __name__ == "__main__":
    sys.exit(controls.main(diffs, PARALLEL))
