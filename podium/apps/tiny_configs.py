"""The configs of the tiny checkpoints :mod:`podium.apps.tiny_models` writes, one per kind (see its
module doc for what each kind exercises): plain data, so a family's tiny shape is read in one place.
"""

from __future__ import annotations

from typing import Any

# kind -> (config class name, model class name, config kwargs)
# The tiny Qwen3-MoE (Qwen2-MoE's tiny shape too, below).
_QWEN3_MOE: dict[str, Any] = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,  # the dense layer's MLP
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[1],  # layers 0 and 2 route to experts, layer 1 is dense
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=False,
    use_sliding_window=False,
    attention_bias=False,
    router_aux_loss_coef=0.0,
)

BASE_CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            use_sliding_window=False,
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            sliding_window=5,  # shorter than the test sequences: the window matters
            tie_word_embeddings=False,
        ),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,  # != hidden / heads on purpose, as in real Qwen3 models
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
            attention_bias=False,
        ),
    ),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", _QWEN3_MOE),
    # Qwen3-MoE's tiny shape, plus the gated shared expert and q/k/v biases, without q/k norm
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {**{k: v for k, v in _QWEN3_MOE.items() if k not in ("head_dim", "attention_bias")},
         "shared_expert_intermediate_size": 48,  # the shared expert, behind its sigmoid gate
         "norm_topk_prob": False,  # as Qwen1.5-MoE / Qwen2-57B-A14B
         "qkv_bias": True},
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=48,  # each expert's MLP
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            router_jitter_noise=0.0,
        ),
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(
            vocab_size=101,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=128,
            n_inner=None,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=0,
        ),
    ),
}

# Nemotron-H: every layer kind (M Mamba-2, E latent MoE, * attention without positions, - MLP).
# The gated norm's eps is Megatron's fixed 1e-5; chunk 8 makes the oracle's SSD scan cross chunks.
BASE_CONFIGS["nemotron_h"] = (
    "NemotronHConfig",
    "NemotronHForCausalLM",
    dict(
        vocab_size=256,
        hidden_size=64,
        hybrid_override_pattern="MEM*-E",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,  # the "-" layer's squared-ReLU MLP
        mamba_num_heads=8,
        mamba_head_dim=8,
        n_groups=2,
        ssm_state_size=16,
        conv_kernel=4,
        chunk_size=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
        moe_latent_size=32,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        layer_norm_epsilon=1e-5,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    ),
)

# GLM-4.5: every feature it adds over the Llama family moves the logits: RoPE on half of an explicit
# head_dim (24 != 64 / 4), q/k norm, q/k/v bias, layer 0 dense, then MoE layers whose 8 experts form
# 2 groups (each token picks 1 group, then its top 2 there), a non-zero expert bias, a scale of 2.5,
# a shared expert.
BASE_CONFIGS["glm4_moe"] = (
    "Glm4MoeConfig",
    "Glm4MoeForCausalLM",
    dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,  # the dense first layer's MLP
        moe_intermediate_size=32,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        use_qk_norm=True,
        attention_bias=True,
        rms_norm_eps=1e-5,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        tie_word_embeddings=False,
    ),
)

# Gemma 3 text: sliding layers (window 4, shorter than the test sequences) with their own RoPE base
# around a global one with linear scaling, an explicit head_dim (24) and a softmax scale from
# query_pre_attn_scalar (20) that differ from hidden / heads, tied embeddings.
BASE_CONFIGS["gemma3"] = (
    "Gemma3TextConfig",
    "Gemma3ForCausalLM",
    dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        query_pre_attn_scalar=20,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        sliding_window=4,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}},
        rms_norm_eps=1e-6,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    ),
)

# Gemma 3's multimodal checkpoint (Gemma3ForConditionalGeneration): the tiny text model above under
# ``language_model.``, beside a one-layer vision tower a teacher never reads.
BASE_CONFIGS["gemma3_mm"] = (
    "Gemma3Config",
    "Gemma3ForConditionalGeneration",
    dict(
        text_config={k: v for k, v in BASE_CONFIGS["gemma3"][2].items() if k != "tie_word_embeddings"},
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4,
        boi_token_index=252,
        eoi_token_index=253,
        image_token_index=254,
        tie_word_embeddings=True,
    ),
)

# DeepSeek-V3 (Kimi K2's architecture): multi-latent attention (query latent 48, key/value latent 32,
# q/k heads 16 + 8 rotary, v heads 12) with YaRN (3 of 4 rotary frequencies interpolated; mscale 1,
# mscale_all_dim 0.5: rotary concentration and softmax scale both != 1), layer 0 dense, then 8 experts
# in 4 groups (2 kept, top 4: 2 per group), expert bias, scale 2.5, a shared expert, an MTP layer.
DEEPSEEK_V3: dict[str, Any] = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,  # the dense first layer's MLP
    moe_intermediate_size=32,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=48,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=8,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    max_position_embeddings=128,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 16,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.5},
    tie_word_embeddings=False,
    num_nextn_predict_layers=1,
)
BASE_CONFIGS["deepseek_v3"] = ("DeepseekV3Config", "DeepseekV3ForCausalLM", DEEPSEEK_V3)
# Queries projected directly (q_lora_rank null), rotary dims stored as halves, the default RoPE.
BASE_CONFIGS["deepseek_v3_qproj"] = (
    "DeepseekV3Config",
    "DeepseekV3ForCausalLM",
    {**DEEPSEEK_V3, "q_lora_rank": None, "rope_interleave": False,
     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
)
SKEWED = ("nemotron_h", "glm4_moe", "deepseek_v3", "deepseek_v3_qproj")
# gpt-oss: layer 0 slides (window 4, shorter than the test sequences), layer 1 is global; YaRN
# stretching 16 positions 4x (the sequences reach past 16), an explicit head_dim (24 != 64 / 4), a
# SwiGLU limit of 1.5 (7.0 in the published models) so the clamp bites on these small activations.
BASE_CONFIGS["gpt_oss"] = (
    "GptOssConfig",
    "GptOssForCausalLM",
    dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16},
        max_position_embeddings=64,
        swiglu_limit=1.5,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    ),
)
