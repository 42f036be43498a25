"""Which layer spec the hybrid (Nemotron-H) model is built with: ``hybrid_model.choose_hybrid_spec``.

CUDA cannot run here, so the choice is tested as a function of what the machine has (CUDA,
TransformerEngine, the Mamba kernels), and the wiring by making this process look like a CUDA node
without the kernels: the build stops with the error that names them, before anything is built. The
TE spec's structure (megatron's own, with ``SequentialMLP`` experts and the checkpoint's conv width)
is checked on its spec objects; building it needs TransformerEngine on CUDA (not run here).
"""

from __future__ import annotations

import functools
import importlib.machinery
import sys
import types
from typing import Any

import pytest
import torch
from mamba_shim_scenarios import CONFIG as SCENARIO_CONFIG

from podium.config.architecture import MAMBA_KERNELS
from podium.teacher.model import hybrid_model
from podium.teacher.model.hybrid_model import (
    LOCAL_SPEC,
    TE_SPEC,
    MambaKernelsMissing,
    choose_hybrid_spec,
    missing_mamba_kernels,
)

CONFIG = {**SCENARIO_CONFIG, "conv_kernel": 3}  # the tiny hybrid of the shim scenarios, an odd conv width
INSTALL = "pip install --no-build-isolation mamba-ssm causal-conv1d"


@pytest.mark.parametrize(("cuda", "te", "missing", "chosen"), [
    (False, False, list(MAMBA_KERNELS), LOCAL_SPEC),  # CPU: the local spec and the shims, kernels or not
    (False, True, [], LOCAL_SPEC),
    (True, True, [], TE_SPEC),  # a GPU node with TE and both kernels: megatron's TE spec
    (True, False, [], LOCAL_SPEC),  # CUDA without TE: the local spec, as for the transformer families
])
def test_the_spec_chosen_for_what_the_machine_has(cuda: bool, te: bool, missing: list[str], chosen: str) -> None:
    assert choose_hybrid_spec(cuda=cuda, transformer_engine=te, missing_kernels=missing) == chosen


@pytest.mark.parametrize("missing", [["mamba-ssm"], ["causal-conv1d"], list(MAMBA_KERNELS)])
@pytest.mark.parametrize("te", [True, False])
def test_on_cuda_a_missing_kernel_is_named_with_the_pip_command(missing: list[str], te: bool) -> None:
    with pytest.raises(MambaKernelsMissing) as err:
        choose_hybrid_spec(cuda=True, transformer_engine=te, missing_kernels=missing, where="/opt/venv/bin/python")
    text = str(err.value)
    assert "/opt/venv/bin/python cannot import" in text and f"`{INSTALL}`" in text
    for package in MAMBA_KERNELS:  # the missing ones by package and module name, only those
        assert (f"{package} (import {package.replace('-', '_')})" in text) == (package in missing), text


def test_missing_kernels_are_found_by_their_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mamba_ssm", None)  # hidden: cannot import
    present = types.ModuleType("causal_conv1d")
    present.__spec__ = importlib.machinery.ModuleSpec("causal_conv1d", None)
    monkeypatch.setitem(sys.modules, "causal_conv1d", present)
    assert missing_mamba_kernels() == ["mamba-ssm"]
    monkeypatch.setitem(sys.modules, "mamba_ssm", types.ModuleType("mamba_ssm"))
    sys.modules["mamba_ssm"].__spec__ = importlib.machinery.ModuleSpec("mamba_ssm", None)
    assert missing_mamba_kernels() == []


def test_a_cuda_build_without_the_kernels_stops_before_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """build_hybrid_model on a (pretended) CUDA node without mamba-ssm / causal-conv1d: the error that
    names them and the interpreter, not a failure deep inside megatron's Mamba mixer."""
    from podium.teacher.model.hf import describe_hf_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for package in MAMBA_KERNELS:
        monkeypatch.setitem(sys.modules, package.replace("-", "_"), None)
    desc = describe_hf_config(CONFIG)
    with pytest.raises(MambaKernelsMissing, match=r"cannot import mamba-ssm \(import mamba_ssm\), causal-conv1d"):
        hybrid_model.build_hybrid_model(desc, None, 128)  # type: ignore[arg-type]  # never reached
    with pytest.raises(MambaKernelsMissing, match=sys.executable.replace(".", r"\.")):
        hybrid_model.hybrid_spec_here()


def _parts(spec: Any) -> tuple[Any, Any]:
    """(module, submodules) of a spec: a ``ModuleSpec`` (megatron-core 0.16) or a builder (a
    ``functools.partial`` of the module with its submodules, 0.19)."""
    if isinstance(spec, functools.partial):
        return spec.func, spec.keywords["submodules"]
    return spec.module, spec.submodules


@pytest.mark.megatron
def test_the_te_spec_is_megatrons_with_sequential_experts_and_the_checkpoints_conv(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from podium.teacher.cpu.mamba_shims import apply_mamba_shims
    from podium.teacher.model.hf import describe_hf_config

    apply_mamba_shims()  # megatron's Mamba modules import triton at import time (shimmed where absent)
    from megatron.core.extensions import transformer_engine as te
    from megatron.core.extensions import transformer_engine_spec_provider as provider
    from megatron.core.models.mamba.mamba_layer_specs import mamba_stack_spec
    from megatron.core.transformer.moe.experts import SequentialMLP

    # TE's classes are placeholders here; the TE spec's experts ask TE's version (>= 1.7 on a GPU node)
    monkeypatch.setattr(provider, "is_te_min_version", lambda *_, **__: True)

    desc = describe_hf_config(CONFIG)
    megatrons_moe = mamba_stack_spec.submodules.moe_layer.submodules.mlp
    spec = hybrid_model.te_hybrid_stack_spec(desc)
    sub = spec.submodules
    assert spec.module is mamba_stack_spec.module
    mixer = sub.mamba_layer.submodules.mixer
    assert mixer.params["d_conv"] == 3 and mixer.submodules.in_proj is te.TELayerNormColumnParallelLinear
    assert sub.attention_layer is mamba_stack_spec.submodules.attention_layer  # TE attention, unchanged
    assert sub.moe_layer.submodules.pre_mlp_layernorm is te.TENorm
    experts, experts_sub = _parts(_parts(sub.moe_layer.submodules.mlp)[1].experts)
    assert experts is SequentialMLP and experts_sub.linear_fc1 is te.TEColumnParallelLinear
    # megatron's own spec object is left as it was (its experts, the default conv)
    assert mamba_stack_spec.submodules.moe_layer.submodules.mlp is megatrons_moe
    assert "d_conv" not in mamba_stack_spec.submodules.mamba_layer.submodules.mixer.params
