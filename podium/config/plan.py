"""The plan: a recipe's teachers (MOPD mapping, a distillation recipe's one teacher, or a teachers
file's: :mod:`podium.config.sources`) turned into deduplicated ``TeacherSpec``s.

NeMo RL's semantics (``create_teacher_configs_from_opd_config``), with its known flaws fixed:

- each alias's settings are ``{**default_teacher_cfg, **teacher_overrides[alias]}``, shallow, as
  NeMo RL main merges them (``create_teacher_configs_from_opd_config``): an alias's
  ``megatron_cfg_overrides`` replaces the default's whole (the plan notes the default keys it
  drops, and how to keep them), a setting it sets to null keeps the default's (NeMo RL dumps the
  override without its None fields); keys that are not teacher settings fold into
  ``megatron_cfg_overrides`` (explicit entries there win), and parallel sizes given inside
  ``megatron_cfg_overrides`` are the ones placement uses;
- every key is checked here, on the login node, not first on the allocation: a teacher block's by
  :mod:`podium.config.teacher_keys`, ``megatron_cfg_overrides``' (folded keys included) by
  :mod:`podium.config.megatron_keys`, the rule the nodes apply too; a key neither knows is refused
  naming it as the user wrote it and the closest valid key;
- aliases whose normalised checkpoint is the same become one teacher; if they ask for different
  effective settings that is an error naming both aliases and the keys (NeMo RL silently keeps one);
- with ``deduplicate_shared_teacher_checkpoints: false`` each alias gets, and is routed to, its own
  teacher (NeMo RL routes them all to the last one);
- an agent name routes to its alias, else to ``default_teacher_alias``, else it is an error
  (always an error under ``strict_agent_name_match``);
- a hub id is looked up here, in the local HF cache the nodes read
  (:func:`podium.config.checkpoints.hub_snapshot`), and the snapshot ``refs/main`` names now is
  pinned in the teacher's spec (``revision``, part of its key); one not in the cache is refused
  naming the command that fetches it (NeMo RL's teachers download it on the allocation).

A recipe with problems is refused once, every problem listed with its key path first (the problems
of its checkpoints among them: local directories and hub ids alike); a plan whose only problems are
its checkpoints' carries them in ``Plan.warnings``, which ``up`` (and the ``plan`` command, with the
same words) refuses.

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

from podium.config.checkpoints import checkpoint_problem, normalise_checkpoint, pin_hub_id
from podium.config.errors import ConfigError, did_you_mean, refusal
from podium.config.launcher import SECTION, LauncherSettings, parse_launcher
from podium.config.layout import NODE_SIZES, PARALLEL_SIZES, LayoutError, ParallelLayout
from podium.config.megatron_keys import FP32_LM_HEAD, split_keys
from podium.config.names import name_problem
from podium.config.needs import teacher_needs
from podium.config.precision import DEFAULT_PRECISION, normalise_precision
from podium.config.recipe import load_recipe, merge_with_override, resolve_section
from podium.config.sources import DEFAULT_CFG, MAPPING, OPD, OVERRIDES, TeacherSource, teacher_source
from podium.config.spec import TeacherSpec
from podium.config.teacher_block import WARNING, mapping_problem, megatron_map
from podium.config.teacher_keys import (
    BLOCK_KEYS,
    CROSS_TOKENIZER,
    SIZE_KEYS,
    TEACHER_KEYS,
    cross_tokenizer_problem,
    fp32_lm_head_note,
    fp32_lm_head_setting,
    known_keys,
)
from podium.rendezvous.routing import route_agent

log = logging.getLogger(__name__)

NOT_IDENTITY = frozenset({"replicas"})  # per-alias launcher overrides that do not change a teacher's key


@dataclass(frozen=True)
class Plan:
    recipe_path: str
    teachers: tuple[TeacherSpec, ...]
    routes: Mapping[str, str]  # alias -> teacher key
    default_alias: str | None
    strict: bool
    launcher: LauncherSettings
    nodes_without_dedup: int
    # What `up` refuses about the local checkpoints (their key path first): `plan` refuses it too.
    warnings: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())  # keys accepted but skipped, or carried and not honoured yet

    def notices(self) -> list[tuple[str, str]]:
        """Its notes as the CLI shows them: ``("warning", text)`` or ``("note", text)`` each."""
        return [note_kind(note) for note in self.notes]

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
            "notes": list(self.notes),
        }


def note_kind(note: str) -> tuple[str, str]:
    """``("warning", text)`` for a note that warns (it starts with ``warning: ``), else ``("note", note)``."""
    return ("warning", note.removeprefix(WARNING)) if note.startswith(WARNING) else ("note", note)


def load_plan(
    recipe: str | Path, overrides: Sequence[str] = (), launcher_file: str | Path | None = None
) -> Plan:
    """Load a recipe (with overrides and an optional launcher file) and plan its teachers."""
    cfg = load_recipe(recipe, overrides, known_keys)
    launcher_raw = resolve_section(cfg, SECTION, required=False) or {}
    if launcher_file is not None:
        extra = load_recipe(launcher_file)
        extra_raw = resolve_section(extra, SECTION, required=False)
        if extra_raw is None:  # a launcher file may also hold the section's keys directly
            extra_raw = {k: resolve_section(extra, str(k)) for k in extra}
        launcher_raw = merge_with_override(launcher_raw, extra_raw)
    return build_plan(cfg, Path(recipe), parse_launcher(launcher_raw))


def build_plan(cfg: DictConfig, recipe_path: Path, launcher: LauncherSettings) -> Plan:
    """The plan of ``cfg``; one ``ConfigError`` listing every problem (its key path first) when
    the recipe has any, the problems of its local checkpoints among them."""
    base_dir = recipe_path.expanduser().resolve().parent
    source = teacher_source(cfg)
    mapping = source.mapping
    if not isinstance(mapping, dict) or not mapping:
        raise ConfigError(f"{source.mapping_key}: must be a non-empty mapping of agent alias -> checkpoint")
    problems = _recipe_problems(source, launcher)
    cluster_gpus = resolve_section(cfg, "cluster.gpus_per_node", required=False)

    # Effective settings per alias, in recipe order.
    resolved: dict[str, _AliasSettings] = {}
    pins: dict[str, tuple[str | None, str | None]] = {}  # hub id -> (revision, why none): one look each
    for alias, ckpt in mapping.items():
        if not isinstance(ckpt, str) or not ckpt.strip():
            continue  # a problem of its own (_recipe_problems)
        ref = normalise_checkpoint(ckpt, base_dir)
        settings = _alias_settings(alias, source, source.overrides.get(alias), cluster_gpus)
        settings.values["temperature"] = source.temperature  # NeMo RL's teachers inherit it
        launcher_over = launcher.teachers[alias].model_dump() if alias in launcher.teachers else {}
        settings.launcher_overrides = {k: v for k, v in launcher_over.items() if v}
        settings.model_name = ref.name
        settings.is_local = ref.is_local
        if not ref.is_local:
            if ref.name not in pins:
                pins[ref.name] = pin_hub_id(ref.name)
            settings.revision, settings.unresolved = pins[ref.name]
        problems.extend(settings.problems)
        resolved[alias] = settings

    teachers: list[TeacherSpec] = []
    routes: dict[str, str] = {}
    if not problems:
        problems.extend(_teachers(resolved, launcher, source.dedup, teachers, routes))
    if problems:
        raise refusal([*dict.fromkeys(problems), *_checkpoints_of(resolved, source)])

    warnings = tuple(dict.fromkeys(w for spec in teachers
                                   for w in _checkpoint_problems(resolved[spec.aliases[0]], spec, source)))
    return Plan(
        recipe_path=str(recipe_path),
        teachers=tuple(teachers),
        routes=routes,
        default_alias=source.default_alias,
        strict=source.strict,
        launcher=launcher,
        nodes_without_dedup=sum(s.values["num_nodes"] * s.launcher_overrides.get("replicas", launcher.replicas)
                                for s in resolved.values()),
        warnings=warnings,
        notes=tuple(dict.fromkeys(n for s in resolved.values() for n in s.notes)),
    )


def _recipe_problems(source: TeacherSource, launcher: LauncherSettings) -> list[str]:
    """What is wrong with the recipe's aliases, checkpoints and routing (before any setting)."""
    mapping = source.mapping
    problems = [*source.problems, *_name_problems(mapping, source.mapping_key),
                *_name_problems(source.overrides, source.overrides_key),
                *_name_problems(launcher.teachers, f"{SECTION}.teachers")]
    for alias, ckpt in mapping.items():
        if not isinstance(ckpt, str) or not ckpt.strip():
            problems.append(f"{source.mapping_entry(alias)}: expected a checkpoint path or hub id, got {ckpt!r}")
    default_alias = source.default_alias
    if default_alias is not None and default_alias not in mapping:
        problems.append(f"{OPD}.default_teacher_alias: {default_alias!r} is not an alias of {MAPPING}"
                        f"{did_you_mean(str(default_alias), mapping)}")
    problems.extend(f"{OVERRIDES}.{alias}: not an alias of {MAPPING}{did_you_mean(alias, mapping)}"
                    for alias in source.overrides if alias not in mapping)
    problems.extend(f"{SECTION}.teachers.{alias}: not an alias of {source.mapping_key}{did_you_mean(alias, mapping)}"
                    for alias in launcher.teachers if alias not in mapping)
    return problems


def _teachers(resolved: Mapping[str, _AliasSettings], launcher: LauncherSettings, dedup: bool,
              teachers: list[TeacherSpec], routes: dict[str, str]) -> list[str]:
    """Group the aliases into teachers (by checkpoint, unless ``dedup`` is off), appending each
    teacher to ``teachers`` and each alias's route to ``routes``; the problems of aliases that share
    a checkpoint but not their settings."""
    groups: dict[str, list[str]] = {}
    for alias, settings in resolved.items():
        group_id = settings.model_name if dedup else f"{settings.model_name}\0{alias}"
        groups.setdefault(group_id, []).append(alias)
    problems: list[str] = []
    for aliases in groups.values():
        first = resolved[aliases[0]]
        conflicts = [(other, diff) for other in aliases[1:] if (diff := first.differing_keys(resolved[other]))]
        problems.extend(f"aliases {aliases[0]!r} and {other!r} share checkpoint {first.model_name} but ask for "
                        f"different settings: {', '.join(diff)} (give them the same settings, or different checkpoints)"
                        for other, diff in conflicts)
        if conflicts:
            continue
        try:
            first.launcher_overrides = _merge_launcher_overrides(aliases, resolved)
        except ConfigError as exc:
            problems.append(str(exc))
            continue
        spec = first.to_spec(tuple(aliases), launcher, unique=None if dedup else aliases[0])
        teachers.append(spec)
        for alias in aliases:
            routes[alias] = spec.key
    return problems


def _checkpoint_problem(settings: _AliasSettings, layout: ParallelLayout | None) -> str | None:
    """Why the checkpoint of ``settings`` cannot be served at ``layout`` (a hub id: its pinned
    snapshot), or None."""
    if settings.unresolved:
        return settings.unresolved
    return checkpoint_problem(settings.model_name, layout, settings.revision)


def _checkpoint_problems(settings: _AliasSettings, spec: TeacherSpec, source: TeacherSource) -> list[str]:
    """What is wrong with a teacher's checkpoint (``settings``: its first alias's), named by that
    alias's recipe key."""
    problem = _checkpoint_problem(settings, spec)
    return [f"{source.mapping_entry(spec.aliases[0])}: {problem}"] if problem else []


def _checkpoints_of(resolved: Mapping[str, _AliasSettings], source: TeacherSource) -> list[str]:
    """The problems of every checkpoint, for a recipe refused for other problems too (all at
    once): each checked at its first alias's layout where that alias's settings are sound."""
    seen: set[str] = set()
    out: list[str] = []
    for alias, settings in resolved.items():
        if settings.model_name in seen:
            continue
        seen.add(settings.model_name)
        problem = _checkpoint_problem(settings, settings.layout)
        if problem:
            out.append(f"{source.mapping_entry(alias)}: {problem}")
    return out


def require_checkpoints(plan: Plan) -> None:
    """Raise, listing every one, when a local checkpoint is missing or cannot be served at its
    layout (what ``up`` refuses before anything is submitted, and ``plan`` with it)."""
    if plan.warnings:
        raise refusal(plan.warnings)


@dataclass
class _AliasSettings:
    alias: str
    values: dict[str, Any]
    origins: dict[str, str]  # key -> the recipe key path it came from
    megatron_cfg_overrides: dict[str, Any]
    over_path: str = ""  # the key of its own block (teacher_overrides.<alias>, a teachers file's teachers.<alias>)
    model_name: str = ""
    is_local: bool = False
    revision: str | None = None  # a hub id's snapshot commit, pinned here
    unresolved: str | None = None  # why a hub id has no snapshot in the local HF cache
    launcher_overrides: dict[str, Any] = field(default_factory=dict)
    layout: ParallelLayout | None = None  # set when the sizes are sound
    problems: list[str] = field(default_factory=list)  # each with its key path first
    notes: list[str] = field(default_factory=list)  # what the plan says of keys it accepts

    def comparable(self) -> dict[str, Any]:
        # fp32_lm_head is in `values` only when on (a teacher without it keeps its key): off is False
        return {FP32_LM_HEAD: False, **self.values, "megatron_cfg_overrides": self.megatron_cfg_overrides}

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
            # other weights are another teacher: a hub id's pinned snapshot is part of its key, so a
            # moved ref makes a new teacher (`up` never rewrites a live job's spec to other files);
            # absent for a local path, whose key stays what it was
            **({"revision": self.revision} if self.revision else {}),
        }
        blob = json.dumps(identity, sort_keys=True, default=str).encode()
        key = hashlib.sha256(blob).hexdigest()[:12]
        return TeacherSpec(
            key=key,
            name=aliases[0],
            aliases=aliases,
            model_name=self.model_name,
            revision=self.revision,
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


def _name_problems(keys: Any, where: str) -> list[str]:
    """Each key of ``keys`` (aliases) that fails :func:`name_problem`, named by its key path."""
    return [f"{where}[{str(alias)!r}]: alias {problem}" for alias in keys if (problem := name_problem(str(alias)))]


def _alias_settings(alias: str, source: TeacherSource, override: Any, cluster_gpus: Any) -> _AliasSettings:
    """One alias's effective settings (see the module doc), with every problem they have and the
    notes the plan shows (keys skipped, a setting podium carries but does not honour yet)."""
    over_path = f"{source.overrides_key}.{alias}"
    settings = _AliasSettings(alias, {}, dict(source.origins), {}, over_path=over_path)
    if override is not None and (problem := mapping_problem(override, over_path)):
        settings.problems.append(problem)
        override = None
    merged: dict[str, Any] = dict(source.defaults)
    override = {k: v for k, v in (override or {}).items() if v is not None}  # null: the default's
    for key, value in override.items():
        merged[key] = value
        settings.origins[key] = f"{over_path}.{key}"
    megatron, megatron_origins, folded = megatron_map(source, override, merged, over_path, settings.alias,
                                                      settings.problems, settings.notes)

    values: dict[str, Any] = {"precision": DEFAULT_PRECISION, "micro_batch_size": 1}
    if cluster_gpus is not None:
        values["gpus_per_node"] = cluster_gpus
    settings.origins.setdefault("gpus_per_node", source.unset_key(alias, "gpus_per_node"))
    values.update({k: v for k, v in merged.items() if k in TEACHER_KEYS})
    # Parallel sizes inside megatron_cfg_overrides are what Megatron will use: place by them too.
    for key in PARALLEL_SIZES:
        if key in megatron:
            values[key] = megatron.pop(key)
            settings.origins[key] = megatron_origins[key]
    settings.values = values
    _check_settings(settings, merged)
    split = split_keys(megatron, megatron_origins.__getitem__,
                       also_valid=lambda key: BLOCK_KEYS if key in folded else ())
    settings.problems.extend(split.problems)
    settings.notes.extend([*(f"{path}: skipped: {why}" for path, why in split.skipped.items()), *split.notes])
    settings.megatron_cfg_overrides = megatron
    return settings


def _check_settings(settings: _AliasSettings, merged: Mapping[str, Any]) -> None:
    """The sizes, precision, layout and teacher-only keys of ``settings``: problems, normalised values."""
    values, origins, problems = settings.values, settings.origins, settings.problems

    def where(key: str) -> str:  # the recipe key a setting came from
        return origins.get(key, f"{DEFAULT_CFG}.{key}")

    sizes_ok = True
    for key in SIZE_KEYS:
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"{where(key)}: must be a positive integer, got {value!r}")
            sizes_ok = False
    try:
        values["precision"] = normalise_precision(values["precision"])
    except ValueError as exc:
        problems.append(f"{where('precision')}: {exc}")
    if FP32_LM_HEAD in merged:
        try:
            fp32 = fp32_lm_head_setting(merged[FP32_LM_HEAD])
        except ValueError as exc:
            problems.append(f"{where(FP32_LM_HEAD)}: {exc}")
        else:
            if fp32 is not False:  # off is the default: a teacher without it keeps its key
                values[FP32_LM_HEAD] = fp32
                if note := fp32_lm_head_note(where(FP32_LM_HEAD), fp32, str(values["precision"])):
                    settings.notes.append(note)
    if CROSS_TOKENIZER in merged and (problem := cross_tokenizer_problem(where(CROSS_TOKENIZER),
                                                                          merged[CROSS_TOKENIZER])):
        problems.append(problem)
    if not sizes_ok:
        return
    layout_keys = (*NODE_SIZES, *PARALLEL_SIZES)
    layout = ParallelLayout(**{k: v for k, v in values.items() if k in layout_keys})
    own = any(where(k).startswith(f"{settings.over_path}.") for k in layout_keys)
    try:
        # an alias with sizes of its own is named; the default sizes are one problem, said once
        layout.check(f"teacher {settings.alias!r}" if own else "the default layout")
    except LayoutError as exc:
        keys = ", ".join(dict.fromkeys(origins[k] for k in exc.keys if k in origins))
        problems.append(f"{keys}: {exc}" if keys else str(exc))
        return
    values.update(layout.model_dump())
    settings.layout = layout

