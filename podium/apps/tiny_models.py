"""Tiny random-weight HF checkpoints and the HF ``transformers`` oracle for logprobs.

What ``podium demo``, the tests and the benchmarks check teachers against; nothing is downloaded:
configs are built in code and weights drawn from a fixed seed, then written with
``save_pretrained`` (safetensors). Kinds: ``llama`` (GQA, untied), ``qwen2`` (q/k/v bias),
``qwen3`` (q/k norm, tied), ``mistral`` (sliding window), ``qwen3_moe`` (4 experts, top-2, one
dense layer between two MoE layers), ``qwen2_moe`` (the same layer mix, q/k/v bias, top-k weights
not renormalised, a gated shared expert), ``mixtral`` (4 experts, top-2), ``gpt2`` (Conv1D, tied,
odd vocab 101), ``glm4_moe`` (GLM-4.5: partial RoPE, q/k norm, q/k/v bias, a dense first layer,
8 experts in 2 groups behind a sigmoid router with a non-zero expert bias, a shared expert),
``gemma3`` (Gemma 3 text: per-layer sliding window and RoPE base, post-norms, scaled tied
embedding; ``gemma3_mm`` the same as a multimodal checkpoint's language model), ``gpt_oss``
(attention sinks, a sliding and a full layer, YaRN, biases everywhere, 4 fused experts behind a
biased router, a clamped SwiGLU), ``nemotron_h``
(hybrid ``MEM*-E``: Mamba-2, latent MoE with a shared expert and a non-zero expert bias, attention
without positions, a squared-ReLU MLP; routing far from uniform).

- ``make_tiny_checkpoint(kind, path, **config_overrides)``: write one.
- ``hf_oracle_logprobs(path, input_ids, input_lengths) -> float32 [B, S]`` in NeMo RL's
  convention (position 0 and positions at or past the length are 0);
  ``hf_oracle_log_softmax`` -> ``[B, S, V]`` in the same alignment (``torch.topk`` of it is what
  ``top_k`` must return); ``hf_oracle_logits`` -> ``z / T`` ``[B, S, V]`` in the next-token
  alignment of ``topk_logits``. Each takes ``temperature`` (default 1).
- ``random_batch(vocab_size, lengths, seq_len=None, seed=0)``: right-padded ids and lengths.

Importing this module imports torch; transformers is imported on first use.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

SEED = 1234

logger = logging.getLogger(__name__)

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

_BASE_CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
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
_BASE_CONFIGS["nemotron_h"] = (
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
_BASE_CONFIGS["glm4_moe"] = (
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
_BASE_CONFIGS["gemma3"] = (
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
_BASE_CONFIGS["gemma3_mm"] = (
    "Gemma3Config",
    "Gemma3ForConditionalGeneration",
    dict(
        text_config={k: v for k, v in _BASE_CONFIGS["gemma3"][2].items() if k != "tie_word_embeddings"},
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4,
        boi_token_index=252,
        eoi_token_index=253,
        image_token_index=254,
        tie_word_embeddings=True,
    ),
)

# gpt-oss: layer 0 slides (window 4, shorter than the test sequences), layer 1 is global; YaRN
# stretching 16 positions 4x (the sequences reach past 16), an explicit head_dim (24 != 64 / 4), a
# SwiGLU limit of 1.5 (7.0 in the published models) so the clamp bites on these small activations.
_BASE_CONFIGS["gpt_oss"] = (
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

KINDS: tuple[str, ...] = tuple(_BASE_CONFIGS)


def _randomise_(model: torch.nn.Module, seed: int, std: float = 0.15, embed_std: float = 0.5) -> None:
    """Overwrite every parameter from a fixed seed (norms around 1, everything else around 0).

    Embeddings and the output layer get a wider spread so the next-token distributions are peaked.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            is_embed = any(k in name for k in ("embed_tokens", "lm_head", ".wte."))
            scale = embed_std if is_embed else std
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * scale
            is_norm = ("norm" in name or ".ln_" in name or name.startswith("transformer.ln_f")) and (
                name.endswith("weight")
            )
            param.copy_(1.0 + noise if is_norm else noise)


def _skew_routing_(model: torch.nn.Module, seed: int, router_scale: float = 2.0, bias_std: float = 0.3) -> None:
    """Routers far from uniform (weights scaled up) and a non-zero expert bias: a sigmoid router
    (Nemotron-H's and GLM-4.5's ``gate``) picks experts by ``sigmoid(logits) + e_score_correction_bias`` and weighs
    them without it, so forgetting the bias changes which experts run."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, module in model.named_modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if bias is None:
                continue
            module.weight.mul_(router_scale)
            bias.copy_(torch.randn(bias.shape, generator=gen) * bias_std)
            logger.debug("skewed router %s", name)


def make_tiny_checkpoint(
    kind: str,
    path: str | os.PathLike[str],
    *,
    seed: int = SEED,
    max_shard_size: str | int | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a random-weight HF checkpoint of ``kind`` (one of ``KINDS``) to ``path``; return it."""
    import transformers

    if kind not in _BASE_CONFIGS:
        raise ValueError(f"unknown tiny checkpoint kind {kind!r}; known: {sorted(_BASE_CONFIGS)}")
    config_cls_name, model_cls_name, base = _BASE_CONFIGS[kind]
    kwargs = {**base, **config_overrides}
    config = getattr(transformers, config_cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls_name)(config).to(torch.float32)
    _randomise_(model, seed)
    if kind in ("nemotron_h", "glm4_moe"):
        _skew_routing_(model, seed)
    if kind == "gpt_oss":  # sinks of a few units: each head gives a visible share to its sink
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("self_attn.sinks"):
                    param.mul_(10.0)
    if config.tie_word_embeddings:
        model.tie_weights()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_kwargs: dict[str, Any] = {"safe_serialization": True}
    if max_shard_size is not None:
        save_kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(str(path), **save_kwargs)
    return path


# ----------------------------------------------------------------------------------------------
# Oracle
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _load_hf_model(path: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def _as_tensors(input_ids: Any, input_lengths: Any) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    lengths = torch.as_tensor(input_lengths, dtype=torch.long)
    return ids, lengths


def hf_oracle_logits(path: str | os.PathLike[str], input_ids: Any, input_lengths: Any,
                     temperature: float = 1.0) -> torch.Tensor:
    """Temperature-scaled logits ``z / T`` ``[B, S, V]`` in the *next-token* alignment of NeMo RL's
    ``get_topk_logits`` (row ``t``: the distribution of the token after ``t``; rows at or past
    ``length - 1`` are 0)."""
    ids, lengths = _as_tensors(input_ids, input_lengths)
    model = _load_hf_model(str(path))
    seq = ids.shape[1]
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float() / float(temperature)
    valid = torch.arange(seq)[None, :] < (lengths[:, None] - 1)
    return logits * valid[..., None]


def hf_oracle_log_softmax(path: str | os.PathLike[str], input_ids: Any, input_lengths: Any,
                          temperature: float = 1.0) -> torch.Tensor:
    """Full log-softmax of ``z / T`` ``[B, S, V]`` aligned with NeMo RL logprobs (row i =
    distribution of token i; row 0 and rows at or past the length are 0)."""
    ids, lengths = _as_tensors(input_ids, input_lengths)
    logits = hf_oracle_logits(path, ids, lengths, temperature)
    out = torch.zeros_like(logits)
    out[:, 1:] = torch.log_softmax(logits[:, :-1], dim=-1)
    valid = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    valid[:, 0] = False
    return out * valid[..., None]


def hf_oracle_logprobs(path: str | os.PathLike[str], input_ids: Any, input_lengths: Any,
                       temperature: float = 1.0) -> torch.Tensor:
    """NeMo RL-convention logprobs ``float32 [B, S]`` from HF transformers (see module docstring)."""
    ids, lengths = _as_tensors(input_ids, input_lengths)
    logsm = hf_oracle_log_softmax(path, ids, lengths, temperature)
    out = logsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return out.to(torch.float32)


def random_batch(
    vocab_size: int, lengths: Sequence[int], seq_len: int | None = None, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Right-padded random batch: ``{"input_ids": int64 [B, S], "input_lengths": int64 [B]}``."""
    gen = torch.Generator().manual_seed(seed)
    seq_len = seq_len or max(lengths)
    ids = torch.randint(1, vocab_size, (len(lengths), seq_len), generator=gen, dtype=torch.long)
    lens = torch.tensor(list(lengths), dtype=torch.long)
    ids[torch.arange(seq_len)[None, :] >= lens[:, None]] = 0
    return {"input_ids": ids, "input_lengths": lens}
