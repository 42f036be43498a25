"""Atomic file replacement and tolerant reading, for files shared through a (network) filesystem.

Owns the one way podium writes a file other processes read: write a temp file in the same
directory, fsync it, ``os.replace`` it over the target, fsync the directory. A reader therefore sees
the old file or the new one, never a mix, with no lock (shared filesystems differ in lock support).
The temp file is created with its final mode (``0600`` for anything holding the token) before a
byte is written, so a secret is never readable by others even for an instant.

Reading never raises anything but :class:`FileReadError`, which names the path and says whether the
file is missing, unreadable or corrupt (truncated, not JSON, not the expected shape); a caller that
prefers a value to an exception uses :func:`try_read_json`.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from podium.rendezvous.schema import NewerSchemaError

logger = logging.getLogger(__name__)

MISSING = "missing"
UNREADABLE = "unreadable"
CORRUPT = "corrupt"
NEWER = "newer"  # written with a newer schema than this podium reads (podium.rendezvous.schema)


class FileReadError(Exception):
    """A shared file could not be read as expected; ``kind`` is missing, unreadable, corrupt or newer."""

    def __init__(self, path: str | Path, kind: str, detail: str) -> None:
        self.path = Path(path)
        self.kind = kind
        self.detail = detail
        super().__init__(f"{self.path}: {kind}: {detail}")


@dataclass(frozen=True)
class ReadResult:
    """What :func:`try_read_json` found: ``data`` when ``error`` is None."""

    path: Path
    data: Any = None
    error: FileReadError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fsync_dir(directory: str | Path, *, files: bool = False) -> None:
    """Make a directory's entries durable (and, with ``files``, the content of its regular files).

    Best effort on filesystems that refuse to open or fsync directories (logged, not raised).
    """
    directory = Path(directory)
    if files:
        for entry in directory.iterdir():
            if entry.is_file():
                with open(entry, "rb") as handle:
                    os.fsync(handle.fileno())
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:  # some filesystems refuse to open directories
        logger.debug("cannot open %s to fsync it: %s", directory, exc)
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # EINVAL on filesystems without directory fsync
        logger.debug("fsync of directory %s failed: %s", directory, exc)
    finally:
        os.close(fd)


def atomic_write_bytes(
    path: str | Path,
    data: bytes,
    *,
    mode: int = 0o644,
    before_replace: Callable[[], None] | None = None,
) -> None:
    """Replace ``path`` with ``data``: temp file in the same directory, fsync, rename, fsync dir.

    ``mode`` is set on the temp file before any byte is written (umask does not loosen or tighten
    it). ``before_replace`` runs after the temp file is durable and just before the rename; if it
    raises, the temp file is removed, ``path`` is untouched and the exception propagates (the
    endpoint record writer uses it to re-check its fence).
    """
    path = Path(path)
    directory = path.parent
    tmp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def dumps_json(obj: Any) -> bytes:
    """The JSON form podium writes: sorted keys, indented, one trailing newline."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def atomic_write_json(
    path: str | Path,
    obj: Any,
    *,
    mode: int = 0o644,
    before_replace: Callable[[], None] | None = None,
) -> None:
    """:func:`atomic_write_bytes` of ``obj`` as JSON."""
    atomic_write_bytes(path, dumps_json(obj), mode=mode, before_replace=before_replace)


def read_bytes(path: str | Path) -> bytes:
    """The bytes of ``path``, or :class:`FileReadError` (missing / unreadable)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise FileReadError(path, MISSING, "no such file") from None
    except IsADirectoryError:
        raise FileReadError(path, UNREADABLE, "is a directory") from None
    except OSError as exc:
        raise FileReadError(path, UNREADABLE, exc.strerror or str(exc)) from None


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; any problem is a :class:`FileReadError` naming the path."""
    raw = read_bytes(path)
    if not raw.strip():
        raise FileReadError(path, CORRUPT, f"empty file ({len(raw)} bytes)")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FileReadError(path, CORRUPT, f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise FileReadError(
            path, CORRUPT, f"not valid JSON, truncated or damaged ({exc.msg} at char {exc.pos} of {len(raw)})"
        ) from None


def try_read_json(path: str | Path) -> ReadResult:
    """:func:`read_json` as a value: never raises."""
    try:
        return ReadResult(Path(path), read_json(path))
    except FileReadError as exc:
        return ReadResult(Path(path), None, exc)


def file_mode(path: str | Path) -> int:
    """The permission bits of ``path``."""
    return os.stat(path).st_mode & 0o777


def ensure_dir(path: str | Path, mode: int = 0o755) -> Path:
    """Create ``path`` (and parents) if needed; an existing directory is left as it is."""
    path = Path(path)
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except FileExistsError:
        raise FileReadError(path, UNREADABLE, "exists and is not a directory") from None
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
    return path


ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_model(model: type[ModelT], data: Any, path: str | Path, what: str) -> ModelT:
    """Validate decoded JSON as ``model``; a bad shape is a corrupt file (:class:`FileReadError`)
    whose message names the first fields at fault."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, NewerSchemaError):
                raise FileReadError(path, NEWER, str(cause)) from None
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise FileReadError(path, CORRUPT, f"not {what} ({problems})") from None
