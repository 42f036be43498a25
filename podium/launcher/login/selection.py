"""Which teachers of a run directory the words a user typed name: the one resolver of ``podium down``,
``logs`` and ``scale``.

A word names a replica when it is one of :attr:`podium.config.spec.TeacherSpec.names`: the
teacher's name, key or any of its aliases (every replica of it), its folder name
(``math-1a2b3c4d-r1``) or its display name (``math#1``). A word that names nothing is an error
listing the run's teachers, so a typo never passes silently as "nothing to do".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from podium.config.spec import TeacherSpec
from podium.launcher.common.files import TeacherFiles
from podium.launcher.login.run_dir import known_teachers

Found = tuple[TeacherSpec, TeacherFiles]


class UnknownTeacherError(ValueError):
    """A word names no teacher of the run directory."""

    def __init__(self, word: str, run_dir: Path, names: Sequence[str]) -> None:
        super().__init__(f"no teacher {word!r} in {run_dir} (teachers: {', '.join(names) or 'none'})")
        self.word = word
        self.names = tuple(names)


def select(known: Sequence[Found], words: Sequence[str], run_dir: Path) -> list[Found]:
    """The replicas of ``known`` (:func:`known_teachers` of ``run_dir``) that any of ``words`` names,
    in ``known``'s order; every replica for no words. :class:`UnknownTeacherError` for a word that
    names none."""
    if not words:
        return list(known)
    for word in words:
        if not any(word in spec.names for spec, _ in known):
            raise UnknownTeacherError(word, run_dir, list(dict.fromkeys(spec.name for spec, _ in known)))
    wanted = set(words)
    return [(spec, files) for spec, files in known if spec.names & wanted]


def resolve(run_dir: Path, words: Sequence[str]) -> list[Found]:
    """:func:`select` over the teachers found in ``run_dir``."""
    run_dir = run_dir.absolute()
    return select(known_teachers(run_dir), words, run_dir)
