"""The tokenizer fingerprint: one definition, used by teachers (published) and trainers (checked).

A fingerprint is the SHA-256 of a HF tokenizer's vocabulary (every ``(id, token)`` of
``get_vocab()``, added tokens included, in id order), so two tokenizers that map every token to the
same id agree, whatever their file format or class. Special-token roles and normalisation rules
are not part of it: they change how text becomes ids, not what an id means to the teacher.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PREFIX = "vocab-sha256:"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt")


def vocab_fingerprint(vocab: Mapping[str, int]) -> str:
    """Fingerprint of a ``token -> id`` mapping."""
    digest = hashlib.sha256()
    for token, index in sorted(vocab.items(), key=lambda item: (item[1], item[0])):
        digest.update(str(int(index)).encode("ascii"))
        digest.update(b"\t")
        digest.update(token.encode("utf-8", errors="surrogatepass"))
        digest.update(b"\n")
    return PREFIX + digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Fingerprint of a HF tokenizer (anything with ``get_vocab()``)."""
    return vocab_fingerprint(tokenizer.get_vocab())


def tokenizer_size(tokenizer: Any) -> int:
    """Number of ids the tokenizer can produce (``len(tokenizer)``, added tokens included)."""
    try:
        return len(tokenizer)
    except TypeError:
        return len(tokenizer.get_vocab())


def fingerprint_from_pretrained(path: str | Path) -> tuple[str | None, int | None]:
    """(fingerprint, size) of the tokenizer saved in ``path``; (None, None) when there is none.

    Loads with ``local_files_only``: never reaches a model hub.
    """
    tokenizer = load_tokenizer(path)
    if tokenizer is None:
        return None, None
    return tokenizer_fingerprint(tokenizer), tokenizer_size(tokenizer)


def load_tokenizer(path: str | Path) -> Any:
    """The HF tokenizer saved in ``path`` (``local_files_only``: never a model hub); None when
    there is none."""
    path = Path(path)
    if not path.is_dir() or not any((path / name).exists() for name in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
