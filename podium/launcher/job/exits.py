"""Why a process a node task started has died, in one line: the first line of its log that says
why, and the log's path.

What the head publishes when its ``ray start`` (or another process it started) dies is this line
(in the endpoint record's ``reason``, hence what ``podium up --wait`` and ``podium status`` print),
not the log's tail: a user reads the cause at once and knows where the rest is.

"The first line that says why", in order of what a log shows:

- a Python traceback: its exception line (``ValueError: ...``), the first line after
  ``Traceback (most recent call last):`` that is not indented (the first traceback's: the
  original cause, not what handling it raised);
- otherwise the first line that reads as an error: ``Error: ...`` (click, so ``ray start``'s
  argument errors), ``error: ...``, ``FATAL``/``CRITICAL``, a log record at level ``ERROR``;
- otherwise the last line that is not empty.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

MAX_CAUSE_CHARS = 300
TAIL_BYTES = 64 * 1024  # the cause is near the end of a dying process's log; read this much of it
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TRACEBACK = "Traceback (most recent call last):"
_ERROR_PREFIX = re.compile(r"^(error|fatal|critical)\b\s*[:!]", re.IGNORECASE)
_ERROR_LEVEL = re.compile(r"\b(ERROR|FATAL|CRITICAL)\b")
LEVEL_WITHIN = 60  # a log record's level comes after its timestamp, within this many characters


def clean_cause(line: str) -> str:
    """``line`` stripped and cut to :data:`MAX_CAUSE_CHARS`."""
    line = line.strip()
    return line if len(line) <= MAX_CAUSE_CHARS else line[: MAX_CAUSE_CHARS - 1] + "…"


def _is_error(line: str) -> bool:
    """``Error: ...`` and the like, or a log record at level ERROR/FATAL/CRITICAL (the level near
    the start, not the word inside a message about something else)."""
    stripped = line.strip()
    return bool(_ERROR_PREFIX.match(stripped) or _ERROR_LEVEL.search(stripped[:LEVEL_WITHIN]))


def first_cause(text: str) -> str | None:
    """The first line of ``text`` that says why (see the module docstring); None for an empty log."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    in_traceback = False
    error_line: str | None = None
    for line in lines:
        if line.strip() == _TRACEBACK:
            in_traceback = True
        elif in_traceback and line.strip() and not line[:1].isspace():
            return clean_cause(line)  # the first unindented line after the frames: the exception
        elif not in_traceback and error_line is None and _is_error(line):
            error_line = line
    if error_line is not None:
        return clean_cause(error_line)
    rest = [line for line in lines if line.strip()]
    return clean_cause(rest[-1]) if rest else None


def read_tail(path: Path) -> str:
    """The last :data:`TAIL_BYTES` of ``path`` ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def exit_status(returncode: int | None) -> str:
    """``exited with 1`` / ``was killed by SIGKILL`` (a ``Popen.returncode``)."""
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with {returncode}"


def describe_death(what: str, pid: int, returncode: int | None, log: Path, detail: str | None = None) -> str:
    """One line: ``<what> (pid N) exited with 1: <the first line that says why>[; <detail>]; log
    <path>`` (``detail``: what another log of the process's children adds)."""
    cause = first_cause(read_tail(log))
    more = f"; {detail}" if detail else ""
    return f"{what} (pid {pid}) {exit_status(returncode)}: {cause or 'its log is empty'}{more}; log {log}"
