"""``rendezvous.json``: the one file a trainer is given, and the routing it carries.

Owns the file's schema (:class:`Rendezvous`), building it from the plan's ``TeacherSpec``s
(:func:`build_rendezvous`), writing and reading it, and routing an agent name to a teacher key
(:meth:`Rendezvous.resolve`): an alias maps to its teacher; an unmapped name goes to the default
alias's teacher, or is an error under the strict flag (NeMo RL's ``default_teacher_alias`` and
``strict_agent_name_match``).

A teacher's entry lists the endpoint records of its replicas (``replicas``: independent
allocations of the same teacher, each with its own generation-fenced record), among which a client
spreads its calls. ``endpoint`` is the first of them, which is all a one-replica teacher has and all
an older reader looks at. ``podium up`` writes the file; ``podium scale`` rewrites one teacher's
list, and clients re-read the file when it changes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from podium.rendezvous.atomic import atomic_write_json, ensure_dir, parse_model, read_json
from podium.rendezvous.layout import RENDEZVOUS_MODE, RunLayout
from podium.rendezvous.routing import RoutingError, route_agent
from podium.rendezvous.schema import VersionedFile

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1


class TeacherEntry(BaseModel):
    """One unique teacher as the rendezvous names it."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str
    aliases: tuple[str, ...]
    endpoint: str  # path of the (first replica's) endpoint record, relative to the run dir
    # every replica's endpoint record, the first being ``endpoint``; absent (an older writer): just it
    replicas: tuple[str, ...] = ()
    model_name: str | None = None

    @model_validator(mode="after")
    def _listed(self) -> TeacherEntry:
        if not self.replicas:
            object.__setattr__(self, "replicas", (self.endpoint,))
        elif self.replicas[0] != self.endpoint:
            raise ValueError(f"teacher {self.name!r}: endpoint {self.endpoint!r} is not its first replica "
                             f"{self.replicas[0]!r}")
        if len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"teacher {self.name!r}: a replica is listed twice: {list(self.replicas)}")
        return self


class Rendezvous(VersionedFile):
    """The content of ``<run_dir>/rendezvous.json``."""

    SCHEMA_VERSION: ClassVar[int] = SCHEMA_VERSION
    DESCRIPTION: ClassVar[str] = "a rendezvous file"
    model_config = ConfigDict(frozen=True, extra="allow")

    run_name: str
    routing: dict[str, str]  # agent alias -> teacher key
    default_alias: str | None = None
    strict: bool = False
    teachers: dict[str, TeacherEntry]  # teacher key -> entry

    @model_validator(mode="after")
    def _consistent(self) -> Rendezvous:
        unknown = sorted({k for k in self.routing.values() if k not in self.teachers})
        if unknown:
            raise ValueError(f"routing names teacher keys {unknown} that are not in 'teachers'")
        if self.default_alias is not None and self.default_alias not in self.routing:
            raise ValueError(
                f"default_alias {self.default_alias!r} is not a routed alias (known: {sorted(self.routing)})"
            )
        return self

    def resolve(self, agent_name: str) -> str:
        """The teacher key serving ``agent_name`` (an alias, a trainer's agent name, or a key)."""
        if agent_name not in self.routing and agent_name in self.teachers:
            return agent_name  # a teacher key names itself
        return route_agent(
            self.routing, self.default_alias, self.strict, agent_name, context=f"run {self.run_name!r}"
        )

    def entry(self, key: str) -> TeacherEntry:
        try:
            return self.teachers[key]
        except KeyError:
            raise RoutingError(f"run {self.run_name!r}: no teacher with key {key!r}") from None

    def with_replicas(self, key: str, endpoints: Sequence[str]) -> Rendezvous:
        """This rendezvous with teacher ``key`` served by the replicas whose records are ``endpoints``."""
        if not endpoints:
            raise ValueError(f"run {self.run_name!r}: teacher {key!r} needs at least one replica")
        changed = {**self.entry(key).model_dump(), "endpoint": endpoints[0], "replicas": tuple(endpoints)}
        return self.model_copy(update={"teachers": {**self.teachers, key: TeacherEntry.model_validate(changed)}})


def build_rendezvous(
    run_name: str,
    teachers: Iterable[Any],
    *,
    layout: RunLayout,
    default_alias: str | None = None,
    strict: bool = False,
    replicas: Mapping[str, Sequence[int]] | None = None,
) -> Rendezvous:
    """The rendezvous of a plan: ``teachers`` are ``TeacherSpec``s (or mappings with key, name,
    aliases and optionally ``replicas``, a count). ``replicas``: the replica indices to list per
    teacher key (default: ``0..n-1`` for the ``launcher.replicas`` count, or the mapping's)."""
    routing: dict[str, str] = {}
    entries: dict[str, TeacherEntry] = {}
    for spec in teachers:
        get = functools.partial(_spec_field, spec)
        key, name, aliases = get("key"), get("name"), tuple(get("aliases") or ())
        for alias in aliases:
            if alias in routing and routing[alias] != key:
                raise ValueError(f"alias {alias!r} routed to two teachers: {routing[alias]} and {key}")
            routing[alias] = key
        launcher = get("launcher")
        count = launcher.replicas if launcher is not None else int(get("replicas") or 1)
        listed = (replicas or {}).get(key, range(count))
        endpoints = tuple(layout.endpoint_relpath(name, key, i) for i in listed)
        entries[key] = TeacherEntry(name=name, aliases=aliases, endpoint=endpoints[0], replicas=endpoints,
                                    model_name=get("model_name"))
    return Rendezvous(run_name=run_name, routing=routing, default_alias=default_alias, strict=strict, teachers=entries)


def _spec_field(spec: Any, field: str) -> Any:
    """A field of a ``TeacherSpec`` or of a mapping standing for one (None when absent)."""
    return spec.get(field) if isinstance(spec, Mapping) else getattr(spec, field, None)


def write_rendezvous(layout: RunLayout, rendezvous: Rendezvous) -> Path:
    """Write ``rendezvous.json`` atomically and create each replica's folder."""
    ensure_dir(layout.run_dir)
    for entry in rendezvous.teachers.values():
        for path in entry.replicas:
            ensure_dir(layout.resolve(path).parent)
    atomic_write_json(layout.rendezvous_path, rendezvous.model_dump(mode="json"), mode=RENDEZVOUS_MODE)
    return layout.rendezvous_path


def read_rendezvous(path: str | Path) -> Rendezvous:
    """The rendezvous at ``path`` (the file, or its run dir); :class:`FileReadError` otherwise."""
    path = RunLayout.from_rendezvous_path(path).rendezvous_path
    return parse_model(Rendezvous, read_json(path), path, "a rendezvous file")
