"""podium.teacher.model.hf: HF checkpoints read directly into a Megatron-core model, each rank
reading only its slices of the safetensors (no conversion, nothing written next to the checkpoint).

A checkpoint's ``config.json`` gives its :class:`ModelDescription` (``describe_hf_config``); its
tensors are read lazily, a slice at a time (:class:`SafetensorsCheckpoint`); ``load_hf_weights``
fills a rank's model, asking the family's weight map, for each Megatron parameter, for the rank's
slice (:class:`RankLayout`) of the HF tensor(s) it comes from. Nothing here imports torch,
safetensors or megatron at import time.

A new family takes: its architectures in :data:`podium.config.checkpoints.ARCHITECTURE_FAMILIES`,
a describer in ``description._DESCRIBERS``, a module with its map (HF names -> Megatron local-spec
names, built from the slices of ``slices.SliceReader``) and that map in ``registry.WEIGHT_MAPS``.
"""

from __future__ import annotations

from podium.teacher.model.hf.description import ModelDescription, describe_hf_config
from podium.teacher.model.hf.safetensors_io import SafetensorsCheckpoint
from podium.teacher.model.hf.slices import RankLayout
from podium.teacher.model.hf.weights import load_hf_weights

__all__ = ["ModelDescription", "RankLayout", "SafetensorsCheckpoint", "describe_hf_config", "load_hf_weights"]
