"""HF checkpoints read directly into a Megatron-core GPTModel, each rank reading only its slices.

This module owns:

- ``describe_hf_config``: the normalised architecture (:class:`ModelDescription`) of an HF
  ``config.json`` for the families podium maps by hand: Llama, Mistral, Qwen2 (q/k/v bias),
  Qwen3 (q/k RMSNorm), the MoE models Qwen3-MoE (q/k norm, layer mix by ``decoder_sparse_step``
  / ``mlp_only_layers``, ``norm_topk_prob``), Qwen2-MoE (Qwen3-MoE's routing and layer mix, q/k/v
  bias, a shared expert behind a sigmoid gate) and Mixtral, and GPT-2. Anything else is a
  ``ValueError`` naming the checkpoint, the architecture and the supported list.
- :class:`SafetensorsCheckpoint`: the tensors of a directory (``model.safetensors`` or a sharded
  ``model.safetensors.index.json``), opened lazily with ``safe_open``; ``get_slice`` reads only the
  requested rows/columns from disk.
- ``load_hf_weights``: for every parameter the rank's model holds, the HF tensor(s) it comes from
  and the rank's slice of them (per-architecture name/layout map), copied into the parameter. No
  rank reads a full tensor it only holds part of, nothing is written next to the checkpoint.

Layouts (Megatron side, TP rank ``r`` of ``tp``):

- ``linear_qkv``: per query group ``[q_0 … q_{n/g-1}, k, v]`` × ``head_dim`` rows, the rank's groups
  ``[r·g/tp, (r+1)·g/tp)``; HF's separate q/k/v (Llama family) or GPT-2's fused Conv1D columns.
- ``linear_fc1`` (SwiGLU): ``cat[gate_r, up_r]`` — the gate and up halves are each split across ranks
  (partition stride 2).
- row-parallel ``linear_proj``/``linear_fc2``: the rank's input columns; biases whole.
- vocabulary (embedding, output layer): rows ``[r·Vp/tp, (r+1)·Vp/tp)`` of the padded vocabulary;
  rows at or past the real vocabulary are zeros (their logits are masked at the head).
- routed experts (local spec, ``SequentialMLP``): the router ``[E, h]`` whole on every rank;
  EP rank ``e`` holds experts ``[e·E/EP, (e+1)·E/EP)``, each split over expert-TP as a dense
  SwiGLU MLP over TP (fc1 ``cat[gate_r, up_r]``, fc2 the rank's columns).
- shared expert (Qwen2-MoE ``shared_expert``, Megatron ``SharedExpertMLP``): split over the
  attention TP like a dense SwiGLU MLP; its gate ``[1, h]`` (``shared_expert_gate``) whole on every
  rank. Megatron computes ``sigmoid(x · gateᵀ) · shared(x)`` and adds it to the routed output, as
  transformers' ``Qwen2MoeSparseMoeBlock`` does.
- GPT-2's Conv1D weights are ``[in, out]``: sliced on the other axis and transposed.
- tied output layer (``tie_word_embeddings``): the last PP stage's ``output_layer.weight`` comes
  from the embedding tensor.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from podium.config.checkpoints import ARCHITECTURE_FAMILIES, SAFE_INDEX, SAFE_SINGLE, SUPPORTED_ARCHITECTURES

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


# HF architecture name -> family handled by the maps below (the one list: config.checkpoints).
_FAMILIES = ARCHITECTURE_FAMILIES
# HF names of an MoE layer's router and experts, per architecture: (block prefix, router, expert
# gate/up/down projections).
_MOE_NAMES: dict[str, tuple[str, str, tuple[str, str, str]]] = {
    "Qwen3MoeForCausalLM": ("mlp.", "gate", ("gate_proj", "up_proj", "down_proj")),
    "Qwen2MoeForCausalLM": ("mlp.", "gate", ("gate_proj", "up_proj", "down_proj")),
    "MixtralForCausalLM": ("block_sparse_moe.", "gate", ("w1", "w3", "w2")),
}


@dataclass(frozen=True)
class ModelDescription:
    """What podium needs to know about a checkpoint's architecture (from its HF config)."""

    architecture: str
    family: str  # "llama" (Llama/Mistral/Qwen2/Qwen3) or "gpt2"
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
    activation: str  # "swiglu" | "gelu_tanh" | "gelu"
    position_embedding_type: str  # "rope" | "learned_absolute"
    rotary_base: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None  # {"rope_type": "llama3"|"linear", "factor": …}
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tied_embeddings: bool = False
    sliding_window: int | None = None
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
    hf_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def any_linear_bias(self) -> bool:
        return self.attn_out_bias or self.mlp_bias

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("hf_config")
        return out


def _rope(config: Mapping[str, Any], checkpoint: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling) from either transformers 5 ``rope_parameters`` or 4.x fields."""
    params = dict(config.get("rope_parameters") or {})
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = dict(config.get("rope_scaling") or {}) or {k: v for k, v in params.items() if k != "rope_theta"}
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type in (None, "default"):
        return float(theta), None
    if rope_type == "linear":
        return float(theta), {"rope_type": "linear", "factor": float(scaling["factor"])}
    if rope_type == "llama3":
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        for key, expected in fixed.items():
            if float(scaling.get(key, expected)) != float(expected):
                raise ValueError(
                    f"checkpoint {checkpoint}: rope scaling llama3 with {key}={scaling.get(key)} is not "
                    f"supported (Megatron's llama3 scaling fixes {key}={expected})"
                )
        return float(theta), {"rope_type": "llama3", "factor": float(scaling.get("factor", 8.0))}
    raise ValueError(
        f"checkpoint {checkpoint}: rope scaling type {rope_type!r} is not supported "
        "(supported: default, linear, llama3)"
    )


def describe_hf_config(config: Mapping[str, Any], checkpoint: str = "<config>") -> ModelDescription:
    """Normalise an HF ``config.json`` mapping; unknown architectures are a ``ValueError``."""
    archs = list(config.get("architectures") or [])
    arch = next((a for a in archs if a in _FAMILIES), None)
    if arch is None:
        raise ValueError(
            f"checkpoint {checkpoint}: architecture {archs or config.get('model_type')!r} is not supported "
            f"for direct HF loading (supported: {', '.join(SUPPORTED_ARCHITECTURES)}); convert it with "
            "megatron-bridge to a torch_dist checkpoint"
        )
    family = _FAMILIES[arch]
    if family == "gpt2":
        act = config.get("activation_function", "gelu_new")
        activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
        if act not in activations:
            raise ValueError(f"checkpoint {checkpoint}: GPT-2 activation_function {act!r} is not supported")
        if config.get("scale_attn_by_inverse_layer_idx") or not config.get("scale_attn_weights", True):
            raise ValueError(
                f"checkpoint {checkpoint}: GPT-2 attention scaling options "
                "scale_attn_by_inverse_layer_idx/scale_attn_weights=False are not supported"
            )
        hidden = int(config["n_embd"])
        heads = int(config["n_head"])
        return ModelDescription(
            architecture=arch,
            family=family,
            num_layers=int(config["n_layer"]),
            hidden_size=hidden,
            ffn_hidden_size=int(config.get("n_inner") or 4 * hidden),
            num_attention_heads=heads,
            num_query_groups=heads,
            head_dim=hidden // heads,
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config["n_positions"]),
            normalization="LayerNorm",
            norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
            activation=activations[act],
            position_embedding_type="learned_absolute",
            qkv_bias=True,
            attn_out_bias=True,
            mlp_bias=True,
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
            hf_config=dict(config),
        )

    # Llama family
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"checkpoint {checkpoint}: hidden_act {act!r} is not supported (SwiGLU needs silu)")
    model_type = config.get("model_type", "")
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and config.get("use_sliding_window"):
        raise ValueError(f"checkpoint {checkpoint}: {model_type} with use_sliding_window=true is not supported")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    theta, scaling = _rope(config, checkpoint)
    attention_bias = bool(config.get("attention_bias", False))
    sliding = config.get("sliding_window") if model_type in ("mistral", "mixtral") else None
    layers = int(config["num_hidden_layers"])
    return ModelDescription(
        architecture=arch,
        family=family,
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        normalization="RMSNorm",
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        activation="swiglu",
        position_embedding_type="rope",
        rotary_base=theta,
        rope_scaling=scaling,
        # Qwen2: q/k/v bias, none on o_proj; Qwen2-MoE says so with ``qkv_bias`` (transformers 5;
        # always on before it)
        qkv_bias=(attention_bias or arch == "Qwen2ForCausalLM"
                  or (arch == "Qwen2MoeForCausalLM" and bool(config.get("qkv_bias", True)))),
        attn_out_bias=attention_bias and arch not in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        sliding_window=int(sliding) if sliding else None,
        **(_moe_fields(config, arch, layers, checkpoint) if arch in _MOE_NAMES else {}),
        hf_config=dict(config),
    )


def _moe_fields(config: Mapping[str, Any], arch: str, layers: int, checkpoint: str) -> dict[str, Any]:
    """The routed-expert fields of a Qwen3-MoE / Qwen2-MoE / Mixtral config (names differ by family
    and by transformers version: ``num_experts`` or ``num_local_experts``)."""
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    topk = int(config.get("num_experts_per_tok") or 0)
    if experts < 1 or not 1 <= topk <= experts:
        raise ValueError(f"checkpoint {checkpoint}: {arch} with {experts} experts and num_experts_per_tok={topk}")
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    if shared and arch != "Qwen2MoeForCausalLM":
        raise ValueError(f"checkpoint {checkpoint}: {arch} with shared_expert_intermediate_size={shared}: "
                         "shared experts are mapped for Qwen2MoeForCausalLM only")
    # Qwen2-MoE: a shared expert (when its size is > 0; with 0 transformers' is an empty MLP whose
    # output is 0) always behind its sigmoid gate
    fields: dict[str, Any] = dict(moe_shared_ffn_hidden_size=shared, moe_shared_expert_gate=bool(shared))
    if arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        step = int(config.get("decoder_sparse_step") or 1)
        dense = {int(i) for i in (config.get("mlp_only_layers") or [])}
        moe_layers = tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))
        ffn = int(config["moe_intermediate_size"])
        norm = bool(config.get("norm_topk_prob", False))
    else:  # Mixtral: every layer, experts of intermediate_size, top-k weights renormalised
        moe_layers = (True,) * layers
        ffn = int(config["intermediate_size"])
        norm = True
    return dict(num_experts=experts, moe_topk=topk, moe_ffn_hidden_size=ffn, norm_topk_prob=norm,
                moe_layers=moe_layers, **fields)


class SafetensorsCheckpoint:
    """The tensors of an HF checkpoint directory, read lazily (single file or sharded index)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        index = self.path / SAFE_INDEX
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"checkpoint {self.path}: {SAFE_INDEX} has no weight_map")
            self._files = {name: self.path / fname for name, fname in weight_map.items()}
        elif (self.path / SAFE_SINGLE).is_file():
            from safetensors import safe_open

            single = self.path / SAFE_SINGLE
            with safe_open(str(single), framework="pt") as handle:
                self._files = {name: single for name in handle.keys()}
        else:
            raise ValueError(f"checkpoint {self.path}: neither {SAFE_SINGLE} nor {SAFE_INDEX} found")
        self._handles: dict[Path, Any] = {}
        self.bytes_read = 0

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def names(self) -> list[str]:
        return list(self._files)

    def _handle(self, name: str) -> Any:
        if name not in self._files:
            raise KeyError(name)
        file = self._files[name]
        handle = self._handles.get(file)
        if handle is None:
            from safetensors import safe_open

            if not file.is_file():
                raise ValueError(f"checkpoint {self.path}: shard {file.name} (for tensor {name!r}) is missing")
            handle = safe_open(str(file), framework="pt")
            self._handles[file] = handle
        return handle

    def _slice(self, name: str) -> Any:
        try:
            return self._handle(name).get_slice(name)
        except KeyError:
            raise ValueError(f"checkpoint {self.path}: tensor {name!r} is missing") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> "torch.Tensor":
        """Read ``name[rows, cols]`` (only those bytes are read from disk)."""
        sl = self._slice(name)
        shape = sl.get_shape()
        if cols is not None:
            tensor = sl[rows or slice(None), cols]
        elif rows is not None:
            tensor = sl[rows]
        else:
            tensor = sl[:] if len(shape) > 0 else sl[()]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor

    def close(self) -> None:
        self._handles.clear()


# ----------------------------------------------------------------------------------------------
# Name/layout maps
# ----------------------------------------------------------------------------------------------

# TransformerEngine spec names -> local spec names (the maps below speak local-spec names).
_TE_TO_LOCAL = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class RankLayout:
    """What a rank holds: its TP coordinates, the padded vocabulary and, for routed experts, its
    expert-parallel rank (which experts) and expert-TP rank (which slice of each)."""

    tp_rank: int
    tp_size: int
    padded_vocab_size: int
    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1


class _Reader:
    """Slice arithmetic shared by the family maps."""

    def __init__(self, ckpt: SafetensorsCheckpoint, desc: ModelDescription, layout: RankLayout) -> None:
        self.ckpt = ckpt
        self.desc = desc
        self.lay = layout

    def part(self, total: int) -> slice:
        size = total // self.lay.tp_size
        return slice(self.lay.tp_rank * size, (self.lay.tp_rank + 1) * size)

    def vocab_rows(self, name: str, transpose: bool = False) -> "torch.Tensor":
        import torch

        per = self.lay.padded_vocab_size // self.lay.tp_size
        start, end = self.lay.tp_rank * per, (self.lay.tp_rank + 1) * per
        real = self.ckpt.shape(name)[0]
        out = torch.zeros(per, self.desc.hidden_size, dtype=torch.float32)
        if start < real:
            piece = self.ckpt.read(name, rows=slice(start, min(end, real)))
            out[: piece.shape[0]] = piece
        return out

    def groups(self) -> tuple[int, int]:
        per = self.desc.num_query_groups // self.lay.tp_size
        return self.lay.tp_rank * per, (self.lay.tp_rank + 1) * per


def _fuse_qkv(q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor", groups: int, q_per_group: int, head_dim: int) -> "torch.Tensor":
    """[q rows of the rank's groups], [k rows], [v rows] -> Megatron's per-group [q…, k, v] rows."""
    import torch

    rest = q.shape[1:]
    q = q.reshape(groups, q_per_group * head_dim, *rest)
    k = k.reshape(groups, head_dim, *rest)
    v = v.reshape(groups, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(groups * (q_per_group + 2) * head_dim, *rest)


_EXPERT_RE = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
_SHARED = "mlp.shared_experts."


def _moe_sources(r: _Reader, layer: int, local: str) -> "torch.Tensor | None":
    """An MoE layer's router and this rank's experts: local expert ``i`` of EP rank ``e`` is
    global expert ``e · E/EP + i``; each is split over expert-TP like a dense MLP over TP."""
    import torch

    d = r.desc
    block, router, (gate, up, down) = _MOE_NAMES[d.architecture]
    p = f"model.layers.{layer}.{block}"
    if local == "mlp.router.weight":
        return r.ckpt.read(p + f"{router}.weight")
    if local.startswith(_SHARED):
        return _shared_expert_sources(r, p, local[len(_SHARED):])
    match = _EXPERT_RE.match(local)
    if match is None:
        return None
    lay = r.lay
    expert = lay.ep_rank * (d.num_experts // lay.ep_size) + int(match.group(1))
    size = d.moe_ffn_hidden_size // lay.etp_size
    part = slice(lay.etp_rank * size, (lay.etp_rank + 1) * size)
    e = f"{p}experts.{expert}."
    if match.group(2) == "linear_fc1":
        return torch.cat([r.ckpt.read(e + f"{gate}.weight", rows=part), r.ckpt.read(e + f"{up}.weight", rows=part)])
    return r.ckpt.read(e + f"{down}.weight", cols=part)


def _shared_expert_sources(r: _Reader, p: str, local: str) -> "torch.Tensor | None":
    """Qwen2-MoE's ``shared_expert`` (split over the attention TP as a dense SwiGLU MLP) and its
    ``shared_expert_gate`` ``[1, h]`` (whole)."""
    import torch

    if local == "gate_weight":
        return r.ckpt.read(p + "shared_expert_gate.weight")
    ffn = r.part(r.desc.moe_shared_ffn_hidden_size)
    s = p + "shared_expert."
    if local == "linear_fc1.weight":
        return torch.cat([r.ckpt.read(s + "gate_proj.weight", rows=ffn), r.ckpt.read(s + "up_proj.weight", rows=ffn)])
    if local == "linear_fc2.weight":
        return r.ckpt.read(s + "down_proj.weight", cols=ffn)
    return None


def _llama_sources(r: _Reader, layer: int | None, local: str) -> "torch.Tensor | None":
    import torch

    d = r.desc
    if layer is not None and d.is_moe and d.moe_layers[layer] and local.startswith("mlp."):
        return _moe_sources(r, layer, local)
    if layer is None:
        if local == "embedding.word_embeddings.weight":
            return r.vocab_rows("model.embed_tokens.weight")
        if local == "decoder.final_layernorm.weight":
            return r.ckpt.read("model.norm.weight")
        if local == "output_layer.weight":
            name = "model.embed_tokens.weight" if d.tied_embeddings else "lm_head.weight"
            if not d.tied_embeddings and name not in r.ckpt and "model.embed_tokens.weight" in r.ckpt:
                raise ValueError(f"checkpoint {r.ckpt.path}: tensor 'lm_head.weight' is missing")
            return r.vocab_rows(name)
        return None
    p = f"model.layers.{layer}."
    g0, g1 = r.groups()
    qpg = d.num_attention_heads // d.num_query_groups
    hd = d.head_dim
    ffn = r.part(d.ffn_hidden_size)
    if local == "input_layernorm.weight":
        return r.ckpt.read(p + "input_layernorm.weight")
    if local == "pre_mlp_layernorm.weight":
        return r.ckpt.read(p + "post_attention_layernorm.weight")
    if local in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = local.rsplit(".", 1)[1]
        if kind == "bias" and not d.qkv_bias:
            return torch.zeros(0)  # sentinel: bias exists only because of add_bias_linear
        q = r.ckpt.read(p + f"self_attn.q_proj.{kind}", rows=slice(g0 * qpg * hd, g1 * qpg * hd))
        k = r.ckpt.read(p + f"self_attn.k_proj.{kind}", rows=slice(g0 * hd, g1 * hd))
        v = r.ckpt.read(p + f"self_attn.v_proj.{kind}", rows=slice(g0 * hd, g1 * hd))
        return _fuse_qkv(q, k, v, g1 - g0, qpg, hd)
    if local == "self_attention.q_layernorm.weight":
        return r.ckpt.read(p + "self_attn.q_norm.weight")
    if local == "self_attention.k_layernorm.weight":
        return r.ckpt.read(p + "self_attn.k_norm.weight")
    if local == "self_attention.linear_proj.weight":
        return r.ckpt.read(p + "self_attn.o_proj.weight", cols=r.part(d.num_attention_heads * hd))
    if local == "self_attention.linear_proj.bias":
        return r.ckpt.read(p + "self_attn.o_proj.bias") if d.attn_out_bias else torch.zeros(0)
    if local == "mlp.linear_fc1.weight":
        gate = r.ckpt.read(p + "mlp.gate_proj.weight", rows=ffn)
        up = r.ckpt.read(p + "mlp.up_proj.weight", rows=ffn)
        return torch.cat([gate, up], dim=0)
    if local == "mlp.linear_fc1.bias":
        if not d.mlp_bias:
            return torch.zeros(0)
        return torch.cat([r.ckpt.read(p + "mlp.gate_proj.bias", rows=ffn), r.ckpt.read(p + "mlp.up_proj.bias", rows=ffn)])
    if local == "mlp.linear_fc2.weight":
        return r.ckpt.read(p + "mlp.down_proj.weight", cols=ffn)
    if local == "mlp.linear_fc2.bias":
        return r.ckpt.read(p + "mlp.down_proj.bias") if d.mlp_bias else torch.zeros(0)
    return None


def _gpt2_prefix(ckpt: SafetensorsCheckpoint) -> str:
    return "transformer." if "transformer.wte.weight" in ckpt else ""


def _gpt2_sources(r: _Reader, layer: int | None, local: str) -> "torch.Tensor | None":
    d = r.desc
    t = _gpt2_prefix(r.ckpt)
    if layer is None:
        if local in ("embedding.word_embeddings.weight", "output_layer.weight"):
            return r.vocab_rows(t + "wte.weight")
        if local == "embedding.position_embeddings.weight":
            return r.ckpt.read(t + "wpe.weight")
        if local.startswith("decoder.final_layernorm."):
            return r.ckpt.read(t + "ln_f." + local.rsplit(".", 1)[1])
        return None
    p = f"{t}h.{layer}."
    h = d.hidden_size
    hd = d.head_dim
    g0, g1 = r.groups()  # GPT-2: one group per head
    ffn = r.part(d.ffn_hidden_size)
    kind = local.rsplit(".", 1)[1]
    if local.startswith("input_layernorm."):
        return r.ckpt.read(p + "ln_1." + kind)
    if local.startswith("pre_mlp_layernorm."):
        return r.ckpt.read(p + "ln_2." + kind)
    if local in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        name = p + f"attn.c_attn.{kind}"
        cols = [slice(base + g0 * hd, base + g1 * hd) for base in (0, h, 2 * h)]
        if kind == "weight":  # Conv1D [in, 3h]: take the rank's columns, then transpose to [out, in]
            q, k, v = (r.ckpt.read(name, cols=c).t() for c in cols)
        else:
            q, k, v = (r.ckpt.read(name, rows=c) for c in cols)
        return _fuse_qkv(q, k, v, g1 - g0, 1, hd)
    if local == "self_attention.linear_proj.weight":
        return r.ckpt.read(p + "attn.c_proj.weight", rows=r.part(h)).t()
    if local == "self_attention.linear_proj.bias":
        return r.ckpt.read(p + "attn.c_proj.bias")
    if local == "mlp.linear_fc1.weight":
        return r.ckpt.read(p + "mlp.c_fc.weight", cols=ffn).t()
    if local == "mlp.linear_fc1.bias":
        return r.ckpt.read(p + "mlp.c_fc.bias", rows=ffn)
    if local == "mlp.linear_fc2.weight":
        return r.ckpt.read(p + "mlp.c_proj.weight", rows=ffn).t()
    if local == "mlp.linear_fc2.bias":
        return r.ckpt.read(p + "mlp.c_proj.bias")
    return None


_MAPS: dict[str, Callable[[_Reader, int | None, str], "torch.Tensor | None"]] = {
    "llama": _llama_sources,
    "gpt2": _gpt2_sources,
}


def _global_layer_numbers(model: Any) -> dict[int, int]:
    """Local decoder layer index -> global 0-based layer index (PP stages hold a range)."""
    return {i: int(layer.layer_number) - 1 for i, layer in enumerate(model.decoder.layers)}


def load_hf_weights(
    model: Any,
    checkpoint: str | os.PathLike[str],
    desc: ModelDescription,
    layout: RankLayout,
) -> dict[str, Any]:
    """Fill every parameter of this rank's ``model`` from the HF checkpoint; return load stats.

    Raises ``ValueError`` naming the checkpoint and the key for a missing tensor, a shape that does
    not match, or a Megatron parameter the map does not know.
    """
    import torch

    ckpt = SafetensorsCheckpoint(checkpoint)
    reader = _Reader(ckpt, desc, layout)
    source = _MAPS[desc.family]
    layers = _global_layer_numbers(model)
    loaded = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            layer: int | None = None
            local = name
            match = _LAYER_RE.match(name)
            if match:
                layer = layers[int(match.group(1))]
                local = match.group(2)
                local = _TE_TO_LOCAL.get(local, local)
            try:
                tensor = source(reader, layer, local)
            except KeyError as exc:
                raise ValueError(f"checkpoint {checkpoint}: tensor {exc.args[0]!r} is missing") from None
            if tensor is None:
                raise ValueError(
                    f"checkpoint {checkpoint}: no HF source for Megatron parameter {name!r} "
                    f"({desc.architecture} map)"
                )
            if tensor.numel() == 0:  # bias the HF model does not have: zeros
                param.zero_()
                continue
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"checkpoint {checkpoint}: tensor for Megatron parameter {name!r} has shape "
                    f"{tuple(tensor.shape)}, expected {tuple(param.shape)} (TP rank {layout.tp_rank}/"
                    f"{layout.tp_size})"
                )
            param.copy_(tensor)
            loaded += 1
    stats = {"parameters": loaded, "bytes_read": ckpt.bytes_read}
    ckpt.close()
    logger.info("loaded %d parameters (%.1f MB read) from %s", loaded, ckpt.bytes_read / 2**20, checkpoint)
    return stats
