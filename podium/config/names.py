"""The rule for names that reach a shell line or a file name: agent aliases and teacher names.

An alias becomes the teacher's name, which is written into the job script (its comment lines and
``--job-name``), the job's Slurm name and the teacher's folder name. ``shlex.quote`` keeps a value
one shell word, but a newline inside it still ends the script line it is on (and a comment line is
not quoted at all), so the next line is a command of its own. Such names are refused at plan time
(:func:`name_problem`, used by the planner for the recipe's key paths and by ``TeacherSpec``'s
validator, so a spec built any other way is refused too).
"""

from __future__ import annotations

import unicodedata


def name_problem(name: str) -> str | None:
    """What keeps ``name`` from being be an alias or teacher name (control characters: any character whose
    Unicode category starts with ``C``, newline and tab included), or None when it can."""
    bad = sorted({ch for ch in name if unicodedata.category(ch).startswith("C")})
    if not bad:
        return None
    listed = ", ".join(f"U+{ord(ch):04X}" for ch in bad)
    return (f"contains control characters ({listed}): aliases name jobs, script lines and folders, "
            f"so they must be printable")
