"""A run directory for the endpoint and client tests, and the teachers it names.

- :class:`TeacherDef`: a teacher as ``rendezvous.json`` lists it (key, name, aliases, replicas);
- :data:`LLAMA`/:data:`QWEN` and :func:`make_group`: the real groups ``fixtures.groups`` shares
  across the session;
- :func:`make_run`: a run dir with ``rendezvous.json`` and a 0600 token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.rendezvous import RunLayout, build_rendezvous, create_token, write_rendezvous


@dataclass
class TeacherDef:
    """One teacher of a test run, as the rendezvous names it."""

    key: str
    name: str
    aliases: tuple[str, ...]
    model_name: str | None = None  # the checkpoint the rendezvous names (None: not named)
    replicas: int = 1  # replicas the rendezvous lists (their records: layout.endpoint_path(name, key, i))


LLAMA = TeacherDef("11a11a11a11a", "llama", ("llama", "math"))
QWEN = TeacherDef("22b22b22b22b", "qwen", ("qwen", "chat"))


def make_group(checkpoint: Path, definition: TeacherDef, **fields: Any) -> Any:
    """A real one-worker ``TeacherWorkerGroup`` (fp32) on a tiny checkpoint."""
    from podium.config.spec import TeacherSpec
    from podium.teacher.compute.group import TeacherWorkerGroup

    spec = TeacherSpec(key=definition.key, name=definition.name, aliases=definition.aliases,
                       model_name=str(checkpoint), num_nodes=1, gpus_per_node=1, precision="fp32", **fields)
    return TeacherWorkerGroup(spec)


def make_run(tmp_path: Path, teachers: Sequence[TeacherDef], *, default_alias: str | None = None,
             strict: bool = False, run_name: str = "test-run") -> tuple[RunLayout, str]:
    """A run dir with rendezvous.json and auth_token; returns (layout, token)."""
    layout = RunLayout(tmp_path / "run")
    rdv = build_rendezvous(run_name, [t.__dict__ for t in teachers], layout=layout,
                           default_alias=default_alias, strict=strict)
    write_rendezvous(layout, rdv)
    token = create_token(layout.auth_token_path)
    return layout, token


