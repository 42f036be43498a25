"""User-facing configuration errors.

Every error that a recipe, an override or the launcher section can cause is a ``ConfigError`` whose
message names the file, the key path or both. The CLI turns it into exit code 2 before anything is
written or submitted.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


class ConfigError(ValueError):
    """A recipe, an override or a launcher setting that podium cannot accept."""


def closest(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to ``name`` (difflib), if one is close enough to be what was meant."""
    match = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """`" (did you mean 'x'?)"` when a close match exists, else ''."""
    match = closest(name, valid)
    return f" (did you mean {match!r}?)" if match else ""


def refusal(problems: Sequence[str]) -> ConfigError:
    """One error for every problem found at once: the problem itself when there is one, else their
    count and one indented line each (each line its key path first)."""
    if len(problems) == 1:
        return ConfigError(problems[0])
    return ConfigError(f"{len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems))
