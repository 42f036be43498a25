"""What :class:`podium.teacher.compute.head.LogprobHead` reads of a model, for tests of the head
without Megatron: an ``output_layer`` holding ``weight`` (this rank's vocabulary rows) and a
``forward`` the head wraps to capture the hidden states."""

from __future__ import annotations

from typing import Any


class OutputLayer:
    def __init__(self, weight: Any) -> None:
        self.weight = weight
        self.forward: Any = None


class HeadModel:
    """A model that is its output layer only."""

    def __init__(self, weight: Any) -> None:
        self.output_layer = OutputLayer(weight)
