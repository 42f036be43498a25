"""The run's bearer token: made once per run, stored only in a 0600 file, compared in constant time.

The launcher calls :func:`create_token` when it makes the run directory; the teacher's head process
and the trainer's client call :func:`read_token`. A token file that others can read is refused (as
ssh refuses a private key), because the token is the only thing guarding the endpoints.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from pathlib import Path

from podium.rendezvous.atomic import CORRUPT, UNREADABLE, FileReadError, atomic_write_bytes, file_mode, read_bytes
from podium.rendezvous.layout import AUTH_TOKEN_MODE

logger = logging.getLogger(__name__)

TOKEN_BYTES = 32


def new_token() -> str:
    """A fresh random token (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def write_token(path: str | Path, token: str) -> None:
    """Write ``token`` to ``path`` atomically with mode 0600."""
    if not token or any(c.isspace() for c in token):
        raise ValueError("auth token must be non-empty and contain no whitespace")
    atomic_write_bytes(path, (token + "\n").encode("ascii"), mode=AUTH_TOKEN_MODE)


def create_token(path: str | Path) -> str:
    """Make a new token, store it in ``path`` (0600) and return it."""
    token = new_token()
    write_token(path, token)
    return token


def read_token(path: str | Path) -> str:
    """The token in ``path``; :class:`FileReadError` if it is missing, empty or not 0600-private."""
    path = Path(path)
    raw = read_bytes(path)
    mode = file_mode(path)
    if mode & 0o077:
        raise FileReadError(
            path, UNREADABLE, f"auth token file has mode {mode:04o}; it must not be readable by "
            f"group or others (chmod 600 {path})"
        )
    token = raw.decode("ascii", errors="replace").strip()
    if not token:
        raise FileReadError(path, CORRUPT, "empty auth token file")
    return token


def tokens_equal(given: str | bytes, expected: str | bytes) -> bool:
    """Constant-time comparison (``hmac.compare_digest``) of two tokens."""
    if isinstance(given, str):
        given = given.encode("utf-8", errors="replace")
    if isinstance(expected, str):
        expected = expected.encode("utf-8", errors="replace")
    return hmac.compare_digest(given, expected)
