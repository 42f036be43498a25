"""Real Megatron teacher groups (Ray, CPU/gloo, tiny checkpoints) shared by this package's modules:
one group per checkpoint for the whole package, each module putting its own servers in front."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.run import LLAMA, QWEN, make_group


@pytest.fixture(scope="package")
def llama_group(ray_cluster: Any, tiny_llama_checkpoint: Path) -> Iterator[Any]:
    group = make_group(tiny_llama_checkpoint, LLAMA)
    yield group
    group.shutdown()


@pytest.fixture(scope="package")
def qwen_group(ray_cluster: Any, tiny_qwen2_checkpoint: Path) -> Iterator[Any]:
    group = make_group(tiny_qwen2_checkpoint, QWEN)
    yield group
    group.shutdown()
