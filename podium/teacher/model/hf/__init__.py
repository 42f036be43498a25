"""podium.teacher.model.hf: HF checkpoints read directly into a Megatron-core GPTModel, each rank reading
only its slices.

Modules (none imports torch, safetensors or megatron at import time):

- ``description``: :class:`ModelDescription`, what podium needs to know about an architecture,
  and ``describe_hf_config``, which reads it from ``config.json`` (one describer per family);
- ``safetensors_io``: :class:`SafetensorsCheckpoint`, a directory's tensors (single file or sharded
  index) read lazily, only the requested rows/columns;
- ``weights``: :class:`RankLayout` and ``load_hf_weights``, the HF -> Megatron name/layout map of
  each family and the rank's slice of every tensor, copied into its model.

A new family takes: its architectures in :data:`podium.config.checkpoints.ARCHITECTURE_FAMILIES`,
a describer in ``description._DESCRIBERS`` and a map in ``weights._MAPS``.
"""

from __future__ import annotations

from podium.teacher.model.hf.description import ModelDescription, describe_hf_config
from podium.teacher.model.hf.safetensors_io import SafetensorsCheckpoint
from podium.teacher.model.hf.weights import RankLayout, load_hf_weights

__all__ = ["ModelDescription", "RankLayout", "SafetensorsCheckpoint", "describe_hf_config", "load_hf_weights"]
