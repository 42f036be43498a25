"""What differs, for podium, between the megatron-core releases it supports: the one place to look.

This module owns the names podium reaches in megatron-core that changed between releases; the
builders, shims and weight maps ask it instead of testing versions themselves. Tested in CI (.ci/run):
0.16.1 on Python 3.11, and the newest release (0.19.x, which needs Python 3.12) in a second lane.
0.17 and 0.18 were read, not run.

=========================  ===============================  ==========================================
what                       0.16, 0.17                       from 0.18 (conv1d: from 0.19)
=========================  ===============================  ==========================================
hybrid model class         ``models.mamba.MambaModel``      ``models.hybrid.HybridModel`` (the old
                           (``mamba_stack_spec=``)          name is a deprecated subclass that logs a
                                                            warning; ``hybrid_stack_spec=``)
hybrid stack + submodules  ``ssm.mamba_block.MambaStack``   ``models.hybrid.hybrid_block.HybridStack``
module whose ``TENorm``    ``ssm.mamba_block``              ``models.hybrid.hybrid_block``
builds the final norm                                       (``ssm.mamba_block`` re-exports it: patching
                                                            the re-export changes nothing)
``te_general_gemm`` in     undefined without TE (podium's   from 0.17: defined as ``None`` without TE
``moe_utils``              ``te_general_gemm`` shim)        (the shim is not needed)
MLA's ``HAVE_TE``          True without TE (it imports      from 0.17: TransformerEngine's own
(``multi_latent_attention``) megatron's TE extension, whose ``HAVE_TE`` (podium's ``mla_have_te``
                           classes are mocks there: the      shim is not needed)
                           ``isinstance`` on them fails;
                           podium's ``mla_have_te`` shim)
Mamba conv parameters      ``mixer.conv1d.{weight,bias}``   0.19: ``mixer.conv1d_weight``,
(state-dict names)         (an ``nn.Conv1d``)               ``mixer.conv1d_bias`` (direct parameters;
                                                            distributed-checkpoint keys stay
                                                            ``conv1d.weight``)
the layer pattern and its  ``hybrid_override_pattern=``     from 0.17: ``hybrid_layer_pattern=``, in
pipeline stages (PP > 1)   (0.16); ``MambaStack`` gives     which ``|`` marks the stages
                           stage p layers                   (``MEM|*-E``); the old name, or a pattern
                           ``[p·L/PP, (p+1)·L/PP)`` of the  without ``|``, is still split that even
                           ``L`` (``|`` is not a symbol)    way, with a logged deprecation
a layer spec's ``mlp`` (the   a ``ModuleSpec`` (its            0.19: ``functools.partial(MLP.as_mlp_
local GPT spec)             ``submodules``)                  submodule, submodules=...)`` (0.17, 0.18
                                                            not read): :func:`mlp_submodules`
=========================  ===============================  ==========================================

Both split a Nemotron-H pattern the same way: ``L/PP`` consecutive layers per stage (podium needs
``PP`` to divide ``L``: ``config.architecture`` refuses it at plan time, the worker's layout check
again); podium writes the ``|`` of that even split where the release reads them. MTP layers (``/``
in a Megatron pattern; ``mtp.*`` and ``mtp_hybrid_override_pattern`` in an HF checkpoint, apart from
the main pattern) are never built for a teacher, so no stage holds one.

Not a difference podium needs to bridge: 0.17+ need Python 3.12; 0.19 imports ``triton`` from
``import megatron.core`` (the CUDA torch wheel, the only one PyPI has for 3.12, brings it and it
imports without a GPU), so the ``triton_tensor_ops`` Mamba shim does not apply there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Any

TE_GEMM_NAME_DEFINED = (0, 17)  # moe_utils defines te_general_gemm = None without TransformerEngine
MLA_HAVE_TE_FIXED = (0, 17)  # multi_latent_attention takes HAVE_TE from the TE extension (False without TE)
PATTERN_PIPES = (0, 17)  # hybrid_override_pattern -> hybrid_layer_pattern, where '|' marks the PP stages
HYBRID_RENAMED = (0, 18)  # MambaModel/MambaStack -> HybridModel/HybridStack, models.hybrid package
CONV1D_PARAMETERS = (0, 19)  # the Mamba mixer's nn.Conv1d -> conv1d_weight/conv1d_bias parameters


def _installed_version() -> tuple[int, ...]:
    try:
        text = importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:  # a launcher-only install
        return ()
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else ()


MEGATRON_VERSION: tuple[int, ...] = _installed_version()
"""The installed megatron-core as (major, minor, patch); ``()`` where it is not installed."""


def shims_not_needed() -> frozenset[str]:
    """podium's CPU shims (``cuda_shims``) that this release does not need: they are not applied, and
    ``tests/teacher/test_cuda_shims.py`` checks that their scenario works without them."""
    fixed = {"te_general_gemm": TE_GEMM_NAME_DEFINED, "mla_have_te": MLA_HAVE_TE_FIXED}
    return frozenset(name for name, release in fixed.items() if release <= MEGATRON_VERSION)


def hybrid_model_class() -> type:
    """The hybrid (Mamba + attention + MLP/MoE) language model class of this megatron-core."""
    if MEGATRON_VERSION >= HYBRID_RENAMED:
        from megatron.core.models.hybrid.hybrid_model import HybridModel

        return HybridModel
    from megatron.core.models.mamba import MambaModel

    return MambaModel


def hybrid_model_args(stack_spec: Any, pattern: str) -> dict[str, Any]:
    """The keyword arguments naming the stack spec and the layer pattern, under this release's names;
    from 0.17 the pattern marks the even pipeline stages of this rank's ``parallel_state`` with ``|``
    (see the module doc)."""
    spec = "hybrid_stack_spec" if MEGATRON_VERSION >= HYBRID_RENAMED else "mamba_stack_spec"
    if MEGATRON_VERSION >= PATTERN_PIPES:
        from megatron.core import parallel_state

        stages = parallel_state.get_pipeline_model_parallel_world_size()
        return {spec: stack_spec, "hybrid_layer_pattern": staged_pattern(pattern, stages)}
    return {spec: stack_spec, "hybrid_override_pattern": pattern}


def staged_pattern(pattern: str, stages: int) -> str:
    """``pattern`` cut into ``stages`` equal runs of layers joined by ``|`` (``MEM*-E``, 2 ->
    ``MEM|*-E``); ``ValueError`` where ``stages`` does not divide its length."""
    if len(pattern) % stages:
        raise ValueError(f"hybrid layer pattern {pattern!r}: PP{stages} must divide its {len(pattern)} layers "
                         f"({len(pattern)} / {stages} is not whole)")
    per = len(pattern) // stages
    return "|".join(pattern[i: i + per] for i in range(0, len(pattern), per))


def hybrid_block_module() -> Any:  # a module whose globals the shims set
    """The module defining the hybrid stack (and the ``TENorm`` its final norm is built with)."""
    if MEGATRON_VERSION >= HYBRID_RENAMED:
        return importlib.import_module("megatron.core.models.hybrid.hybrid_block")
    return importlib.import_module("megatron.core.ssm.mamba_block")


def hybrid_stack_classes() -> tuple[type, type]:
    """(stack class, its submodules dataclass): ``HybridStack``… from 0.18, ``MambaStack``… before."""
    block = hybrid_block_module()
    if MEGATRON_VERSION >= HYBRID_RENAMED:
        return block.HybridStack, block.HybridStackSubmodules
    return block.MambaStack, block.MambaStackSubmodules


def mamba_conv1d_params() -> dict[str, str]:
    """The Mamba mixer's conv parameters: this release's local state-dict name -> the HF name under
    ``mixer.`` (``conv1d.weight`` / ``conv1d.bias`` in every checkpoint)."""
    if MEGATRON_VERSION >= CONV1D_PARAMETERS:
        return {"mixer.conv1d_weight": "conv1d.weight", "mixer.conv1d_bias": "conv1d.bias"}
    return {"mixer.conv1d.weight": "conv1d.weight", "mixer.conv1d.bias": "conv1d.bias"}


def mlp_submodules(mlp: Any) -> Any:
    """The ``MLPSubmodules`` of a layer spec's ``mlp``, to change in place: a ``ModuleSpec``'s
    ``submodules``, or (0.19) the ``submodules`` keyword of the ``functools.partial`` the local
    GPT spec holds."""
    import functools

    if isinstance(mlp, functools.partial):
        return mlp.keywords["submodules"]
    return mlp.submodules
