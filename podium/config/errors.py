"""User-facing configuration errors.

Every error that a recipe, an override or the launcher section can cause is a ``ConfigError`` whose
message names the file, the key path or both. The CLI turns it into exit code 2 before anything is
written or submitted.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A recipe, an override or a launcher setting that podium cannot accept."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """`" (did you mean 'x'?)"` when a close match exists, else ''."""
    match = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""
