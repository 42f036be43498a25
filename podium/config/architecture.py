"""What a checkpoint's architecture asks of a teacher's layout, read from its HF ``config.json``.

This module owns the rules that depend on the model and not only on the recipe, for ``plan`` (no
torch, no megatron: a login node plans with it) and for the worker, which checks the same rule
before it builds the model:

- attention over TP (:func:`attention_tp_problem`): TP divides the query heads, and divides the KV
  groups or, with fewer groups than TP, is a multiple of them (Megatron then gives each rank
  ``1/TP`` of the fused QKV rows, all-gathers the fused output and keeps its group, so the fused
  rows must divide by TP too);
- routed experts over EP (``num_experts``, ``num_local_experts`` or ``n_routed_experts``);
- routed experts over expert-TP: ETP divides each expert's MLP (``moe_intermediate_size``); a shared
  expert is split over the attention TP (``moe_shared_expert_intermediate_size`` /
  ``shared_expert_intermediate_size``). Latent projections are whole on every rank: no rule;
- Nemotron-H (``model_type`` ``nemotron_h``): TP divides the Mamba heads (``mamba_num_heads``) and
  groups (``n_groups``), as Megatron's ``MambaMixer`` asserts, and CP splits what each TP rank holds
  again (``MambaContextParallel``: heads per TP rank divisible by CP; groups per TP rank a multiple
  or a divisor of CP); PP divides the layers of the pattern (``hybrid_override_pattern`` or
  ``layers_block_type``): megatron-core's hybrid model gives each stage ``L/PP`` consecutive layers
  (both releases podium runs; ``megatron_compat``). MTP layers are no part of a teacher, so no stage
  holds one;
- GLM-4.5 / 4.6 (``model_type`` ``glm4_moe``): the checkpoint fields megatron-core cannot express
  are refused, each by name (:func:`field_problems`): a RoPE other than the default, a hidden
  activation other than SiLU, sigmoid top-k weights left unnormalised (``norm_topk_prob`` false),
  group-limited routing whose group score is not the sum of each group's top 2
  (``num_experts_per_tok / topk_group`` must be 2, as megatron-core scores a group by its top
  ``topk / group_topk``), a partial rotary dimension that is not a whole even number;
- DeepSeek-V3 / Kimi K2 (``DeepseekV3ForCausalLM``, ``model_type`` ``deepseek_v3`` or ``kimi_k2``):
  TP divides the latent down-projections (``q_lora_rank``, ``kv_lora_rank + qk_rope_head_dim``:
  megatron-core's local MLA splits their rows over TP); refused by name: a RoPE other than the
  default or YaRN, YaRN with an explicit ``attention_factor``, ``truncate: false`` or
  ``mscale_all_dim`` without ``mscale`` (:func:`deepseek_yarn` says how megatron-core takes the
  rest), ``topk_method`` other than ``noaux_tc``, ``scoring_func`` other than sigmoid,
  ``norm_topk_prob`` false, ``moe_layer_freq`` other than 1, attention biases, GLM-4.5's group rule;
- Gemma 3 text (``model_type`` ``gemma3_text``, or the language model of a multimodal ``gemma3``
  checkpoint: :func:`language_config`): refused by name where podium's model would differ
  from transformers: attention or final logit softcapping, bidirectional attention, attention
  biases, an activation other than tanh-GELU, a global RoPE other than default/linear or a local
  (sliding-layer) RoPE other than default, a layer type other than sliding/full attention;
- gpt-oss (``model_type`` ``gpt_oss``): refused by name where megatron-core's model would differ:
  a RoPE other than YaRN or default (and YaRN with an explicit ``attention_factor``), a SwiGLU gain
  (``swiglu_alpha``) other than megatron-core's ``quick_gelu`` 1.702, no attention bias, a layer
  type other than sliding/full attention;
- quantized checkpoints (``quantization_config``, :mod:`podium.config.quantization`): podium reads
  only what it dequantizes as it reads (block-scaled fp8 as DeepSeek-V3 and Kimi K2 ship it, any
  family; gpt-oss's MXFP4 experts); any other is refused naming its ``quant_method``, and the
  plan's needs say what a readable one costs.

:func:`layout_problems` says what cannot work, naming the config key and the arithmetic;
:func:`architecture_needs` says in words what a layout of this model takes on the cluster (the plan
prints it under the teacher's other needs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podium.config.layout import ParallelLayout
from podium.config.quantization import READABLE_QUANTIZATION, fp8_block_size, quant_method, quantization_problems
from podium.config.rope import deepseek_yarn, gpt_oss_rope, partial_rotary_factor, rope_parameters, rope_type

NEMOTRON_H = "nemotron_h"
GLM4_MOE = "glm4_moe"
GEMMA3_TEXT = "gemma3_text"
GEMMA3 = "gemma3"  # the multimodal checkpoints (Gemma3ForConditionalGeneration): the text model in text_config
# What transformers' Gemma3TextConfig takes for a field a checkpoint's text_config leaves out (the
# published multimodal configs write only what differs from these).
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "tie_word_embeddings": True,
}
GEMMA3_LAYER_TYPES = ("sliding_attention", "full_attention")
GPT_OSS = "gpt_oss"
GPT_OSS_SWIGLU_ALPHA = 1.702  # megatron-core's quick_gelu gain, fixed in its code
# transformers' Glm4MoeConfig default when a config does not say (its __post_init__)
GLM_PARTIAL_ROTARY = 0.5
# DeepSeek-V3's model_type, and Kimi K2's (the same architecture, DeepseekV3ForCausalLM, its own values)
DEEPSEEK_V3_TYPES = ("deepseek_v3", "kimi_k2")
DEEPSEEK_V3 = "DeepseekV3ForCausalLM"
# hybrid_override_pattern letters, and transformers' layers_block_type names for them
_LAYER_KINDS = {"M": "Mamba-2", "*": "attention", "E": "MoE", "-": "MLP"}
_BLOCK_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "moe": "E", "mlp": "-"}
# What a Nemotron-H teacher imports on CUDA (the Mamba scan, the gated norm and the causal conv).
MAMBA_KERNELS = ("mamba-ssm", "causal-conv1d")
# built against the torch already installed (their setup imports it): no build isolation
MAMBA_KERNELS_INSTALL = f"pip install --no-build-isolation {' '.join(MAMBA_KERNELS)}"


def attention_tp_problem(heads: int, groups: int, head_dim: int, tp: int) -> str | None:
    """Why TP``tp`` cannot split this attention, or None (see the module doc)."""
    if heads % tp:
        return f"TP{tp} must divide the attention heads ({heads}: {heads} / {tp} is not whole)"
    if groups >= tp:
        if groups % tp:
            return f"TP{tp} must divide the KV groups ({groups}: {groups} / {tp} is not whole)"
        return None
    if tp % groups:
        return (f"with fewer KV groups ({groups}) than TP{tp}, TP must be a multiple of them "
                f"({tp} / {groups} is not whole)")
    rows = (heads + 2 * groups) * head_dim
    if rows % tp:
        return (f"with fewer KV groups ({groups}) than TP{tp}, TP must divide the fused QKV rows "
                f"((heads {heads} + 2 × groups {groups}) × head_dim {head_dim} = {rows})")
    return None


def _int(config: Mapping[str, Any], *keys: str) -> tuple[str, int] | None:
    """The first of ``keys`` that ``config`` sets to a positive number, with its value."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def _attention(config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(query heads, KV groups, head dim) from an HF config, or None where it does not say."""
    found = _int(config, "num_attention_heads", "n_head")
    if found is None:
        return None
    heads = found[1]
    groups = (_int(config, "num_key_value_heads") or ("", heads))[1]
    hidden = (_int(config, "hidden_size", "n_embd") or ("", 0))[1]
    head_dim = (_int(config, "head_dim") or ("", hidden // heads))[1]
    return heads, groups, head_dim


def experts_of(config: Mapping[str, Any]) -> int:
    """The routed experts an HF config declares (0 for a dense model)."""
    return (_int(config, "num_experts", "num_local_experts", "n_routed_experts") or ("", 0))[1]


def layer_pattern(config: Mapping[str, Any]) -> str:
    """A Nemotron-H config's layers as ``hybrid_override_pattern`` letters (``M * E -``)."""
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern
    kinds = config.get("layers_block_type") or []
    return "".join(_BLOCK_TYPES.get(str(kind), "?") for kind in kinds)


def language_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: a multimodal Gemma 3's ``text_config`` over transformers'
    defaults (with the outer ``architectures``), else ``config`` itself."""
    text = config.get("text_config")
    if config.get("model_type") != GEMMA3 or not isinstance(text, Mapping):
        return config
    return {**GEMMA3_TEXT_DEFAULTS, "model_type": GEMMA3_TEXT, **text,
            "architectures": list(config.get("architectures") or [])}


def field_problems(config: Mapping[str, Any]) -> list[str]:
    """The checkpoint fields podium cannot honour for this model, each named (see the module doc);
    the worker's describer refuses the same."""
    config = language_config(config)
    problems = quantization_problems(config)
    if config.get("model_type") == GLM4_MOE:
        problems += _glm_problems(config)
    elif config.get("model_type") == GEMMA3_TEXT:
        problems += _gemma3_problems(config)
    elif is_deepseek_v3(config):
        problems += _deepseek_problems(config)
    elif config.get("model_type") == GPT_OSS:
        problems += _gpt_oss_problems(config)
    return problems


def is_deepseek_v3(config: Mapping[str, Any]) -> bool:
    """DeepSeek-V3 or Kimi K2 (``DeepseekV3ForCausalLM``, whatever the model_type)."""
    return config.get("model_type") in DEEPSEEK_V3_TYPES or DEEPSEEK_V3 in (config.get("architectures") or [])


def _sigmoid_router_problems(config: Mapping[str, Any]) -> list[str]:
    """GLM-4.5's and DeepSeek-V3's router as megatron-core computes it: top-k weights renormalised,
    and group-limited routing scored as transformers scores it (each group by its top 2)."""
    topk = (_int(config, "num_experts_per_tok") or ("", 1))[1]
    groups = (_int(config, "n_group") or ("", 1))[1]
    chosen = (_int(config, "topk_group") or ("", 1))[1]
    experts = experts_of(config)
    problems = []
    if topk > 1 and not config.get("norm_topk_prob", True):
        problems.append("norm_topk_prob=false: megatron-core renormalises sigmoid top-k weights "
                        "(always, for top-k > 1)")
    if groups > 1:
        if experts % groups or experts // groups < 2:
            problems.append(f"n_group={groups}: the {experts} routed experts must split into groups of at least 2")
        if topk % chosen or topk // chosen != 2:
            problems.append(f"n_group={groups}, topk_group={chosen}, num_experts_per_tok={topk}: transformers scores a "
                            f"group by its top 2 experts, megatron-core by its top num_experts_per_tok / topk_group "
                            f"({topk} / {chosen}); podium serves group-limited routing only where that is 2")
    return problems


def _deepseek_problems(config: Mapping[str, Any]) -> list[str]:
    problems = []
    params = rope_parameters(config)
    kind = params["rope_type"]
    if kind not in ("default", "yarn"):
        problems.append(f"rope_parameters.rope_type={kind!r}: DeepSeek-V3 is mapped with the default RoPE or YaRN "
                        "(megatron-core's MLA takes those two)")
    if kind == "yarn":
        if params.get("attention_factor") is not None:
            problems.append(f"rope_parameters.attention_factor={params['attention_factor']}: megatron-core's YaRN "
                            "derives it from factor, mscale and mscale_all_dim")
        if params.get("truncate", True) is False:
            problems.append("rope_parameters.truncate=false: megatron-core's MLA rounds YaRN's correction range")
        if params.get("mscale_all_dim") and not params.get("mscale"):
            problems.append(f"rope_parameters.mscale={params.get('mscale')!r} with mscale_all_dim="
                            f"{params['mscale_all_dim']}: transformers then scales the rotary dims by "
                            "mscale(factor) and megatron-core by mscale(factor, 1) / mscale(factor, mscale_all_dim)")
    if (act := config.get("hidden_act", "silu")) != "silu":
        problems.append(f"hidden_act={act!r}: DeepSeek-V3's MLPs are mapped as SwiGLU (silu) only")
    if (method := config.get("topk_method", "noaux_tc")) != "noaux_tc":
        problems.append(f"topk_method={method!r}: DeepSeek-V3 routes with noaux_tc (a sigmoid score plus "
                        "e_score_correction_bias picks the experts), as transformers and megatron-core compute it")
    if (scoring := config.get("scoring_func", "sigmoid")) != "sigmoid":
        problems.append(f"scoring_func={scoring!r}: DeepSeek-V3's router is mapped with sigmoid scores only")
    if config.get("attention_bias"):
        problems.append("attention_bias=true: megatron-core's MLA projections have no bias")
    if (freq := config.get("moe_layer_freq", 1)) != 1:
        problems.append(f"moe_layer_freq={freq}: every layer from first_k_dense_replace on is MoE in transformers' "
                        "DeepSeek-V3; other layer mixes are not mapped")
    if not _int(config, "kv_lora_rank"):
        problems.append(f"kv_lora_rank={config.get('kv_lora_rank')!r}: DeepSeek-V3 needs multi-latent attention")
    return problems + _sigmoid_router_problems(config)


def _gpt_oss_problems(config: Mapping[str, Any]) -> list[str]:
    problems = []
    rope = gpt_oss_rope(config)
    if rope["rope_type"] not in ("yarn", "default"):
        problems.append(f"rope_parameters.rope_type={rope['rope_type']!r}: gpt-oss is mapped with YaRN or the "
                        "default RoPE only")
    if rope["rope_type"] == "yarn" and rope.get("attention_factor") is not None:
        problems.append(f"rope_parameters.attention_factor={rope['attention_factor']}: megatron-core derives YaRN's "
                        "attention factor from factor/mscale; an explicit one is not served")
    alpha = config.get("swiglu_alpha", GPT_OSS_SWIGLU_ALPHA)
    if float(alpha) != GPT_OSS_SWIGLU_ALPHA:
        problems.append(f"swiglu_alpha={alpha}: megatron-core's quick_gelu fixes the SwiGLU gain at "
                        f"{GPT_OSS_SWIGLU_ALPHA}")
    if not config.get("attention_bias", True):
        problems.append("attention_bias=false: gpt-oss is mapped with its q/k/v and o_proj biases")
    unknown = sorted(set(config.get("layer_types") or []) - set(GEMMA3_LAYER_TYPES))
    if unknown:
        problems.append(f"layer_types {unknown}: supported: {', '.join(GEMMA3_LAYER_TYPES)}")
    return problems


def gemma3_layer_types(config: Mapping[str, Any]) -> list[str]:
    """A Gemma 3 config's ``layer_types``, or what transformers makes of ``sliding_window_pattern``
    (default 6: every 6th layer global, the others sliding)."""
    kinds = config.get("layer_types")
    if kinds:
        return [str(k) for k in kinds]
    pattern = int(config.get("sliding_window_pattern") or 6)
    layers = (_int(config, "num_hidden_layers") or ("", 0))[1]
    return [GEMMA3_LAYER_TYPES[0] if (i + 1) % pattern else GEMMA3_LAYER_TYPES[1] for i in range(layers)]


def gemma3_rope(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Gemma 3's RoPE per layer type, ``{"full_attention": {...}, "sliding_attention": {...}}`` each
    with ``rope_type`` and ``rope_theta``: transformers 5's ``rope_parameters`` by layer type, or 4.x's
    ``rope_theta`` + ``rope_scaling`` (global) and ``rope_local_base_freq`` (sliding)."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and any(k in params for k in GEMMA3_LAYER_TYPES):
        full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    else:
        full = dict(config.get("rope_scaling") or params or {})
        full.setdefault("rope_theta", config.get("rope_theta", 1_000_000.0))
        local = {"rope_theta": config.get("rope_local_base_freq", 10_000.0)}
    for part in (full, local):
        part["rope_type"] = part.get("rope_type") or part.get("type") or "default"
    full.setdefault("rope_theta", 1_000_000.0)
    local.setdefault("rope_theta", 10_000.0)
    return {"full_attention": full, "sliding_attention": local}


def _gemma3_problems(config: Mapping[str, Any]) -> list[str]:
    problems = [f"{key}={config[key]}: logit softcapping is not served (megatron-core's attention and podium's "
                "output layer do not cap)"
                for key in ("attn_logit_softcapping", "final_logit_softcapping") if config.get(key) is not None]
    problems += [f"{key}=true: Gemma 3 is mapped causal and without attention biases"
                 for key in ("use_bidirectional_attention", "attention_bias") if config.get(key)]
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        problems.append(f"hidden_activation={act!r}: Gemma 3's MLPs are mapped as gated tanh-GELU only")
    rope = gemma3_rope(config)
    if (kind := rope["full_attention"]["rope_type"]) not in ("default", "linear"):
        problems.append(f"rope_parameters.full_attention.rope_type={kind!r}: supported: default, linear")
    if (kind := rope["sliding_attention"]["rope_type"]) != "default":
        problems.append(f"rope_parameters.sliding_attention.rope_type={kind!r}: the sliding layers' RoPE is "
                        "mapped default only")
    unknown = sorted(set(gemma3_layer_types(config)) - set(GEMMA3_LAYER_TYPES))
    if unknown:
        problems.append(f"layer_types {unknown}: supported: {', '.join(GEMMA3_LAYER_TYPES)}")
    return problems


def _glm_problems(config: Mapping[str, Any]) -> list[str]:
    problems = []
    if (kind := rope_type(config)) != "default":
        problems.append(f"rope_parameters.rope_type={kind!r}: GLM-4.5 is mapped with the default RoPE only")
    if (act := config.get("hidden_act", "silu")) != "silu":
        problems.append(f"hidden_act={act!r}: GLM-4.5's MLPs are mapped as SwiGLU (silu) only")
    problems += _sigmoid_router_problems(config)
    attention = _attention(config)
    factor = partial_rotary_factor(config, GLM_PARTIAL_ROTARY)
    if attention is not None:
        rotary = attention[2] * factor
        if not 0 < factor <= 1 or rotary != int(rotary) or int(rotary) % 2:
            problems.append(f"partial_rotary_factor={factor}: head_dim {attention[2]} × {factor} = {rotary} is not a "
                            "whole even number of rotary dimensions")
    return problems


def layout_problems(config: Mapping[str, Any], layout: ParallelLayout) -> list[str]:
    """What podium cannot serve in this model (:func:`field_problems`) and what the layout cannot
    split in it, each naming the config key and the arithmetic."""
    tp, cp, ep = layout.tensor_model_parallel_size, layout.context_parallel_size, layout.expert_model_parallel_size
    config = language_config(config)
    problems: list[str] = field_problems(config)
    attention = _attention(config)
    if attention is not None:
        problem = attention_tp_problem(*attention, tp)
        if problem:
            problems.append(f"num_attention_heads={attention[0]}, num_key_value_heads={attention[1]}: {problem}")
    if is_deepseek_v3(config):
        problems.extend(_mla_problems(config, tp))
    if config.get("model_type") == NEMOTRON_H:
        problems.extend(_mamba_problems(config, tp, cp))
        problems.extend(_pipeline_problems(config, layout.pipeline_model_parallel_size))
    experts = experts_of(config)
    if experts and experts % ep:
        problems.append(f"{experts} experts cannot be split over EP{ep} ({experts} / {ep} is not a whole number "
                        f"per rank); choose an EP that divides {experts}")
    if experts:
        problems.extend(_expert_mlp_problems(config, tp, layout.expert_tensor_parallel_size))
    return problems


def _pattern_key(config: Mapping[str, Any]) -> str:
    return "hybrid_override_pattern" if config.get("hybrid_override_pattern") else "layers_block_type"


def _pipeline_problems(config: Mapping[str, Any], pp: int) -> list[str]:
    layers = len(layer_pattern(config))
    if pp == 1 or not layers or not layers % pp:
        return []
    return [f"{_pattern_key(config)} has {layers} layers: PP{pp} must divide them ({layers} / {pp} is not whole; "
            "megatron-core's hybrid model gives every pipeline stage the same number of consecutive layers)"]


def _expert_mlp_problems(config: Mapping[str, Any], tp: int, etp: int) -> list[str]:
    problems = []
    routed = _int(config, "moe_intermediate_size")
    if config.get("model_type") == GPT_OSS:  # gpt-oss: every expert's MLP is intermediate_size
        routed = _int(config, "intermediate_size")
    if routed and routed[1] % etp:
        problems.append(f"{routed[0]}={routed[1]}: ETP{etp} must divide each routed expert's MLP "
                        f"({routed[1]} / {etp} is not whole)")
    shared = _int(config, "moe_shared_expert_intermediate_size", "shared_expert_intermediate_size")
    if (config.get("model_type") == GLM4_MOE or is_deepseek_v3(config)) and routed:
        # GLM, DeepSeek-V3: n_shared_experts experts of moe_intermediate_size
        count = config.get("n_shared_experts", 1)
        shared = ("moe_intermediate_size × n_shared_experts", routed[1] * int(count)) if count else None
    if shared and shared[1] % tp:
        problems.append(f"{shared[0]}={shared[1]}: TP{tp} must divide the shared expert's MLP, which is split "
                        f"over the attention TP ({shared[1]} / {tp} is not whole)")
    return problems


def _mla_problems(config: Mapping[str, Any], tp: int) -> list[str]:
    """Multi-latent attention over TP: megatron-core's local MLA splits the latent down-projections'
    rows over TP (``q_lora_rank``, ``kv_lora_rank + qk_rope_head_dim``) and gathers them."""
    problems = []
    q_rank = (_int(config, "q_lora_rank") or ("", 0))[1]
    kv_rank = (_int(config, "kv_lora_rank") or ("", 0))[1]
    rope = (_int(config, "qk_rope_head_dim") or ("", 0))[1]
    if q_rank % tp:
        problems.append(f"q_lora_rank={q_rank}: TP{tp} must divide the query latent ({q_rank} / {tp} is not whole)")
    if (kv_rank + rope) % tp:
        problems.append(f"kv_lora_rank={kv_rank}, qk_rope_head_dim={rope}: TP{tp} must divide the key/value latent "
                        f"and the rotary key ({kv_rank} + {rope} = {kv_rank + rope}; / {tp} is not whole)")
    return problems


def _mamba_problems(config: Mapping[str, Any], tp: int, cp: int) -> list[str]:
    heads = (_int(config, "mamba_num_heads") or ("", 0))[1]
    groups = (_int(config, "n_groups") or ("", 0))[1]
    problems = []
    if heads and heads % tp:
        problems.append(f"mamba_num_heads={heads}: TP{tp} must divide the Mamba heads ({heads} / {tp} is not whole)")
    if groups and groups % tp:
        problems.append(f"n_groups={groups}: TP{tp} must divide the Mamba groups ({groups} / {tp} is not whole)")
    if problems or cp == 1 or not (heads and groups):
        return problems
    heads_tp, groups_tp = heads // tp, groups // tp
    if heads_tp % cp:
        problems.append(f"mamba_num_heads={heads}: CP{cp} must divide the Mamba heads of a TP rank "
                        f"({heads} / TP{tp} = {heads_tp}; {heads_tp} / {cp} is not whole)")
    if (groups_tp < cp and cp % groups_tp) or (groups_tp >= cp and groups_tp % cp):
        problems.append(f"n_groups={groups}: the Mamba groups of a TP rank ({groups} / TP{tp} = {groups_tp}) must "
                        f"divide CP{cp} or be divided by it")
    return problems


def architecture_needs(config: Mapping[str, Any], layout: ParallelLayout) -> list[str]:
    """What this model at this layout takes, in words (nothing where it asks nothing special)."""
    config = language_config(config)
    tp, cp = layout.tensor_model_parallel_size, layout.context_parallel_size
    ep, etp = layout.expert_model_parallel_size, layout.expert_tensor_parallel_size
    nemotron = config.get("model_type") == NEMOTRON_H
    pattern = layer_pattern(config) if nemotron else ""
    lines: list[str] = []
    if nemotron:
        counts = ", ".join(f"{pattern.count(letter)} {name}" for letter, name in _LAYER_KINDS.items()
                           if pattern.count(letter))
        lines.append(f"Nemotron-H ({len(pattern)} layers: {counts}): the GPU nodes' Python must import the Mamba "
                     f"kernels ({' and '.join(MAMBA_KERNELS)}, built for the nodes' torch and CUDA: "
                     f"{MAMBA_KERNELS_INSTALL})")
        heads = (_int(config, "mamba_num_heads") or ("", 0))[1]
        groups = (_int(config, "n_groups") or ("", 0))[1]
        if heads and groups and not heads % tp and not groups % tp:
            split = (f"Mamba: TP{tp} splits mamba_num_heads={heads} into {heads // tp} per rank and "
                     f"n_groups={groups} into {groups // tp}")
            if cp > 1 and not (heads // tp) % cp:
                split += (f"; CP{cp} swaps the sequence split for a head split inside each Mamba layer "
                          f"({heads // tp // cp} heads per rank"
                          + (f", each group's state on {cp // (groups // tp)} CP ranks)" if groups // tp < cp else ")"))
            lines.append(split)
    attention = _attention(config)
    if attention is not None and attention[1] < tp and attention_tp_problem(*attention, tp) is None:
        heads, groups, _ = attention
        where = f" ({pattern.count('*')} attention layers)" if nemotron else ""
        lines.append(f"attention: {groups} KV group(s) (num_key_value_heads) for TP{tp}: supported — each rank "
                     f"holds 1/{tp} of the fused QKV rows, all-gathers the fused output in every attention "
                     f"layer{where} and keeps group rank // {tp // groups} with {heads // tp} of its query heads")
    experts = experts_of(config)
    if experts and not experts % ep:
        topk = (_int(config, "num_experts_per_tok") or ("", 0))[1]
        latent = (_int(config, "moe_latent_size") or ("", 0))[1]
        line = (f"experts: {experts} over EP{ep} = {experts // ep} per rank"
                + (f", top-{topk}" if topk else "") + (f", latent MoE (moe_latent_size={latent})" if latent else ""))
        routed = _int(config, "moe_intermediate_size")
        if etp > 1 and routed and not routed[1] % etp:
            line += (f"; ETP{etp} splits each expert's MLP (moe_intermediate_size={routed[1]}) into "
                     f"{routed[1] // etp} per rank" + ("; the latent projections are whole on every rank"
                                                       if latent else ""))
        if ep * etp > layout.gpus_per_node:
            nodes = -(-ep * etp // layout.gpus_per_node)
            moe_layers = f" of each of the {pattern.count('E')} MoE layers" if nemotron else ""
            line += (f"; EP{ep}·ETP{etp} spans {nodes} nodes ({layout.gpus_per_node} GPUs each): the token "
                     f"all-to-all{moe_layers} crosses the network")
        lines.append(line)
    if is_deepseek_v3(config) and attention is not None and not _mla_problems(config, tp):
        q_rank = config.get("q_lora_rank")
        lines.append(f"attention: multi-latent (kv_lora_rank={config.get('kv_lora_rank')}, q_lora_rank={q_rank}, "
                     f"{'YaRN' if deepseek_yarn(config) else 'RoPE'} on qk_rope_head_dim="
                     f"{config.get('qk_rope_head_dim')}); TP{tp} gives each rank {attention[0] // tp} of the "
                     f"{attention[0]} heads and all-gathers the latents (megatron-core's MLA)")
    if (block := fp8_block_size(config)) is not None:
        lines.append(f"weights: fp8 (e4m3) in {block[0]}×{block[1]} blocks with weight_scale_inv, dequantized to "
                     "the teacher's precision as each rank reads its slices (its GPUs hold the dequantized "
                     "weights: twice the fp8 bytes in bf16)")
    pp = layout.pipeline_model_parallel_size
    if nemotron and pp > 1 and pattern and not len(pattern) % pp:
        lines.append(_pipeline_stages(pattern, pp))
    if nemotron and cp > 1:
        lines.append(f"CP{cp} without sequence packing: NeMo RL's own Megatron teacher refuses CP > 1 unless "
                     "policy.sequence_packing.enabled (the Ultra recipe sets it); podium does not pack: it "
                     f"right-pads each micro-batch to a multiple of 2·CP = {2 * cp} and gives each CP rank its two "
                     "load-balanced chunks, which Megatron's Mamba layers put back in order for the scan")
    method = quant_method(config)
    if method in READABLE_QUANTIZATION.get(str(config.get("model_type")), ()):
        lines.append(f"{method.upper()} experts (quantization_config.quant_method={method!r}): each rank dequantizes "
                     "its own experts as it reads them, one tensor at a time, to the teacher's precision; in GPU "
                     "memory they take their dequantized size (bf16: ~3.8x their bytes on disk)")
    return lines


def _pipeline_stages(pattern: str, pp: int) -> str:
    """The layers each pipeline stage of a Nemotron-H pattern holds, in words (``pp`` divides it)."""
    per = len(pattern) // pp
    stages = []
    for stage in range(pp):
        part = pattern[stage * per: (stage + 1) * per]
        counts = ", ".join(f"{part.count(letter)} {name}" for letter, name in _LAYER_KINDS.items()
                           if part.count(letter))
        stages.append(f"stage {stage}: {counts}")
    return f"PP{pp}: {per} consecutive layers per pipeline stage ({'; '.join(stages)})"
