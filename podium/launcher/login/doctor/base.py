"""What every doctor check shares: the :class:`Check` row and its states, a command's answer
within a timeout, and the scratch folder (``.doctor/``) a check makes in the run dir and removes."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

PASS, FAIL, SKIP = "pass", "fail", "skip"
QUERY_TIMEOUT_S = 30.0
DOCTOR_DIR = ".doctor"  # inside the run dir; removed after the check


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table: what was checked, what was seen, and the fix if it failed."""

    name: str
    state: str  # PASS | FAIL | SKIP
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.state != FAIL

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def run_query(cmd: Sequence[str], timeout_s: float = QUERY_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a command; 127 when it is not installed, 124 on timeout."""
    try:
        proc = subprocess.run(list(cmd), check=False, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return 127, "", f"{cmd[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer within {timeout_s:.0f}s"
    return proc.returncode, proc.stdout, proc.stderr


def missing_folders(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first (what ``mkdir -p`` makes)."""
    out = []
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def remove_empty(made: Sequence[Path]) -> None:
    """Remove the folders the doctor made (deepest first), if they are still empty."""
    for path in made:
        try:
            path.rmdir()
        except OSError:
            return
