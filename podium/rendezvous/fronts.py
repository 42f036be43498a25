"""Where a run's ``podium front`` processes listen: one file per front, ``fronts/<host>-<pid>.json``.

Owns :class:`FrontRecord` (the file's model), its one writer (:func:`write_front`, atomic as every
run-dir file: :mod:`podium.rendezvous.atomic`; :func:`remove_front` when the front stops) and its
readers (:func:`read_fronts`, for ``podium status``). Only the front process the file names writes
it. A front killed without its cleanup leaves its file behind: a reader tells by the pid on its own
host (:meth:`FrontRecord.alive_here`), and says so rather than hiding it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import ClassVar

from pydantic import ConfigDict, Field

from podium.rendezvous.atomic import FileReadError, atomic_write_json, ensure_dir, parse_model, read_json
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.schema import VersionedFile

FRONT_MODE = 0o644  # no secret: the URLs, not the token


class FrontRecord(VersionedFile):
    """One front of a run: where it listens and each alias's base URL."""

    SCHEMA_VERSION: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "a front's file"
    model_config = ConfigDict(frozen=True, extra="allow")

    url: str  # http://host:port
    host: str  # the machine it runs on (socket.gethostname())
    pid: int
    aliases: dict[str, str] = Field(default_factory=dict)  # alias -> base URL
    auth: bool = True  # False: started with --no-auth (loopback only)
    started_at: float = Field(default_factory=time.time)

    def alive_here(self) -> bool | None:
        """Whether its process runs (None: it runs on another host, this one cannot tell)."""
        if self.host != socket.gethostname():
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def write_front(layout: RunLayout, record: FrontRecord) -> Path:
    """Write this front's file (atomic); returns its path."""
    ensure_dir(layout.fronts_dir)
    path = layout.front_path(record.host, record.pid)
    atomic_write_json(path, record.model_dump(mode="json"), mode=FRONT_MODE)
    return path


def remove_front(path: Path) -> None:
    """The front stopped: its file goes (already gone: nothing to do)."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def read_fronts(layout: RunLayout) -> list[FrontRecord | FileReadError]:
    """Every front file of the run, oldest first (an unreadable one as its :class:`FileReadError`)."""
    if not layout.fronts_dir.is_dir():
        return []
    found: list[FrontRecord | FileReadError] = []
    for path in sorted(layout.fronts_dir.glob("*.json")):
        try:
            found.append(parse_model(FrontRecord, read_json(path), path, "a front's file"))
        except FileReadError as exc:
            found.append(exc)
    return sorted(found, key=lambda f: f.started_at if isinstance(f, FrontRecord) else 0.0)
