"""Where a file names its teachers: the two NeMo RL recipe shapes podium plans from, and podium's
own short form, the teachers file.

- **MOPD** (``on_policy_distillation``): ``teacher_model_by_agent_name`` maps aliases to
  checkpoints; ``non_colocated_teachers.default_teacher_cfg`` / ``teacher_overrides.<alias>`` give
  each alias's settings; the teachers inherit the policy's ``generation.temperature``.
- **Classic distillation** (``distillation`` + a top-level ``teacher`` policy block, as
  ``examples/configs/distillation_math.yaml``): one teacher, alias ``teacher``, whose parallel
  sizes come from the backend the block enables (``teacher.megatron_cfg`` when enabled, else
  ``teacher.dtensor_cfg``: ``tensor_parallel_size``, ``context_parallel_size``), its precision,
  ``logprob_batch_size`` and its own ``generation.temperature`` (NeMo RL's teacher ``Policy``
  reads its own block).

- **A teachers file** (a top-level ``teachers:`` *mapping*, for users without a NeMo RL recipe):
  each alias maps to a checkpoint (a path, relative to the file, or a hub id), or to a teacher block
  of NeMo RL's teacher keys (:mod:`podium.config.teacher_keys`: the sizes, ``precision``,
  ``megatron_cfg_overrides``, ...) whose ``checkpoint`` (or ``model_name``, NeMo RL's word for it)
  names the checkpoint. A block is one alias's ``teacher_overrides.<alias>`` over an empty
  ``default_teacher_cfg``: the plan checks, dedups and keys it exactly as a recipe's. Beside
  ``teachers`` the file holds ``podium:`` (the launcher section) and ``_``-prefixed helper keys
  (for ``${...}`` interpolation), nothing else; temperature 1 (a caller may ask its own per request).

A cross-tokenizer (X-Token) distillation recipe (a ``teachers:`` *list*) is refused: podium does not
serve a teacher whose tokenizer differs from the student's yet.

:func:`teacher_source` decides which of these a file is (the one place that does) and reads it into
one :class:`TeacherSource`: the values and, for every value, the file's key it came from (what
errors name). The plan does the rest the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from podium.config.errors import ConfigError, closest, did_you_mean
from podium.config.launcher import SECTION, TeacherLauncherOverrides
from podium.config.recipe import resolve_section

OPD = "on_policy_distillation"
MAPPING = f"{OPD}.teacher_model_by_agent_name"
NON_COLOCATED = f"{OPD}.non_colocated_teachers"
DEFAULT_CFG = f"{NON_COLOCATED}.default_teacher_cfg"
OVERRIDES = f"{NON_COLOCATED}.teacher_overrides"
# NeMo RL's NonColocatedTeachersConfig (nemo_rl/algorithms/opd.py)
NON_COLOCATED_KEYS = ("enabled", "default_teacher_cfg", "teacher_overrides")
POLICY_TEMPERATURE = "policy.generation.temperature"

DISTILLATION = "distillation"
TEACHER = "teacher"  # the classic distillation recipe's teacher block, and its teacher's alias
DISTILLATION_ALIAS = "teacher"
XTOKEN_TEACHERS = "teachers"  # NeMo RL's cross-tokenizer (X-Token) distillation: a list of teachers
TEACHERS_FILE = "teachers"  # a teachers file: the same key holding a mapping, alias -> checkpoint or block
CHECKPOINT_KEYS = ("checkpoint", "model_name")  # a teachers file's block names its checkpoint by either
FILE_KEYS = (TEACHERS_FILE, SECTION)  # what a teachers file holds (beside `_`-prefixed helper keys)
# teacher.<backend>.<key> -> podium's setting, per NeMo RL backend
_MEGATRON_KEYS = {k: k for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                 "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size")}
_DTENSOR_KEYS = {"tensor_parallel_size": "tensor_model_parallel_size", "context_parallel_size": "context_parallel_size"}


@dataclass
class TeacherSource:
    """A recipe's teachers: the alias → checkpoint mapping, the settings every alias starts from
    (``defaults``, each with its recipe key in ``origins``), per-alias overrides, routing flags and
    the temperature the teachers divide their logits by."""

    kind: str  # "mopd", "distillation" or "teachers" (a teachers file)
    mapping: dict[str, Any]
    mapping_key: str
    defaults: dict[str, Any]
    origins: dict[str, str]  # setting -> recipe key it came from
    overrides: dict[str, Any] = field(default_factory=dict)
    overrides_key: str = OVERRIDES
    default_alias: str | None = None
    strict: bool = False
    dedup: bool = True
    temperature: float = 1.0
    temperature_key: str = POLICY_TEMPERATURE
    entries: dict[str, str] = field(default_factory=dict)  # alias -> its checkpoint's key, where not mapping.alias
    problems: list[str] = field(default_factory=list)  # what the reader found wrong (each its key path first)

    def mapping_entry(self, alias: str) -> str:
        """The recipe key of one alias's checkpoint."""
        if self.kind == "distillation":
            return self.mapping_key
        return self.entries.get(alias, f"{self.mapping_key}.{alias}")

    def unset_key(self, alias: str, key: str) -> str:
        """The key that would give ``alias`` a setting no block gives (what a layout error names):
        a teachers file's block; a recipe's ``cluster.gpus_per_node`` or ``default_teacher_cfg``."""
        if self.kind == TEACHERS_FILE:
            return f"{self.overrides_key}.{alias}.{key}"
        return "cluster.gpus_per_node" if key == "gpus_per_node" else f"{DEFAULT_CFG}.{key}"


def teacher_source(cfg: DictConfig) -> TeacherSource:
    """The file's teachers, by what kind of file it is: MOPD when it has ``on_policy_distillation``,
    else classic distillation when it has a ``teacher`` block, else a teachers file when its
    ``teachers`` is a mapping; else an error saying what podium looks for."""
    if resolve_section(cfg, OPD, required=False) is not None:
        return _mopd(cfg)
    if resolve_section(cfg, f"{TEACHER}.model_name", required=False) is not None:
        return _distillation(cfg)
    teachers = OmegaConf.select(cfg, TEACHERS_FILE, throw_on_resolution_failure=False)
    if isinstance(teachers, DictConfig):
        return _teachers_file(cfg)
    if isinstance(teachers, ListConfig):
        raise ConfigError(f"{XTOKEN_TEACHERS}: a cross-tokenizer (X-Token) distillation recipe: a cross-tokenizer "
                          "teacher is not served yet: podium serves teachers that share the student's tokenizer "
                          f"(an on_policy_distillation recipe's '{OPD}.teacher_model_by_agent_name', or a "
                          f"distillation recipe's '{TEACHER}.model_name')")
    near = {str(k): match for k in cfg if (match := closest(str(k), (OPD, TEACHERS_FILE))) not in (None, k)}
    hint = "".join(f"; '{k}': did you mean '{m}'?" for k, m in near.items())
    raise ConfigError(f"neither a NeMo RL recipe nor a teachers file: podium plans the teachers of a MOPD recipe "
                      f"('{MAPPING}'), of a distillation recipe ('{TEACHER}.model_name') or of a teachers file "
                      f"('{TEACHERS_FILE}:' mapping each alias to a checkpoint){hint}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    return value


def _temperature(value: Any, where: str) -> float:
    """A sampling temperature, which NeMo RL's teachers divide their logits by (None: 1)."""
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: must be a number > 0, got {value!r}")
    return float(value)


def _check_misspelt(cfg: DictConfig, section: str, known: tuple[str, ...]) -> None:
    """Refuse a key of ``section`` that is a misspelling of one of its ``known`` keys (NeMo RL lets
    unknown keys through there, and a misspelt ``default_teacher_cfg`` would leave every teacher at
    the defaults); a key close to none may be NeMo RL's own and passes."""
    node = OmegaConf.select(cfg, section, throw_on_resolution_failure=False)
    if not isinstance(node, DictConfig):
        return
    for key in map(str, node):
        if key not in known and (match := closest(key, known)) is not None:
            raise ConfigError(f"{section}.{key}: unknown key (did you mean {match!r}?)")


def _mopd(cfg: DictConfig) -> TeacherSource:
    mapping = resolve_section(cfg, MAPPING, required=False)
    if mapping is None:
        raise ConfigError(f"{MAPPING}: missing from the recipe")
    default_alias = resolve_section(cfg, f"{OPD}.default_teacher_alias", required=False)
    dedup = resolve_section(cfg, f"{OPD}.deduplicate_shared_teacher_checkpoints", required=False)
    _check_misspelt(cfg, NON_COLOCATED, NON_COLOCATED_KEYS)
    defaults = _mapping(resolve_section(cfg, DEFAULT_CFG, required=False) or {}, DEFAULT_CFG)
    return TeacherSource(
        kind="mopd",
        mapping=mapping,
        mapping_key=MAPPING,
        defaults=defaults,
        origins={key: f"{DEFAULT_CFG}.{key}" for key in defaults},
        overrides=_mapping(resolve_section(cfg, OVERRIDES, required=False) or {}, OVERRIDES),
        default_alias=default_alias,
        strict=bool(resolve_section(cfg, f"{OPD}.strict_agent_name_match", required=False) or False),
        dedup=True if dedup is None else bool(dedup),
        temperature=_temperature(resolve_section(cfg, POLICY_TEMPERATURE, required=False), POLICY_TEMPERATURE),
    )


def _distillation(cfg: DictConfig) -> TeacherSource:
    block = _mapping(resolve_section(cfg, TEACHER), TEACHER)
    megatron = block.get("megatron_cfg") or {}
    backend, keys = ("megatron_cfg", _MEGATRON_KEYS) if megatron.get("enabled") else ("dtensor_cfg", _DTENSOR_KEYS)
    sizes = _mapping(block.get(backend) or {}, f"{TEACHER}.{backend}")
    defaults: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for theirs, ours in keys.items():
        if sizes.get(theirs) is not None:
            defaults[ours], origins[ours] = sizes[theirs], f"{TEACHER}.{backend}.{theirs}"
    for theirs, ours in (("precision", "precision"), ("logprob_batch_size", "micro_batch_size")):
        if block.get(theirs) is not None:
            defaults[ours], origins[ours] = block[theirs], f"{TEACHER}.{theirs}"
    for batching in ("sequence_packing", "dynamic_batching"):  # NeMo RL's order of precedence
        section = block.get(batching) or {}
        if isinstance(section, dict) and section.get("enabled") and section.get("logprob_mb_tokens") is not None:
            defaults["max_tokens_per_microbatch"] = section["logprob_mb_tokens"]
            origins["max_tokens_per_microbatch"] = f"{TEACHER}.{batching}.logprob_mb_tokens"
            break
    gpus = resolve_section(cfg, "cluster.gpus_per_node", required=False)
    if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0:
        # NeMo RL runs the teacher on the trainer's nodes; podium gives it the nodes its model
        # parallel size needs, whole nodes of the cluster's size
        model_parallel = 1
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            value = defaults.get(key, 1)
            model_parallel *= value if isinstance(value, int) and value > 0 else 1
        defaults["num_nodes"] = max(1, -(-model_parallel // gpus))
        origins["num_nodes"] = f"{TEACHER}.{backend}"  # its model-parallel size over cluster.gpus_per_node
    temperature_key = f"{TEACHER}.generation.temperature"
    return TeacherSource(
        kind="distillation",
        mapping={DISTILLATION_ALIAS: block.get("model_name")},
        mapping_key=f"{TEACHER}.model_name",
        defaults=defaults,
        origins=origins,
        temperature=_temperature(resolve_section(cfg, temperature_key, required=False), temperature_key),
        temperature_key=temperature_key,
    )


def _teachers_file(cfg: DictConfig) -> TeacherSource:
    """A teachers file (see the module doc): its aliases' checkpoints and blocks, as one MOPD
    recipe's ``teacher_model_by_agent_name`` and ``teacher_overrides`` over no defaults."""
    source = TeacherSource(kind=TEACHERS_FILE, mapping={}, mapping_key=TEACHERS_FILE, defaults={}, origins={},
                           overrides_key=TEACHERS_FILE)
    source.problems.extend(f"{key}: not a key of a teachers file, which holds {' and '.join(FILE_KEYS)}"
                           f"{did_you_mean(key, FILE_KEYS)}"
                           for key in map(str, cfg) if key not in FILE_KEYS and not key.startswith("_"))
    launcher_keys = TeacherLauncherOverrides.model_fields  # what podium.teachers.<alias> takes
    for alias, entry in _mapping(resolve_section(cfg, TEACHERS_FILE), TEACHERS_FILE).items():
        if not isinstance(entry, dict):
            source.mapping[alias] = entry  # a checkpoint (the plan names anything else)
            continue
        where = f"{TEACHERS_FILE}.{alias}"
        given = [key for key in CHECKPOINT_KEYS if key in entry]
        source.entries[alias] = f"{where}.{given[0] if given else CHECKPOINT_KEYS[0]}"
        source.mapping[alias] = entry[given[0]] if given else None
        if len(given) > 1:
            source.problems.append(f"{where}: names its checkpoint twice ({' and '.join(given)}): keep one")
        if not given:  # the plan says it lacks one; a misspelt one is said here (the plan skips the alias)
            source.problems.extend(f"{where}.{key}: unknown key (did you mean {match!r}?)" for key in map(str, entry)
                                   if (match := closest(key, CHECKPOINT_KEYS)) is not None)
        source.problems.extend(f"{where}.{key}: a launcher setting, not a teacher's: give it as "
                               f"{SECTION}.teachers.{alias}.{key}" for key in entry if key in launcher_keys)
        source.overrides[alias] = {k: v for k, v in entry.items()
                                   if k not in CHECKPOINT_KEYS and k not in launcher_keys}
    return source
