"""The plan: a recipe's teachers (MOPD mapping, or a distillation recipe's one teacher:
:mod:`podium.config.sources`) turned into deduplicated ``TeacherSpec``s.

NeMo RL's semantics (``create_teacher_configs_from_opd_config``), with its known flaws fixed:

- each alias's settings are ``{**default_teacher_cfg, **teacher_overrides[alias]}``; keys that are
  not teacher settings fold into ``megatron_cfg_overrides`` (explicit entries there win), and
  parallel sizes given inside ``megatron_cfg_overrides`` are the ones placement uses; an alias's
  ``megatron_cfg_overrides`` merge by key over the default's, a setting an alias names beats the
  default map's entry for it, and one it sets to null keeps the default's (NeMo RL PR #3608);
- aliases whose normalised checkpoint is the same become one teacher; if they ask for different
  effective settings that is an error naming both aliases and the keys (NeMo RL silently keeps one);
- with ``deduplicate_shared_teacher_checkpoints: false`` each alias gets, and is routed to, its own
  teacher (NeMo RL routes them all to the last one);
- an agent name routes to its alias, else to ``default_teacher_alias``, else it is an error
  (always an error under ``strict_agent_name_match``).

Everything here is pure: a recipe in, a ``Plan`` out, nothing written and nothing imported that a
login node would wait for.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from podium.config.checkpoints import checkpoint_problem, normalise_checkpoint
from podium.config.errors import ConfigError, did_you_mean
from podium.config.launcher import SECTION, LauncherSettings, parse_launcher
from podium.config.layout import NODE_SIZES, PARALLEL_SIZES, LayoutError, ParallelLayout
from podium.config.names import name_problem
from podium.config.needs import teacher_needs
from podium.config.precision import DEFAULT_PRECISION, normalise_precision
from podium.config.recipe import load_recipe, merge_with_override, resolve_section
from podium.config.sources import DEFAULT_CFG, MAPPING, OPD, OVERRIDES, TeacherSource, teacher_source
from podium.config.spec import TeacherSpec
from podium.rendezvous.routing import route_agent

log = logging.getLogger(__name__)

SIZE_KEYS = (*NODE_SIZES, *PARALLEL_SIZES, "micro_batch_size", "max_tokens_per_microbatch")
NOT_IDENTITY = frozenset({"replicas"})  # per-alias launcher overrides that do not change a teacher's key
TEACHER_KEYS = (*SIZE_KEYS, "precision", "megatron_cfg_overrides")


@dataclass(frozen=True)
class Plan:
    recipe_path: str
    teachers: tuple[TeacherSpec, ...]
    routes: Mapping[str, str]  # alias -> teacher key
    default_alias: str | None
    strict: bool
    launcher: LauncherSettings
    nodes_without_dedup: int
    warnings: tuple[str, ...] = field(default=())

    def teacher(self, key_or_name: str) -> TeacherSpec:
        """The teacher of that key or name, or the replica of that display or folder name (``math#1``):
        the words :attr:`TeacherSpec.names` says select a replica, as every run-dir command takes them."""
        for spec in self.teachers:
            for replica in spec.replica_specs():  # replica 0 first: a name or key selects the teacher
                if key_or_name in replica.names:
                    return replica
        names = ", ".join(s.name for s in self.teachers)
        raise ConfigError(f"no teacher {key_or_name!r} in the plan; teachers: {names}")

    def route(self, agent_name: str) -> TeacherSpec:
        return self.teacher(route_agent(self.routes, self.default_alias, self.strict, agent_name))

    @property
    def totals(self) -> dict[str, int]:
        return {
            "teachers": len(self.teachers),
            "aliases": len(self.routes),
            "replicas": sum(t.launcher.replicas for t in self.teachers),
            "nodes": sum(t.num_nodes * t.launcher.replicas for t in self.teachers),
            "nodes_without_dedup": self.nodes_without_dedup,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe_path,
            "teachers": [{**t.to_json(), "data_parallel_size": t.data_parallel_size, "needs": teacher_needs(t)}
                         for t in self.teachers],
            "routes": dict(self.routes),
            "default_alias": self.default_alias,
            "strict_agent_name_match": self.strict,
            "totals": self.totals,
            "warnings": list(self.warnings),
        }


def load_plan(
    recipe: str | Path, overrides: Sequence[str] = (), launcher_file: str | Path | None = None
) -> Plan:
    """Load a recipe (with overrides and an optional launcher file) and plan its teachers."""
    cfg = load_recipe(recipe, overrides)
    launcher_raw = resolve_section(cfg, SECTION, required=False) or {}
    if launcher_file is not None:
        extra = load_recipe(launcher_file)
        extra_raw = resolve_section(extra, SECTION, required=False)
        if extra_raw is None:  # a launcher file may also hold the section's keys directly
            extra_raw = {k: resolve_section(extra, str(k)) for k in extra}
        launcher_raw = merge_with_override(launcher_raw, extra_raw)
    return build_plan(cfg, Path(recipe), parse_launcher(launcher_raw))


def build_plan(cfg: DictConfig, recipe_path: Path, launcher: LauncherSettings) -> Plan:
    base_dir = recipe_path.expanduser().resolve().parent
    source = teacher_source(cfg)
    mapping = source.mapping
    if not isinstance(mapping, dict) or not mapping:
        raise ConfigError(f"{source.mapping_key}: must be a non-empty mapping of agent alias -> checkpoint")
    _check_names(mapping, source.mapping_key)
    for alias, ckpt in mapping.items():
        if not isinstance(ckpt, str) or not ckpt.strip():
            raise ConfigError(f"{source.mapping_entry(alias)}: expected a checkpoint path or hub id, got {ckpt!r}")

    default_alias = source.default_alias
    if default_alias is not None and default_alias not in mapping:
        raise ConfigError(
            f"{OPD}.default_teacher_alias: {default_alias!r} is not an alias of {MAPPING}"
            f"{did_you_mean(str(default_alias), mapping)}"
        )
    strict, dedup, overrides = source.strict, source.dedup, source.overrides
    _check_names(overrides, OVERRIDES)
    _check_names(launcher.teachers, f"{SECTION}.teachers")
    for alias in overrides:
        if alias not in mapping:
            raise ConfigError(
                f"{OVERRIDES}.{alias}: not an alias of {MAPPING}{did_you_mean(alias, mapping)}"
            )
    for alias in launcher.teachers:
        if alias not in mapping:
            raise ConfigError(
                f"{SECTION}.teachers.{alias}: not an alias of {source.mapping_key}{did_you_mean(alias, mapping)}"
            )
    cluster_gpus = resolve_section(cfg, "cluster.gpus_per_node", required=False)

    # Effective settings per alias, in recipe order.
    resolved: dict[str, _AliasSettings] = {}
    for alias, ckpt in mapping.items():
        ref = normalise_checkpoint(ckpt, base_dir)
        settings = _alias_settings(alias, source, overrides.get(alias), cluster_gpus)
        settings.values["temperature"] = source.temperature  # NeMo RL's teachers inherit it
        launcher_over = launcher.teachers[alias].model_dump() if alias in launcher.teachers else {}
        settings.launcher_overrides = {k: v for k, v in launcher_over.items() if v}
        settings.model_name = ref.name
        settings.is_local = ref.is_local
        resolved[alias] = settings

    groups: dict[str, list[str]] = {}
    for alias, settings in resolved.items():
        group_id = settings.model_name if dedup else f"{settings.model_name}\0{alias}"
        groups.setdefault(group_id, []).append(alias)

    teachers: list[TeacherSpec] = []
    routes: dict[str, str] = {}
    for aliases in groups.values():
        first = resolved[aliases[0]]
        for other in aliases[1:]:
            diff = first.differing_keys(resolved[other])
            if diff:
                raise ConfigError(
                    f"aliases {aliases[0]!r} and {other!r} share checkpoint {first.model_name} but "
                    f"ask for different settings: {', '.join(diff)} "
                    f"(give them the same settings, or different checkpoints)"
                )
        first.launcher_overrides = _merge_launcher_overrides(aliases, resolved)
        spec = first.to_spec(tuple(aliases), launcher, unique=None if dedup else aliases[0])
        teachers.append(spec)
        for alias in aliases:
            routes[alias] = spec.key

    warnings = tuple(w for spec in teachers for w in checkpoint_problems(spec))
    return Plan(
        recipe_path=str(recipe_path),
        teachers=tuple(teachers),
        routes=routes,
        default_alias=default_alias,
        strict=strict,
        launcher=launcher,
        nodes_without_dedup=sum(s.values["num_nodes"] * s.launcher_overrides.get("replicas", launcher.replicas)
                                for s in resolved.values()),
        warnings=warnings,
    )


def checkpoint_problems(spec: TeacherSpec) -> list[str]:
    """What is wrong with a teacher's local checkpoint (nothing is checked for a hub id)."""
    if not Path(spec.model_name).is_absolute():
        return []
    problem = checkpoint_problem(spec.model_name, spec)
    return [f"teacher {spec.name!r}: {problem}"] if problem else []


def require_checkpoints(plan: Plan) -> None:
    """Raise when any local checkpoint is missing or unrecognised (before anything is submitted)."""
    if plan.warnings:
        raise ConfigError("\n".join(plan.warnings))


@dataclass
class _AliasSettings:
    alias: str
    values: dict[str, Any]
    origins: dict[str, str]  # key -> the recipe key path it came from
    megatron_cfg_overrides: dict[str, Any]
    model_name: str = ""
    is_local: bool = False
    launcher_overrides: dict[str, Any] = field(default_factory=dict)

    def comparable(self) -> dict[str, Any]:
        return {**self.values, "megatron_cfg_overrides": self.megatron_cfg_overrides}

    def differing_keys(self, other: _AliasSettings) -> list[str]:
        mine, theirs = self.comparable(), other.comparable()
        out: list[str] = []
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) == theirs.get(key):
                continue
            if isinstance(mine.get(key), dict) and isinstance(theirs.get(key), dict):
                sub = sorted(
                    k for k in set(mine[key]) | set(theirs[key]) if mine[key].get(k) != theirs[key].get(k)
                )
                out.extend(f"{key}.{k} ({mine[key].get(k)!r} vs {theirs[key].get(k)!r})" for k in sub)
            else:
                out.append(f"{key} ({mine.get(key)!r} vs {theirs.get(key)!r})")
        return out

    def to_spec(
        self, aliases: tuple[str, ...], launcher: LauncherSettings, unique: str | None
    ) -> TeacherSpec:
        effective = launcher.for_teacher(self.launcher_overrides, f"{SECTION}.teachers.{self.alias}")
        identity = {
            "model_name": self.model_name,
            **self.values,
            "megatron_cfg_overrides": self.megatron_cfg_overrides,
            # how many allocations serve the teacher is not what the teacher is: a change of
            # `replicas` keeps the key, so `up` and `scale` add or stop replicas of the same teacher
            "launcher_overrides": {k: v for k, v in self.launcher_overrides.items() if k not in NOT_IDENTITY},
            "alias": unique,  # set only without dedup, so each alias's teacher is distinct
        }
        blob = json.dumps(identity, sort_keys=True, default=str).encode()
        key = hashlib.sha256(blob).hexdigest()[:12]
        return TeacherSpec(
            key=key,
            name=aliases[0],
            aliases=aliases,
            model_name=self.model_name,
            megatron_cfg_overrides=dict(self.megatron_cfg_overrides),
            launcher=effective,
            **self.values,
        )


def _merge_launcher_overrides(
    aliases: Sequence[str], resolved: Mapping[str, _AliasSettings]
) -> dict[str, Any]:
    """`podium.teachers.<alias>` applies to that alias's teacher: merge what its aliases ask for,
    refusing two aliases that set one setting to different values."""
    merged: dict[str, Any] = {}
    setter: dict[tuple[str, str], str] = {}
    for alias in aliases:
        for section, values in resolved[alias].launcher_overrides.items():
            if not isinstance(values, dict):  # a setting of its own (`replicas`), not a section
                if section in merged and merged[section] != values:
                    first = setter[(section, "")]
                    raise ConfigError(
                        f"{SECTION}.teachers.{first}.{section} ({merged[section]!r}) and "
                        f"{SECTION}.teachers.{alias}.{section} ({values!r}) disagree, but "
                        f"aliases {first!r} and {alias!r} share one teacher"
                    )
                merged[section] = values
                setter[(section, "")] = alias
                continue
            for key, value in values.items():
                current = merged.setdefault(section, {})
                if key in current and current[key] != value:
                    first = setter[(section, key)]
                    raise ConfigError(
                        f"{SECTION}.teachers.{first}.{section}.{key} ({current[key]!r}) and "
                        f"{SECTION}.teachers.{alias}.{section}.{key} ({value!r}) disagree, but "
                        f"aliases {first!r} and {alias!r} share one teacher"
                    )
                current[key] = value
                setter[(section, key)] = alias
    return merged


def _check_names(keys: Any, where: str) -> None:
    """Every key of ``keys`` (aliases) passes :func:`name_problem`; else a ``ConfigError``
    naming the key path."""
    for alias in keys:
        problem = name_problem(str(alias))
        if problem:
            raise ConfigError(f"{where}[{str(alias)!r}]: alias {problem}")


def _check_mapping(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")


def _alias_settings(
    alias: str, source: TeacherSource, override: Any, cluster_gpus: Any
) -> _AliasSettings:
    over_path = f"{OVERRIDES}.{alias}"
    if override is not None:
        _check_mapping(override, over_path)
    merged: dict[str, Any] = dict(source.defaults)
    origins: dict[str, str] = dict(source.origins)
    override = {k: v for k, v in (override or {}).items() if v is not None}  # null: the default's (#3608)
    for key, value in override.items():
        merged[key] = value
        origins[key] = f"{over_path}.{key}"

    # Explicit megatron_cfg_overrides win over keys folded into them. An alias's map merges by key
    # over the default's, whose entry for a setting the alias names itself gives way (NeMo RL #3608:
    # default setting < default map < alias setting < alias map).
    merged.pop("megatron_cfg_overrides", None)
    default_path = source.origins.get("megatron_cfg_overrides", f"{DEFAULT_CFG}.megatron_cfg_overrides")
    alias_path = f"{over_path}.megatron_cfg_overrides"
    default_map = source.defaults.get("megatron_cfg_overrides") or {}
    alias_map = override.get("megatron_cfg_overrides") or {}
    _check_mapping(default_map, default_path)
    _check_mapping(alias_map, alias_path)
    explicit = {k: v for k, v in default_map.items() if k not in override}
    explicit.update(alias_map)
    folded = {k: v for k, v in merged.items() if k not in TEACHER_KEYS}
    megatron = {**folded, **explicit}
    for key in explicit:
        origins[key] = f"{alias_path if key in alias_map else default_path}.{key}"

    values: dict[str, Any] = {"precision": DEFAULT_PRECISION, "micro_batch_size": 1}
    if cluster_gpus is not None:
        values["gpus_per_node"] = cluster_gpus
    origins.setdefault("gpus_per_node", "cluster.gpus_per_node")
    values.update({k: v for k, v in merged.items() if k in TEACHER_KEYS})
    # Parallel sizes inside megatron_cfg_overrides are what Megatron will use: place by them too.
    for key in PARALLEL_SIZES:
        if key in megatron:
            values[key] = megatron.pop(key)

    for key in SIZE_KEYS:
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            where = origins.get(key, f"{DEFAULT_CFG}.{key}")
            raise ConfigError(f"{where}: must be a positive integer, got {value!r}")
    try:
        values["precision"] = normalise_precision(values["precision"])
    except ValueError as exc:
        raise ConfigError(f"{origins.get('precision', f'{DEFAULT_CFG}.precision')}: {exc}") from None

    layout = ParallelLayout(**{k: v for k, v in values.items() if k in (*NODE_SIZES, *PARALLEL_SIZES)})
    try:
        layout.check(f"teacher {alias!r}")
    except LayoutError as exc:
        where = ", ".join(dict.fromkeys(origins[k] for k in exc.keys if k in origins))
        raise ConfigError(f"{exc} (from {where})" if where else str(exc)) from None
    values.update(layout.model_dump())
    return _AliasSettings(alias, values, origins, megatron)
