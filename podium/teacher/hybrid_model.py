"""Megatron-core's hybrid model (``MambaModel``) for a Nemotron-H teacher: its local layer spec
and its construction.

This module owns the inference-only hybrid model of one rank (its ``TransformerConfig``, Mamba and
MoE fields included, comes from ``megatron_config``); :mod:`podium.teacher.megatron_model` owns the
transformer (``GPTModel``) families.

- The stack spec is podium's own, on megatron's local (non-TE) modules: megatron-core ships only a
  TE hybrid spec. One pre-norm per layer, as in the HF model: ``M`` a ``MambaLayer`` (norm, then the
  ``MambaMixer`` with column/row-parallel ``in_proj``/``out_proj``), ``*`` a ``TransformerLayer``
  with attention only (podium's SDPA core attention, no positional embedding), ``-`` an
  ``MLPLayer`` (squared-ReLU MLP), ``E`` an ``MoETransformerLayer`` (``SequentialMLP`` experts, a
  shared expert, latent projections when the checkpoint has them).
- Without CUDA / ``mamba-ssm`` / Triton / TransformerEngine, the shims of
  :mod:`podium.teacher.mamba_shims` are applied first (each when what it replaces is missing).
- The SSD scan follows megatron-core: ``dt = softplus(dt + dt_bias)`` is not clamped.
  transformers clamps it at ``time_step_min`` (0.001); where ``dt`` falls below that the two differ
  (on the tiny test model, where it never does, they agree to ~1e-6; see the oracle tests).
- The Mamba conv's kernel width comes from the checkpoint (``MambaMixer``'s ``d_conv``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from podium.teacher.hf import ModelDescription
from podium.teacher.mamba_shims import apply_mamba_shims
from podium.teacher.megatron_compat import hybrid_model_args, hybrid_model_class, hybrid_stack_classes
from podium.teacher.megatron_model import _sdpa_core_attention_cls

if TYPE_CHECKING:  # pragma: no cover
    from megatron.core.transformer.transformer_config import TransformerConfig


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


def build_hybrid_model(desc: ModelDescription, config: TransformerConfig, padded_vocab: int) -> Any:
    """This rank's ``MambaModel`` stage (pre/post process from ``parallel_state``), in eval mode."""
    import torch

    apply_mamba_shims()
    from megatron.core import parallel_state

    model = hybrid_model_class()(  # MambaModel before 0.18
        config=config,
        vocab_size=padded_vocab,
        max_sequence_length=desc.max_position_embeddings,
        **hybrid_model_args(hybrid_stack_spec(desc), desc.hybrid_pattern),
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
