"""What a Gemma 3 teacher needs in megatron-core's ``GPTModel`` that megatron-core does not have.

This module owns the three Gemma 3 pieces podium adds to megatron's own classes (on every device:
none is a stand-in for a CUDA kernel), each named for what it adds and each proved needed by the
negative controls of ``tests/teacher/test_group_gemma3.py`` (the model without it is far from
transformers):

``post_norm`` (:func:`with_post_norm`)
    Gemma 3 normalises the attention output and the MLP output before each residual add
    (``post_attention_layernorm``, ``post_feedforward_layernorm``); megatron-core 0.16's
    ``TransformerLayer`` has norms only before them. The layer's ``linear_proj`` and ``linear_fc2``
    become the same linear layer followed by an RMSNorm (``post_norm``) of its (TP-reduced) output.
``local_rope`` (:func:`local_rope_attention_cls`)
    Sliding-window layers rotate with their own base (``rope_local_base_freq``, transformers 5's
    ``rope_parameters.sliding_attention``), global layers with the model's; megatron-core computes one
    RoPE per model. The sliding layers' self-attention swaps in frequencies of the local base (same
    positions, no scaling).
``embedding_scale`` (:func:`scale_embeddings`)
    The token embedding is multiplied by ``√hidden`` (in the parameters' dtype, as transformers does);
    the output layer, tied to the same weights, is not. The scale applies to the embedding's output.

What megatron-core expresses by itself: which layers slide (``window_attn_skip_freq`` as a list,
honoured by podium's SDPA core attention and by TransformerEngine's), the softmax scale
(``query_pre_attn_scalar``), gated tanh-GELU, q/k norms. Gemma's ``(1 + w)`` norms are loaded as
``1 + w`` by the weight map.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from podium.teacher.megatron_compat import mlp_submodules

if TYPE_CHECKING:  # pragma: no cover
    import torch

POST_NORM = "post_norm"  # the added norm's submodule name (``...linear_proj.post_norm.weight``)


@functools.cache
def with_post_norm(linear_cls: type, norm_cls: Any) -> type:
    """``linear_cls`` whose output goes through ``norm_cls`` (an RMSNorm of the layer's hidden size)."""

    class PostNormLinear(linear_cls):
        """A row-parallel linear layer followed by an RMSNorm of its reduced output (Gemma 3)."""

        def __init__(self, input_size: int, output_size: int, *args: Any, **kwargs: Any) -> None:
            super().__init__(input_size, output_size, *args, **kwargs)
            config = kwargs["config"]
            setattr(self, POST_NORM, norm_cls(config=config, hidden_size=output_size, eps=config.layernorm_epsilon))

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            output, bias = super().forward(*args, **kwargs)
            if bias is not None:  # Gemma 3 has no biases; a bias added later would skip the norm
                raise NotImplementedError("post_norm: a linear layer with a separate bias")
            return getattr(self, POST_NORM)(output), None

    PostNormLinear.__name__ = PostNormLinear.__qualname__ = f"PostNorm{linear_cls.__name__}"
    return PostNormLinear


def local_rope_attention_cls(base_cls: type, local_base: float, sliding: tuple[bool, ...]) -> type:
    """``base_cls`` (megatron's ``SelfAttention``) whose sliding layers (``sliding[layer - 1]``) rotate
    with RoPE of base ``local_base`` instead of the model's."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    class LocalRopeSelfAttention(base_cls):
        """Self-attention that, on a sliding-window layer, uses the local RoPE base (Gemma 3)."""

        def __init__(self, config: Any, submodules: Any, layer_number: int, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, submodules, layer_number, *args, **kwargs)
            self.local_rope = None
            if sliding[layer_number - 1]:
                self.local_rope = RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent=1.0,
                                                  rotary_base=local_base, use_cpu_initialization=True)

        def forward(self, *args: Any, rotary_pos_emb: Any = None, **kwargs: Any) -> Any:
            if self.local_rope is not None and rotary_pos_emb is not None:
                if isinstance(rotary_pos_emb, tuple):
                    raise NotImplementedError("local_rope: separate query and key positions")
                local = self.local_rope(rotary_pos_emb.shape[0])
                rotary_pos_emb = local.to(device=rotary_pos_emb.device)
            return super().forward(*args, rotary_pos_emb=rotary_pos_emb, **kwargs)

    return LocalRopeSelfAttention


def gemma3_layer_spec(spec: Any, local_base: float, sliding: tuple[bool, ...], use_te: bool) -> Any:
    """The dense layer ``spec`` with Gemma 3's post-norms and local RoPE (in place; returned). The
    post-norms are the spec's own norm class (TransformerEngine's ``TENorm`` on the TE spec, whose
    pre-norms are fused into the linear layers)."""
    sub = spec.submodules
    if use_te:
        from megatron.core.extensions.transformer_engine import TENorm

        norm: Any = TENorm
    else:
        norm = sub.input_layernorm
    attention = sub.self_attention
    attention.submodules.linear_proj = with_post_norm(attention.submodules.linear_proj, norm)
    mlp = mlp_submodules(sub.mlp)
    mlp.linear_fc2 = with_post_norm(mlp.linear_fc2, norm)
    attention.module = local_rope_attention_cls(attention.module, local_base, sliding)
    return spec


def scale_embeddings(model: Any, scale: float) -> bool:
    """Multiply the output of ``model``'s token embedding by ``scale`` (cast to the output's dtype, as
    transformers casts it to the weights'); False on a stage without the embedding."""
    import types

    import torch

    embedding = getattr(model, "embedding", None)
    if embedding is None:
        return False
    forward = embedding.forward

    def scaled(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = forward(*args, **kwargs)
        return out * torch.tensor(scale, dtype=torch.float32).to(out.dtype)

    embedding.forward = types.MethodType(scaled, embedding)
    return True
