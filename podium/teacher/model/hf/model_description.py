"""What podium knows about an HF checkpoint's architecture: :class:`ModelDescription`, and the HF
names of the MoE blocks per architecture (``MOE_NAMES``, ``SHARED_EXPERT_NAMES``). The describers
that fill it from a ``config.json`` are :mod:`.description`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# HF names of an MoE layer's router and experts, per architecture: (block prefix, router, expert
# gate/up/down projections). Its keys are the architectures with routed experts; the MoE map
# (``moe``) reads the names.
MOE_NAMES: dict[str, tuple[str, str, tuple[str, str, str]]] = {
    "Qwen3MoeForCausalLM": ("mlp.", "gate", ("gate_proj", "up_proj", "down_proj")),
    "Qwen2MoeForCausalLM": ("mlp.", "gate", ("gate_proj", "up_proj", "down_proj")),
    "MixtralForCausalLM": ("block_sparse_moe.", "gate", ("w1", "w3", "w2")),
    "Glm4MoeForCausalLM": ("mlp.", "gate", ("gate_proj", "up_proj", "down_proj")),
    "DeepseekV3ForCausalLM": ("mlp.", "gate", ("gate_proj", "up_proj", "down_proj")),
}
# The shared expert's HF block name (under the MoE block), per architecture that has one.
SHARED_EXPERT_NAMES: dict[str, str] = {"Qwen2MoeForCausalLM": "shared_expert", "Glm4MoeForCausalLM": "shared_experts",
                                       "DeepseekV3ForCausalLM": "shared_experts"}


@dataclass(frozen=True)
class ModelDescription:
    """What podium needs to know about a checkpoint's architecture (from its HF config)."""

    architecture: str
    # "llama" (Llama/Mistral/Qwen2/Qwen3), "glm4_moe", "deepseek_v3", "gemma3", "gpt_oss", "gpt2", "nemotron_h"
    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    normalization: str  # "RMSNorm" | "LayerNorm"
    norm_eps: float
    activation: str  # "swiglu" | "geglu_tanh" | "quick_geglu" | "gelu_tanh" | "gelu" | "squared_relu"
    position_embedding_type: str  # "rope" | "learned_absolute" | "none"
    rotary_base: float = 10000.0
    # {"rope_type": "llama3"|"linear", "factor": …}; DeepSeek's {"rope_type": "yarn", "factor",
    # "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"}
    rope_scaling: Mapping[str, Any] | None = None
    rotary_percent: float = 1.0  # the share of head_dim RoPE rotates (the first dimensions; GLM: 0.5)
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tied_embeddings: bool = False
    sliding_window: int | None = None
    # Gemma 3: the layers that slide (empty: all, when ``sliding_window`` is set), their RoPE base
    # (None: ``rotary_base``), the softmax scale (None: 1/√head_dim), the token embedding's scale,
    # and a norm after the attention and after the MLP (before each residual add).
    window_layers: tuple[bool, ...] = ()
    local_rotary_base: float | None = None
    softmax_scale: float | None = None
    embedding_scale: float | None = None
    post_norms: bool = False
    # gpt-oss: attention sinks, GLU ``act(gate)·(up + offset)`` clamped ±``activation_clamp``, "mxfp4" experts
    attention_sinks: bool = False
    glu_linear_offset: float = 0.0
    activation_clamp: float | None = None
    expert_quantization: str | None = None
    # Routed experts (0: a dense model). ``moe_layers[i]``: layer i is an MoE layer (else dense,
    # ``ffn_hidden_size``); ``norm_topk_prob``: the top-k weights are renormalised to sum to 1.
    num_experts: int = 0
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[bool, ...] = ()
    # A shared expert on every MoE layer (0: none): its MLP size, and whether a sigmoid gate
    # (a linear map of the layer input to one value per token) scales its output.
    moe_shared_ffn_hidden_size: int = 0
    moe_shared_expert_gate: bool = False
    # The router: "softmax", or "sigmoid" scores whose top-k are picked after adding a per-expert
    # bias (``moe_expert_bias``, kept in fp32) and weighed without it; the top-k weights are then
    # multiplied by ``moe_routed_scaling_factor`` (None: 1). ``moe_latent_size`` > 0: the routed
    # experts work in a latent space, between two projections of the hidden state.
    moe_score_function: str = "softmax"
    moe_expert_bias: bool = False
    moe_routed_scaling_factor: float | None = None
    moe_latent_size: int = 0
    # Group-limited routing (0: none): the experts in ``moe_router_num_groups`` groups, each token
    # choosing its top-k among the best ``moe_router_group_topk`` groups (GLM-4.5's n_group/topk_group).
    moe_router_num_groups: int = 0
    moe_router_group_topk: int = 0
    # Multi-latent attention (DeepSeek-V3, Kimi K2; ``kv_lora_rank`` 0: none): queries through a
    # ``q_lora_rank`` bottleneck (0: projected directly), keys and values from one shared latent of
    # ``kv_lora_rank`` plus a shared rotary key of ``qk_rope_head_dim``; each head's query/key is
    # ``qk_nope_head_dim`` + ``qk_rope_head_dim`` wide, its value ``v_head_dim``. ``rope_interleave``:
    # the rotary dimensions are stored as interleaved pairs (DeepSeek's layout, megatron-core's MLA's).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    # A hybrid model (Nemotron-H): one symbol per layer, ``M`` Mamba-2, ``*`` attention, ``-`` MLP,
    # ``E`` MoE ("" for a transformer), and the Mamba-2 mixer's shape.
    hybrid_pattern: str = ""
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_num_groups: int = 0
    mamba_state_dim: int = 0
    mamba_conv_kernel: int = 0
    hf_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid(self) -> bool:
        return bool(self.hybrid_pattern)

    @property
    def any_linear_bias(self) -> bool:
        return self.attn_out_bias or self.mlp_bias

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("hf_config")
        return out
