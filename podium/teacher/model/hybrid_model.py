"""Megatron-core's hybrid model (``MambaModel``) for a Nemotron-H teacher: its layer spec (podium's
local one on CPU, megatron's TE one on CUDA: chosen in one place) and its construction.

This module owns the inference-only hybrid model of one rank (its ``TransformerConfig``, Mamba and
MoE fields included, comes from ``megatron_config``); :mod:`podium.teacher.model.megatron_model` owns the
transformer (``GPTModel``) families.

- The stack spec is podium's own, on megatron's local (non-TE) modules: megatron-core ships only a
  TE hybrid spec. One pre-norm per layer, as in the HF model: ``M`` a ``MambaLayer`` (norm, then the
  ``MambaMixer`` with column/row-parallel ``in_proj``/``out_proj``), ``*`` a ``TransformerLayer``
  with attention only (podium's SDPA core attention, no positional embedding), ``-`` an
  ``MLPLayer`` (squared-ReLU MLP), ``E`` an ``MoETransformerLayer`` (``SequentialMLP`` experts, a
  shared expert, latent projections when the checkpoint has them).
- Which spec, in one place (:func:`choose_hybrid_spec`): on CPU the local spec above with the shims of
  :mod:`podium.teacher.cpu.mamba_shims` (each applied when what it replaces is missing); on CUDA the
  Mamba kernels (``mamba-ssm``, ``causal-conv1d``: :data:`~podium.config.architecture.MAMBA_KERNELS`)
  must import, or the build stops with :class:`MambaKernelsMissing` naming them and the ``pip``
  command; with TransformerEngine as well, megatron's own TE spec (:func:`te_hybrid_stack_spec`),
  without it the local spec on CUDA (as the transformer families do).
- The SSD scan follows megatron-core: ``dt = softplus(dt + dt_bias)`` is not clamped.
  transformers clamps it at ``time_step_min`` (0.001); where ``dt`` falls below that the two differ
  (on the tiny test model, where it never does, they agree to ~1e-6; see the oracle tests).
- The Mamba conv's kernel width comes from the checkpoint (``MambaMixer``'s ``d_conv``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from podium.config.architecture import MAMBA_KERNELS, MAMBA_KERNELS_INSTALL
from podium.teacher.cpu.mamba_shims import apply_mamba_shims
from podium.teacher.megatron_compat import hybrid_model_args, hybrid_model_class, hybrid_stack_classes
from podium.teacher.model.hf import ModelDescription
from podium.teacher.model.megatron_model import _sdpa_core_attention_cls

if TYPE_CHECKING:  # pragma: no cover
    from megatron.core.transformer.transformer_config import TransformerConfig

logger = logging.getLogger(__name__)

TE_SPEC = "transformer_engine"  # megatron's mamba_stack_spec (TE layers, mamba-ssm's kernels)
LOCAL_SPEC = "local"  # podium's spec on megatron's local modules (CPU: with the Mamba shims)


class MambaKernelsMissing(RuntimeError):
    """A hybrid model asked to run on CUDA where the Mamba kernels do not import."""


def _module_of(package: str) -> str:
    return package.replace("-", "_")  # mamba-ssm -> mamba_ssm, causal-conv1d -> causal_conv1d


def missing_mamba_kernels() -> list[str]:
    """The packages of :data:`MAMBA_KERNELS` this Python cannot import (by their module's spec)."""
    missing = []
    for package in MAMBA_KERNELS:
        try:
            found = importlib.util.find_spec(_module_of(package)) is not None
        except (ImportError, ValueError):  # a module hidden in sys.modules
            found = False
        if not found:
            missing.append(package)
    return missing


def choose_hybrid_spec(*, cuda: bool, transformer_engine: bool, missing_kernels: Sequence[str],
                       where: str = "this Python") -> str:
    """The stack spec a hybrid model is built with: :data:`LOCAL_SPEC` on CPU (with the Mamba shims);
    on CUDA :data:`TE_SPEC` with TransformerEngine, :data:`LOCAL_SPEC` without; on CUDA with any of
    the Mamba kernels missing, :class:`MambaKernelsMissing` (megatron's Mamba mixer runs its scan,
    gated norm and causal conv through them there). ``where`` names the interpreter in the error."""
    if not cuda:
        return LOCAL_SPEC
    if missing_kernels:
        names = ", ".join(f"{p} (import {_module_of(p)})" for p in missing_kernels)
        raise MambaKernelsMissing(
            f"a Nemotron-H (hybrid Mamba) teacher on CUDA needs the Mamba kernels, and {where} cannot import "
            f"{names}: install them into the GPU nodes' Python, built against its torch and CUDA: "
            f"`{MAMBA_KERNELS_INSTALL}`")
    return TE_SPEC if transformer_engine else LOCAL_SPEC


def hybrid_spec_here() -> str:
    """:func:`choose_hybrid_spec` for this process (CUDA, TransformerEngine and the kernels as found)."""
    import torch

    from podium.teacher.model.megatron_config import te_available

    cuda = bool(torch.cuda.is_available())
    where = f"this Python ({sys.executable}, torch {torch.__version__}, CUDA {torch.version.cuda})"
    return choose_hybrid_spec(cuda=cuda, transformer_engine=cuda and te_available(),
                              missing_kernels=missing_mamba_kernels() if cuda else (), where=where)


def hybrid_stack_spec(desc: ModelDescription) -> Any:
    """The ``MambaStack`` spec of ``desc`` on megatron's local modules (see module docstring)."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.mlp import MLP, MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import (
        MoETransformerLayer,
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    stack, stack_submodules = hybrid_stack_classes()  # MambaStack before 0.18
    norm = LocalSpecProvider().layer_norm(rms_norm=True, for_qk=False)
    mixer = ModuleSpec(module=MambaMixer, params={"d_conv": desc.mamba_conv_kernel},
                       submodules=MambaMixerSubmodules(in_proj=ColumnParallelLinear, out_proj=RowParallelLinear))
    attention = ModuleSpec(
        module=SelfAttention,
        params={"attn_mask_type": AttnMaskType.causal},
        submodules=SelfAttentionSubmodules(linear_qkv=ColumnParallelLinear, core_attention=_sdpa_core_attention_cls(),
                                           linear_proj=RowParallelLinear),
    )
    mlp = ModuleSpec(module=MLP,
                     submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear))
    submodules = stack_submodules(
        mamba_layer=ModuleSpec(module=MambaLayer,
                               submodules=MambaLayerSubmodules(norm=norm, mixer=mixer, mamba_bda=get_bias_dropout_add)),
        attention_layer=ModuleSpec(module=TransformerLayer, submodules=TransformerLayerSubmodules(
            input_layernorm=norm, self_attention=attention, self_attn_bda=get_bias_dropout_add)),
        mlp_layer=ModuleSpec(module=MLPLayer, submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=norm, mlp=mlp, mlp_bda=get_bias_dropout_add)),
    )
    if desc.is_moe:
        moe = get_moe_module_spec(use_te=False, num_experts=desc.num_experts, moe_grouped_gemm=False)
        submodules.moe_layer = ModuleSpec(module=MoETransformerLayer, submodules=TransformerLayerSubmodules(
            pre_mlp_layernorm=norm, mlp=moe, mlp_bda=get_bias_dropout_add))
    return ModuleSpec(module=stack, submodules=submodules)


def te_hybrid_stack_spec(desc: ModelDescription) -> Any:
    """megatron's TE hybrid stack spec (``mamba_stack_spec``: ``in_proj`` and ``linear_qkv`` with their
    pre-norm fused, TE attention and norms) with what the checkpoint and podium's weight map ask: the
    mixer's conv width from the checkpoint, and the routed experts as ``SequentialMLP`` of TE linears
    (``moe_grouped_gemm=False``: the ``local_experts.N`` names the map reads) instead of its grouped GEMM."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.models.mamba.mamba_layer_specs import mamba_stack_spec  # 0.18+: hybrid_stack_spec's alias

    sub = mamba_stack_spec.submodules
    mamba = sub.mamba_layer
    mixer = dataclasses.replace(mamba.submodules.mixer, params={**mamba.submodules.mixer.params,
                                                                 "d_conv": desc.mamba_conv_kernel})
    changes: dict[str, Any] = {"mamba_layer": dataclasses.replace(
        mamba, submodules=dataclasses.replace(mamba.submodules, mixer=mixer))}
    if desc.is_moe:
        moe = get_moe_module_spec(use_te=True, num_experts=desc.num_experts, moe_grouped_gemm=False)
        changes["moe_layer"] = dataclasses.replace(
            sub.moe_layer, submodules=dataclasses.replace(sub.moe_layer.submodules, mlp=moe))
    return dataclasses.replace(mamba_stack_spec, submodules=dataclasses.replace(sub, **changes))


def build_hybrid_model(desc: ModelDescription, config: TransformerConfig, padded_vocab: int) -> Any:
    """This rank's ``MambaModel`` stage (pre/post process from ``parallel_state``), in eval mode, on
    the spec :func:`hybrid_spec_here` chooses."""
    import torch

    kind = hybrid_spec_here()  # before anything is built: on CUDA without the kernels, the error that names them
    apply_mamba_shims()
    from megatron.core import parallel_state

    logger.info("hybrid model %s: %s layer spec", desc.architecture, kind)
    spec = te_hybrid_stack_spec(desc) if kind == TE_SPEC else hybrid_stack_spec(desc)

    model = hybrid_model_class()(  # MambaModel before 0.18
        config=config,
        vocab_size=padded_vocab,
        max_sequence_length=desc.max_position_embeddings,
        **hybrid_model_args(spec, desc.hybrid_pattern),
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=desc.tied_embeddings,
        position_embedding_type="none",
    )
    if torch.cuda.is_available():
        model = model.cuda(torch.cuda.current_device())
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model
