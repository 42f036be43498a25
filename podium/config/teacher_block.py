"""How an alias's teacher block is merged over ``default_teacher_cfg``: NeMo RL main's shallow merge.

NeMo RL main (0054c4e, ``nemo_rl/models/policy/teacher_worker_group.py``,
``create_teacher_configs_from_opd_config``) builds a teacher's settings as
``{**default_teacher_cfg, **teacher_overrides[alias]}``, one level deep, then folds the keys that are
no teacher setting into ``megatron_cfg_overrides`` (``{**extras, **megatron_cfg_overrides}``: the
explicit map wins). So an alias that gives ``megatron_cfg_overrides`` *replaces* the default's map:
every key of the default map it does not repeat is gone for that teacher. (Open PR #3608 merges
the two maps key by key instead; podium follows main.) A key an alias sets to null keeps the
default's: NeMo RL dumps the parsed override without its None fields (``opd._opd_cfg``).

The plan notes each default-map key an alias's map drops (and the alias does not set itself), with
how to keep it, because a silent drop of, say, ``moe_token_dispatcher_type`` changes the teacher;
and each Megatron key an alias sets at the top of its block that the default's map overrides (the
map wins over folded keys, so NeMo RL ignores the alias's value), with where to set it instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from podium.config.sources import DEFAULT_CFG
from podium.config.teacher_keys import BLOCK_KEYS

if TYPE_CHECKING:  # pragma: no cover
    from podium.config.sources import TeacherSource

MEGATRON_MAP = "megatron_cfg_overrides"
# A plan note that is a warning (the recipe runs, but maybe not as its author meant) starts so; the
# CLI shows it as one (podium.config.plan.note_kind).
WARNING = "warning: "


def mapping_problem(value: Any, where: str) -> str | None:
    """Why ``value`` at ``where`` is no mapping (None when it is one)."""
    return None if isinstance(value, dict) else f"{where}: expected a mapping, got {value!r}"


def megatron_map(source: TeacherSource, override: Mapping[str, Any], merged: dict[str, Any], over_path: str,
                 alias: str, problems: list[str], notes: list[str]) -> tuple[dict[str, Any], dict[str, str], set[str]]:
    """(the alias's ``megatron_cfg_overrides``, each key's recipe path, the keys folded into it from
    the block), as NeMo RL main builds it: the alias's map if it gives one, else the default's,
    whole, over the block's folded keys (explicit entries win). ``override``: the alias's block
    without its nulls; ``merged``: the shallow merge (its map is taken out here)."""
    merged.pop(MEGATRON_MAP, None)
    default_path = source.origins.get(MEGATRON_MAP, f"{DEFAULT_CFG}.{MEGATRON_MAP}")
    alias_path = f"{over_path}.{MEGATRON_MAP}"
    maps = []
    for raw, path in ((source.defaults.get(MEGATRON_MAP) or {}, default_path),
                      (override.get(MEGATRON_MAP) or {}, alias_path)):
        problem = mapping_problem(raw, path)
        if problem:
            problems.append(problem)
        maps.append(raw if problem is None else {})
    default_map, alias_map = maps
    replaced = MEGATRON_MAP in override
    explicit, explicit_path = (alias_map, alias_path) if replaced else (default_map, default_path)
    if dropped := [k for k in default_map if replaced and k not in alias_map and k not in override]:
        notes.append(dropped_keys_note(alias, alias_path, default_path, dropped))
    block = {k: v for k, v in merged.items() if k not in BLOCK_KEYS}
    if not replaced:  # the alias's own Megatron keys the default's map overrides
        notes.extend(f"{WARNING}{over_path}.{k} ({override[k]!r}) gives way to {default_path}.{k} "
                     f"({default_map[k]!r}): in NeMo RL the map wins over a key folded into it; to set it for "
                     f"{alias!r}, put it in {alias_path}"
                     for k in block if k in override and k in default_map and override[k] != default_map[k])
    origins = {k: source.origins.get(k, f"{DEFAULT_CFG}.{k}") if k not in override else f"{over_path}.{k}"
               for k in block}
    for key in explicit:
        origins[key] = f"{explicit_path}.{key}"
    return {**block, **explicit}, origins, set(block) - set(explicit)


def dropped_keys_note(alias: str, alias_path: str, default_path: str, dropped: Sequence[str]) -> str:
    """The plan's warning for an alias whose ``megatron_cfg_overrides`` drops default keys."""
    return (f"{WARNING}{alias_path} replaces {default_path} whole, as NeMo RL merges a teacher's settings "
            f"({{**default_teacher_cfg, **teacher_overrides.<alias>}}, one level deep): teacher {alias!r} runs "
            f"without the default's {', '.join(dropped)}; to keep them, repeat them in {alias_path}")
