"""The run's bearer token: made once per run, stored only in a 0600 file, compared in constant time.

The launcher calls :func:`create_token` when it makes the run directory; the teacher's head process
and the trainer's client call :func:`read_token`. A token file that others can read is refused (as
ssh refuses a private key), because the token is the only thing guarding the endpoints.

The token also lets a server prove who it is before a client sends it the token:
:func:`server_proof` is the answer to a client's fresh :func:`new_nonce` (an HMAC with the token,
bound to the generation and teacher the client's record names), so whatever listens at a dead
teacher's address cannot pass for it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from pathlib import Path

from podium.rendezvous.atomic import CORRUPT, UNREADABLE, FileReadError, atomic_write_bytes, file_mode, read_bytes
from podium.rendezvous.layout import AUTH_TOKEN_MODE

logger = logging.getLogger(__name__)

TOKEN_BYTES = 32
NONCE_BYTES = 32
PROOF_CONTEXT = "podium-proof"  # what the proof's HMAC is about: never the same message as anything else


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


def new_nonce() -> str:
    """A fresh challenge for a server's proof (:data:`NONCE_BYTES` random bytes, hex)."""
    return secrets.token_hex(NONCE_BYTES)


def server_proof(token: str, nonce: str, generation: str, teacher_key: str) -> str:
    """Hex ``HMAC-SHA256(token, "podium-proof|<nonce>|<generation>|<teacher_key>")``: only a holder
    of the run's token can compute it for a nonce it has not seen, and it names the generation and
    the teacher the server says it is."""
    message = "|".join((PROOF_CONTEXT, nonce, generation, teacher_key)).encode("utf-8")
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).hexdigest()
