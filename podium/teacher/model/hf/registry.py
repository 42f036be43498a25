"""Which weight map reads each family's HF tensors.

This module owns :data:`WEIGHT_MAPS`, family (the values of
:data:`podium.config.checkpoints.ARCHITECTURE_FAMILIES`) -> its map (a :data:`.slices.WeightMap`).
``load_hf_weights`` looks the map up here at each load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podium.teacher.model.hf.deepseek_v3 import deepseek_v3_sources
from podium.teacher.model.hf.dense import gpt2_sources, llama_sources
from podium.teacher.model.hf.gemma3 import gemma3_sources
from podium.teacher.model.hf.gpt_oss import gpt_oss_sources
from podium.teacher.model.hf.nemotron_h import nemotron_h_sources

if TYPE_CHECKING:  # pragma: no cover
    from podium.teacher.model.hf.slices import WeightMap

WEIGHT_MAPS: dict[str, WeightMap] = {
    "llama": llama_sources,
    "glm4_moe": llama_sources,  # Llama-style names; its MoE layers as the Llama family's (moe.py)
    "deepseek_v3": deepseek_v3_sources,  # multi-latent attention; the rest as the Llama family's
    "gemma3": gemma3_sources,
    "gpt_oss": gpt_oss_sources,  # the Llama names + sinks, a biased router, fused (or MXFP4) experts
    "gpt2": gpt2_sources,
    "nemotron_h": nemotron_h_sources,
}
