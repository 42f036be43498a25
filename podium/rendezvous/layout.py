"""The run directory's file names: the one place that says which file holds what.

Every path of a run directory that more than one part of podium touches is named here, next to
the constant that names it, so the launcher (which creates the directory), the teacher's head
process (which publishes its endpoint) and the trainer's client (which finds it) agree.

=====================================================  ======  ======================================
path (relative to ``<run_dir>``)                       mode    written by / holds
=====================================================  ======  ======================================
``rendezvous.json``                                    0644    launcher, once per ``up``: run name,
                                                               routing (alias -> teacher key,
                                                               default alias, strict flag), and per
                                                               teacher key its name, aliases and the
                                                               relative path of its endpoint record
``auth_token``                                         0600    launcher: the run's bearer token
``teachers/``                                          0755    one folder per unique teacher
``teachers/<name>-<key8>/``                            0755    that teacher's folder (its replica 0);
                                                               the launcher adds ``job.json``,
                                                               ``submitit/`` ...
``teachers/<name>-<key8>-r<i>/``                       0755    the folder of the teacher's replica
                                                               ``i`` >= 1 (``podium.replicas``): the
                                                               same files, its own job
``teachers/<name>-<key8>/endpoint.json``               0600    only that teacher's head process: the
                                                               endpoint record (status, URL,
                                                               generation, heartbeat, model)
``fronts/<host>-<pid>.json``                           0644    only the ``podium front`` process
                                                               ``<pid>`` on ``<host>``: where it
                                                               listens, each alias's base URL;
                                                               removed when it stops
=====================================================  ======  ======================================

``<name>`` is the teacher's readable name (its first alias) made safe for a file name, ``<key8>``
the first 8 characters of its content key, so two teachers never share a folder and a human can
still tell them apart. A teacher served by several replicas (independent allocations of the same
model) has one folder per replica; replica 0's is the folder a one-replica teacher has, so one
replica is exactly the layout without replicas. ``rendezvous.json`` lists every replica's record.
The endpoint record is 0600 because it carries the URL a token opens; it holds no token itself.
Every file is replaced whole (``podium.rendezvous.atomic``), never edited in place.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

RENDEZVOUS_FILE = "rendezvous.json"
AUTH_TOKEN_FILE = "auth_token"
TEACHERS_DIR = "teachers"
ENDPOINT_FILE = "endpoint.json"
FRONTS_DIR = "fronts"

RENDEZVOUS_MODE = 0o644
AUTH_TOKEN_MODE = 0o600
ENDPOINT_MODE = 0o600
DIR_MODE = 0o755

KEY_PREFIX_LEN = 8
REPLICA_SUFFIX = "-r"  # + the replica's index, on the folders of replicas 1, 2, ...

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(name: str) -> str:
    """``name`` reduced to characters that are safe in a file name on any filesystem."""
    cleaned = _UNSAFE.sub("_", name).strip("._") or "teacher"
    return cleaned[:64]


def teacher_dir_name(name: str, key: str, replica: int = 0) -> str:
    """``<name>-<key8>`` (replica 0) or ``<name>-<key8>-r<replica>``: the folder of one replica of
    a teacher inside ``teachers/``. The suffix follows the 8 hex characters of the key, so no
    teacher's name can make one teacher's replica folder another teacher's folder."""
    if not key:
        raise ValueError(f"teacher {name!r}: empty key")
    if replica < 0:
        raise ValueError(f"teacher {name!r}: replica {replica} < 0")
    suffix = f"{REPLICA_SUFFIX}{replica}" if replica else ""
    return f"{safe_name(name)}-{key[:KEY_PREFIX_LEN]}{suffix}"


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory (pure: creates nothing)."""

    run_dir: Path

    def __init__(self, run_dir: str | Path) -> None:
        object.__setattr__(self, "run_dir", Path(run_dir))

    @classmethod
    def from_rendezvous_path(cls, path: str | os.PathLike[str]) -> RunLayout:
        """The layout whose ``rendezvous.json`` is ``path`` (what trainers are given), or whose run
        dir it is: a path that is not a file (a run dir not made yet, a typo) is a run dir, so an
        error names ``<path>/rendezvous.json``, not a file beside it."""
        path = Path(path)
        if path.is_file() or path.name == RENDEZVOUS_FILE:
            return cls(path.parent)
        return cls(path)

    @property
    def rendezvous_path(self) -> Path:
        return self.run_dir / RENDEZVOUS_FILE

    @property
    def auth_token_path(self) -> Path:
        return self.run_dir / AUTH_TOKEN_FILE

    @property
    def teachers_dir(self) -> Path:
        return self.run_dir / TEACHERS_DIR

    @property
    def fronts_dir(self) -> Path:
        return self.run_dir / FRONTS_DIR

    def front_path(self, host: str, pid: int) -> Path:
        """The file of the ``podium front`` process ``pid`` on ``host``."""
        return self.fronts_dir / f"{safe_name(host)}-{pid}.json"

    def teacher_dir(self, name: str, key: str, replica: int = 0) -> Path:
        return self.teachers_dir / teacher_dir_name(name, key, replica)

    def endpoint_relpath(self, name: str, key: str, replica: int = 0) -> str:
        """Path of a replica's endpoint record relative to the run dir, as ``rendezvous.json`` lists it."""
        return f"{TEACHERS_DIR}/{teacher_dir_name(name, key, replica)}/{ENDPOINT_FILE}"

    def endpoint_path(self, name: str, key: str, replica: int = 0) -> Path:
        return self.run_dir / self.endpoint_relpath(name, key, replica)

    def resolve(self, relpath: str) -> Path:
        """A relative path from ``rendezvous.json``, resolved inside the run dir (no escaping it)."""
        candidate = Path(relpath)
        if candidate.is_absolute() or ".." in candidate.parts:
            raise ValueError(
                f"{self.rendezvous_path}: path {relpath!r} must be relative to the run dir"
            )
        return self.run_dir / candidate
