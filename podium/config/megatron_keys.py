"""What a teacher's ``megatron_cfg_overrides`` may hold and what becomes of each key: the one rule
the login node (``podium plan``, ``up``, ``doctor``) and the nodes (``split_overrides``, before the
model is built) apply, so a key the plan accepts is one the node accepts.

A key is, in this order:

- a podium model option (:data:`MODEL_KEYS`): podium uses it itself (the vocabulary padding);
- refused with a reason (:data:`REFUSED_KEYS`): it belongs elsewhere (``fp32_lm_head`` is a teacher
  setting, as in NeMo RL) or podium cannot honour it;
- skipped with a reason (:data:`SKIPPED_KEYS`): NeMo RL ``megatron_cfg`` keys, and a few
  ``TransformerConfig`` fields, that an inference teacher does not use (training, NeMo RL's own
  log-probability kernel, multi-token prediction, placement); the plan notes them, the node logs them;
- a ``TransformerConfig`` field (:mod:`podium.config.megatron_fields`): applied to the teacher's
  config. On the login node a field of any supported release passes (one that some releases lack
  gets a note: the nodes need such a release); on a node, the fields of the release installed there;
- anything else: refused, naming the key as the user wrote it (its full key path) and the closest
  valid key (difflib), never a list of fields that merely share a word.

Pure and light: no megatron import (the node passes its release's fields in).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from podium.config.errors import did_you_mean
from podium.config.megatron_fields import ALL_FIELDS, SUPPORTED_RELEASES, fields_of, releases_with

# Keys podium uses itself (not TransformerConfig fields).
MODEL_KEYS: frozenset[str] = frozenset({"make_vocab_size_divisible_by"})

_TRAINING = "a training setting: an inference teacher has no optimizer, backward pass, loss or checkpoint saving"
_INFERENCE = "podium sets it for an inference teacher itself (podium.teacher.model.megatron_config)"
_LOGPROBS = ("how NeMo RL's worker computes log-probabilities; podium's teacher computes them from its output "
             "layer's logits, in row chunks")
_MTP = ("multi-token prediction: a teacher's log-probabilities come from its main output layer; podium builds "
        "no MTP layers and loads no mtp.* weights")
_SEGMENT = ("NeMo RL's NVLink-domain pinning (cluster.segment_size): a podium teacher is one Slurm job; to keep "
            "its nodes in one NVLink domain ask Slurm, e.g. podium.slurm.extra_sbatch: {segment: <num_nodes>} "
            "on a topology/block cluster")
_VISION = "a vision/sound tower setting of NeMo RL's multimodal models: podium serves language-model teachers"
_NEMO_RL = "a setting of NeMo RL's Megatron worker that podium's teacher does not have"
# NeMo RL's MTP keys (policy.megatron_cfg), with every mtp_* field of a supported TransformerConfig.
_MTP_KEYS = {"mtp_num_layers", "mtp_loss_scaling_factor", "mtp_use_repeated_layer", "mtp_detach_heads",
             *(name for name in ALL_FIELDS if name.startswith("mtp_"))}

SKIPPED_KEYS: Mapping[str, str] = {
    **dict.fromkeys(("empty_unused_memory_level", "activation_checkpointing", "optimizer", "scheduler",
                     "distributed_data_parallel_config", "train_iters", "freeze_moe_router",
                     "moe_router_bias_update_rate", "defer_fp32_logits", "peft", "checkpoint", "fp8_cfg",
                     "clear_memory_caches_before_refit", "freeze_config", "track_moe_metrics",
                     "do_not_average_loss", "cp_normalize", "scale_loss_by_dp_cp_size", "converter_type",
                     "force_overwrite_initial_ckpt", "force_reconvert_from_hf"), _TRAINING),
    "enabled": "NeMo RL's backend switch: a podium teacher always runs Megatron",
    "env_vars": ("NeMo RL's worker environment: podium's nodes take theirs from podium.slurm.setup (shell lines "
                 "run before the teacher starts)"),
    # inference routing is forced (moe_settings); the fusions and layouts are chosen for inference
    **dict.fromkeys(("moe_router_load_balancing_type", "moe_permute_fusion", "apply_rope_fusion",
                     "bias_activation_fusion", "sequence_parallel", "pipeline_dtype",
                     "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"), _INFERENCE),
    **dict.fromkeys(("use_fused_linear_logprobs", "fused_linear_logprobs_chunk_size"), _LOGPROBS),
    **dict.fromkeys(sorted(_MTP_KEYS), _MTP),
    "segment_size": _SEGMENT,
    **dict.fromkeys(("radio_force_cpe_eval_mode", "freeze_vision_model", "freeze_vision_projection",
                     "freeze_sound_encoder", "freeze_sound_projection"), _VISION),
    **dict.fromkeys(("use_gloo_process_groups", "hybridep_num_ranks_per_nvlink_domain", "hybridep_use_mnnvl"),
                    _NEMO_RL),
}

FP32_LM_HEAD = "fp32_lm_head"
REFUSED_KEYS: Mapping[str, str] = {
    FP32_LM_HEAD: ("a teacher setting: set it in the teacher block (default_teacher_cfg.fp32_lm_head or "
                   "teacher_overrides.<alias>.fp32_lm_head), not inside megatron_cfg_overrides, as NeMo RL requires"),
    "model_overrides": ("Megatron Bridge provider overrides: podium builds a teacher from its checkpoint's "
                        "config.json, not from a provider; set TransformerConfig fields in megatron_cfg_overrides"),
}
KNOWN_KEYS: frozenset[str] = frozenset({*MODEL_KEYS, *SKIPPED_KEYS, *REFUSED_KEYS})


def _no_names(_key: str) -> Iterable[str]:
    return ()


@dataclass
class MegatronKeys:
    """``megatron_cfg_overrides`` split by :func:`split_keys`."""

    config: dict[str, Any] = field(default_factory=dict)  # applied to TransformerConfig
    model: dict[str, Any] = field(default_factory=dict)  # podium's model options
    skipped: dict[str, str] = field(default_factory=dict)  # key path -> why it is not used
    problems: list[str] = field(default_factory=list)  # one refusal per key, its key path first
    notes: list[str] = field(default_factory=list)  # accepted keys a user should know about


def split_keys(overrides: Mapping[str, Any], path_of: Callable[[str], str], *, release: str | None = None,
               fields: frozenset[str] | None = None,
               also_valid: Callable[[str], Iterable[str]] = _no_names) -> MegatronKeys:
    """Sort ``overrides`` by the module's rule. ``path_of(key)``: the key as the user wrote it;
    ``release``: the node's megatron-core (``major.minor``; ``fields`` its fields when podium ships
    no list for it), None on the login node (every supported release); ``also_valid(key)``: more
    names the key may have meant (a teacher block's own settings, for a key written there)."""
    if fields is None:
        fields = ALL_FIELDS if release is None else fields_of(release)
    if fields is None:
        raise ValueError(f"megatron-core {release}: podium ships no field list for it; pass its fields")
    out = MegatronKeys()
    for key, value in overrides.items():
        path = path_of(key)
        if key in MODEL_KEYS:
            out.model[key] = value
        elif key in REFUSED_KEYS:
            out.problems.append(f"{path}: {REFUSED_KEYS[key]}")
        elif key in SKIPPED_KEYS:
            out.skipped[path] = SKIPPED_KEYS[key]
        elif key in fields:
            out.config[key] = value
            if release is None and len(releases_with(key)) < len(SUPPORTED_RELEASES):
                out.notes.append(f"{path}: a TransformerConfig field of megatron-core {', '.join(releases_with(key))} "
                                 "only: the nodes need such a release")
        else:
            out.problems.append(unknown_key(key, path, fields, release, also_valid(key)))
    return out


def unknown_key(key: str, path: str, fields: frozenset[str], release: str | None, also: Iterable[str] = ()) -> str:
    """The refusal of a key that is none of the module's kinds: its key path, what it is not, and the
    closest valid key."""
    also = tuple(also)
    if release is not None and releases_with(key):
        return (f"{path}: a TransformerConfig field of megatron-core {', '.join(releases_with(key))}, not of "
                f"{release} installed here: install such a release on the nodes, or remove the key")
    which = "/".join(SUPPORTED_RELEASES) if release is None else f"{release} (installed here)"
    setting = "not a teacher setting, nor " if also else "not "
    names = {*also, *(name for name in fields if not name.startswith("_")), *MODEL_KEYS, *SKIPPED_KEYS}
    return (f"{path}: unknown key: {setting}a TransformerConfig field of megatron-core {which}, nor a NeMo RL "
            f"megatron_cfg key podium knows{did_you_mean(key, names)}")


def valid_names(release: str | None = None) -> frozenset[str]:
    """Every key ``megatron_cfg_overrides`` may name and podium accepts (at ``release``; None: any
    supported one)."""
    fields = ALL_FIELDS if release is None else fields_of(release) or frozenset()
    return frozenset({*fields, *MODEL_KEYS, *SKIPPED_KEYS})
