"""Tiny random-weight HF checkpoints and the HF ``transformers`` oracle for logprobs.

What ``podium demo``, the tests and the benchmarks check teachers against; nothing is downloaded:
configs are built in code and weights drawn from a fixed seed, then written with
``save_pretrained`` (safetensors). Kinds: ``llama`` (GQA, untied), ``qwen2`` (q/k/v bias),
``qwen3`` (q/k norm, tied), ``mistral`` (sliding window), ``qwen3_moe`` (4 experts, top-2, one
dense layer between two MoE layers), ``qwen2_moe`` (the same layer mix, q/k/v bias, top-k weights
not renormalised, a gated shared expert), ``mixtral`` (4 experts, top-2), ``gpt2`` (Conv1D, tied,
odd vocab 101), ``glm4_moe`` (GLM-4.5: partial RoPE, q/k norm, q/k/v bias, a dense first layer,
8 experts in 2 groups behind a sigmoid router with a non-zero expert bias, a shared expert),
``deepseek_v3`` (DeepSeek-V3 / Kimi K2: multi-latent attention with YaRN, a dense first layer, 8
experts in 4 groups behind a sigmoid router with expert bias, a shared expert, an MTP layer the
teacher must skip; ``deepseek_v3_qproj`` with queries projected directly, the rotary dimensions
stored as halves and the default RoPE), ``gemma3`` (Gemma 3 text: per-layer sliding window and
RoPE base, post-norms, scaled tied embedding; ``gemma3_mm`` the same as a multimodal checkpoint's
language model), ``gpt_oss`` (attention sinks, a sliding and a full layer, YaRN, biases everywhere,
4 fused experts behind a biased router, a clamped SwiGLU), ``nemotron_h`` (hybrid ``MEM*-E``:
Mamba-2, latent MoE with a shared expert and a non-zero expert bias, attention without positions, a
squared-ReLU MLP; routing far from uniform).

- ``make_tiny_checkpoint(kind, path, **config_overrides)``: write one (:mod:`.tiny_fp8` writes one
  in DeepSeek-V3's block-scaled fp8 format).
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

from podium.apps.tiny_configs import BASE_CONFIGS, SKEWED

SEED = 1234

logger = logging.getLogger(__name__)

KINDS: tuple[str, ...] = tuple(BASE_CONFIGS)


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

    if kind not in BASE_CONFIGS:
        raise ValueError(f"unknown tiny checkpoint kind {kind!r}; known: {sorted(BASE_CONFIGS)}")
    config_cls_name, model_cls_name, base = BASE_CONFIGS[kind]
    kwargs = {**base, **config_overrides}
    config = getattr(transformers, config_cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls_name)(config).to(torch.float32)
    _randomise_(model, seed)
    if kind in SKEWED:
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
    if getattr(config, "num_nextn_predict_layers", 0) and config.model_type == "deepseek_v3":
        _add_mtp_layer(path, config, seed)
    return path


def _add_mtp_layer(path: Path, config: Any, seed: int) -> None:
    """Add the MTP layer DeepSeek-V3 ships as ``model.layers.{num_hidden_layers}.*`` (transformers does
    not build it): random tensors under its names, which a teacher must not read."""
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    tensors = load_file(str(file))
    last, mtp = f"model.layers.{config.num_hidden_layers - 1}.", f"model.layers.{config.num_hidden_layers}."
    gen = torch.Generator().manual_seed(seed + 2)
    h = config.hidden_size
    extra = {mtp + name[len(last):]: torch.randn(t.shape, generator=gen) for name, t in tensors.items()
             if name.startswith(last)}
    extra.update({mtp + "enorm.weight": torch.ones(h), mtp + "hnorm.weight": torch.ones(h),
                  mtp + "eh_proj.weight": torch.randn(h, 2 * h, generator=gen),
                  mtp + "shared_head.norm.weight": torch.ones(h)})
    save_file({**tensors, **extra}, str(file), metadata={"format": "pt"})


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
