"""Loading NeMo RL recipes as NeMo RL users write and type them.

What this module owns:

| feature                     | meaning                                                              |
|-----------------------------|----------------------------------------------------------------------|
| ``defaults: a.yaml``        | a string or list of files, relative to the file naming them; recursive |
| ``_override_: true``        | that mapping replaces the inherited one instead of merging into it   |
| ``${a.b}``, ``${mul:x,y}``  | OmegaConf interpolation with NeMo RL's resolvers add, mul, div, max  |
| ``key=value``               | command-line override of an existing key (value parsed as YAML)      |
| ``+key=value``              | adds a key that does not exist yet                                   |
| ``++key=value``             | sets a key whether or not it exists                                  |
| ``~key``                    | deletes a key                                                        |

Interpolations are resolved lazily: parts of a recipe podium does not read (data paths that use
``${oc.env:HF_HOME}``, say) may stay unresolvable on a login node. ``resolve_section`` resolves one
subtree and names the full key of anything that cannot resolve.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import omegaconf
import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from podium.config.errors import ConfigError, closest

log = logging.getLogger(__name__)

OVERRIDE_MARKER = "_override_"


def _div(a: Any, b: Any) -> Any:
    q = a / b
    return int(q) if isinstance(a, int) and isinstance(b, int) and a % b == 0 else q


# NeMo RL registers these before loading a recipe; recipes use them in interpolations.
_RESOLVERS = {
    "add": lambda *xs: sum(xs),
    "mul": lambda *xs: _product(xs),
    "div": _div,
    "max": lambda *xs: max(xs),
}


def _product(xs: Sequence[Any]) -> Any:
    out: Any = 1
    for x in xs:
        out *= x
    return out


def register_resolvers() -> None:
    # omegaconf 2.4 renamed register_new_resolver (deprecated there) to register_resolver; before
    # 2.4, register_resolver is the legacy API, which refuses NeMo RL's nested interpolations
    # (${mul:${..a}, ${..b}}). hydra-core (under transferqueue, NeMo RL's data plane) holds omegaconf at 2.3.
    new_api = tuple(int(part) for part in omegaconf.__version__.split(".")[:2]) >= (2, 4)
    register = OmegaConf.register_resolver if new_api else OmegaConf.register_new_resolver
    for name, fn in _RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            register(name, fn)


def _load_yaml(path: Path, referenced_by: str | None = None) -> DictConfig:
    if not path.is_file():
        where = f" (named in 'defaults' of {referenced_by})" if referenced_by else ""
        raise ConfigError(f"{path}: recipe file not found{where}")
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{line}: YAML syntax error: {problem}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: cannot load: {exc}") from None
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a recipe must be a mapping at the top level")
    return cfg


def merge_with_override(base: Any, override: Any) -> Any:
    """Merge plain ``override`` into plain ``base``; a mapping with ``_override_: true`` replaces."""
    if not isinstance(override, dict):
        return override
    if override.get(OVERRIDE_MARKER) is True:
        return {k: v for k, v in override.items() if k != OVERRIDE_MARKER}
    merged = dict(base) if isinstance(base, dict) else {}
    for key, value in override.items():
        merged[key] = merge_with_override(merged.get(key), value)
    return merged


def _strip_markers(value: Any) -> Any:
    # A top-level file may carry `_override_` with nothing beneath to replace.
    if isinstance(value, dict):
        return {k: _strip_markers(v) for k, v in value.items() if k != OVERRIDE_MARKER}
    if isinstance(value, list):
        return [_strip_markers(v) for v in value]
    return value


def _load_plain(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Load ``path`` and everything its ``defaults:`` names, recursively (NeMo RL semantics)."""
    path = path.expanduser().resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"{path}: 'defaults' form a cycle: {cycle}")
    own = OmegaConf.to_container(
        _load_yaml(path, referenced_by=str(chain[-1]) if chain else None), resolve=False
    )
    assert isinstance(own, dict)
    defaults = own.pop("defaults", None)
    if defaults is None:
        return own
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError(f"{path}: 'defaults' must be a file name or a list of file names")
    base: dict[str, Any] = {}
    for name in defaults:
        parent_path = path.parent / Path(name).expanduser()
        if not parent_path.is_file():
            raise ConfigError(f"{path}: 'defaults' names {name!r}, but {parent_path} does not exist")
        base = merge_with_override(base, _load_plain(parent_path, (*chain, path)))
    return merge_with_override(base, own)


def load_with_defaults(path: Path) -> DictConfig:
    return OmegaConf.create(_strip_markers(_load_plain(path)))


def _parse_value(text: str) -> Any:
    # As Hydra does, a value is YAML: 4 -> int, true -> bool, null -> None, [1,2] -> list.
    # Interpolations stay strings for OmegaConf to resolve later.
    if "${" in text:
        return text
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


KnownKeys = Callable[[str], Iterable[str]]  # a parent key path -> the keys it may hold beyond the recipe's


def _no_keys(_parent: str) -> Iterable[str]:
    return ()


def apply_overrides(cfg: DictConfig, overrides: Sequence[str], known_keys: KnownKeys = _no_keys) -> DictConfig:
    """Apply Hydra-style command-line overrides in order. An override of a key the recipe lacks
    names the closest key there is (or that ``known_keys`` of its parent says it may hold)."""
    for item in overrides:
        if item.startswith("~"):
            key = item[1:].split("=", 1)[0]
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            if not isinstance(parent, DictConfig) or leaf not in parent:
                raise ConfigError(f"override {item!r}: key {key!r} does not exist, nothing to delete"
                                  f"{_closest(cfg, key, known_keys)}")
            del parent[leaf]
            continue
        if "=" not in item:
            raise ConfigError(
                f"override {item!r}: expected key=value, +key=value, ++key=value or ~key"
            )
        key, value = item.split("=", 1)
        force = key.startswith("++")
        add = key.startswith("+") and not force
        key = key.lstrip("+")
        if not key:
            raise ConfigError(f"override {item!r}: empty key")
        exists = OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False)
        exists = exists is not _MISSING
        if add and exists:
            raise ConfigError(f"override {item!r}: key {key!r} already exists; use {key}=… or ++{key}=…")
        if not add and not force and not exists:
            raise ConfigError(
                f"override {item!r}: key {key!r} is not in the recipe{_closest(cfg, key, known_keys)}; "
                f"use +{key}=… to add it"
            )
        OmegaConf.update(cfg, key, _parse_value(value), merge=False, force_add=True)
    return cfg


_MISSING = object()


def _closest(cfg: DictConfig, key: str, known_keys: KnownKeys) -> str:
    """`` (did you mean 'a.b.c'?)`` for the key path ``key`` that ``cfg`` lacks: the first part of it
    that is missing, against the keys its parent holds (and may hold); '' when none is close."""
    parts = key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parts):
        if isinstance(node, DictConfig) and part in node:
            node = node._get_node(part)
            continue
        parent = ".".join(parts[:depth])
        names = {str(k) for k in node} if isinstance(node, DictConfig) else set()
        match = closest(part, {*names, *known_keys(parent)})
        if match is None:
            return ""
        return f" (did you mean {'.'.join([*parts[:depth], match, *parts[depth + 1:]])!r}?)"
    return ""


def load_recipe(path: str | Path, overrides: Sequence[str] = (), known_keys: KnownKeys = _no_keys) -> DictConfig:
    """The recipe at ``path`` with its defaults merged and ``overrides`` applied (unresolved)."""
    register_resolvers()
    cfg = load_with_defaults(Path(path))
    return apply_overrides(cfg, overrides, known_keys)


def resolve_section(cfg: DictConfig, key: str, *, required: bool = True) -> Any:
    """Resolve the subtree at ``key`` into plain Python, naming the full key of any failure."""
    register_resolvers()
    node = OmegaConf.select(cfg, key, default=_MISSING, throw_on_resolution_failure=False)
    if node is _MISSING or node is None:
        if required:
            raise ConfigError(f"{key}: missing from the recipe")
        return None
    return _resolve(cfg, key)


def _resolve(cfg: DictConfig, key: str) -> Any:
    try:
        node = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{key}: cannot resolve {_raw(cfg, key)!r}: {_first_line(exc)}") from None
    if isinstance(node, DictConfig):
        return {str(k): _resolve(cfg, f"{key}.{k}") for k in node}
    if isinstance(node, ListConfig):
        return [_resolve(cfg, f"{key}[{i}]") for i in range(len(node))]
    return node


def _raw(cfg: DictConfig, key: str) -> Any:
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False) if parent_key else cfg
    if isinstance(parent, DictConfig) and leaf in parent:
        return parent._get_node(leaf)._value()
    return "?"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0]
