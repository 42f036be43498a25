"""The submit claim: which one ``podium up`` may submit a teacher's job, on a filesystem without locks.

Claims are numbered files in the teacher's folder, ``submit.claim.<N>``; the *current* claim is the
highest number present. ``O_EXCL`` creation is the only atomic step podium relies on (shared
filesystems differ in lock support; exclusive create works on NFSv3+, Lustre, GPFS):

- to claim, read the current claim ``N`` (none: ``N = -1``); if it is *held* (not released, not
  stale) wait; else create ``N+1`` exclusively. Of all processes that judged ``N`` free, exactly one
  creates ``N+1``: taking a claim over is a new name, never the unlink and re-create of the old one
  (which two processes that both judged it stale could both do);
- after creating ``N+1`` the winner checks that no higher number exists (a process that listed long
  ago may create a number that was already superseded and removed: it sees the higher one and
  gives way), then removes the claims below its own. The highest number is never removed, only
  superseded, so a number is created at most once while it could matter;
- releasing replaces the claim's content (atomic rename) with ``{"released": true}``: the name
  stays, the next ``up`` creates ``N+2``.

A claim is stale when its holder cannot be submitting any more: its holder on this host has ended
(PID *and* start time, :class:`~podium.launcher.common.procs.ProcRef`, so a reused PID is not taken for
it), or, held from another host (whose processes cannot be seen), it is older than
:data:`~podium.launcher.common.files.CLAIM_STALE_S`. A live holder on this host is never stale, however
long its ``sbatch`` takes. A claim just created has no payload yet: it is judged by its file's
age, so it is not stale.

The same claim guards other read-modify-writes of a shared file: :class:`ClaimSet` names a set of
numbered claims in any folder (``rendezvous.claim.<N>`` in the run dir: every edit of
``rendezvous.json`` by ``up`` and ``scale``), and :func:`holding` waits for one and releases it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from podium.launcher.common.files import CLAIM_STALE_S, FILE_MODE, numbered_files
from podium.launcher.common.procs import ProcRef
from podium.poll import PollTimeout, poll_until
from podium.rendezvous.atomic import atomic_write_json, try_read_json

logger = logging.getLogger(__name__)

CLAIM_POLL_S = 0.1  # :func:`holding`: how often a held claim is looked at again


class Claims(Protocol):
    """Where a set of numbered claims lives (a teacher's :class:`~podium.launcher.common.files.TeacherFiles`
    for its submit claim, a :class:`ClaimSet` otherwise)."""

    @property
    def folder(self) -> Path: ...

    def claim(self, number: int) -> Path: ...

    def claim_numbers(self) -> list[int]: ...


@dataclass(frozen=True)
class ClaimSet:
    """Numbered claims ``<prefix><N>`` in ``folder``."""

    folder: Path
    prefix: str

    def claim(self, number: int) -> Path:
        return self.folder / f"{self.prefix}{number}"

    def claim_numbers(self) -> list[int]:
        return numbered_files(self.folder, self.prefix)


@dataclass(frozen=True)
class Claim:
    """A claim this process holds."""

    files: Claims
    number: int

    @property
    def path(self) -> Path:
        return self.files.claim(self.number)

    def superseded(self) -> bool:
        """Another ``up`` took this claim over (it judged it stale): a higher number exists."""
        return any(n > self.number for n in self.files.claim_numbers())

    def release(self) -> None:
        """Mark it released (the file stays: the next claim takes the next number); a claim taken
        over meanwhile is left to its new holder."""
        if self.superseded() or not self.path.exists():
            logger.warning("%s was taken over by another `podium up` while this one held it", self.path)
            return
        atomic_write_json(self.path, {"released": True, "time": time.time(), "by": _holder()}, mode=FILE_MODE)


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _payload() -> str:
    me = ProcRef.of(os.getpid())
    return json.dumps({"pid": me.pid, "start": me.start, "host": socket.gethostname(), "time": time.time()})


def claim_state(files: Claims, number: int, now: float | None = None) -> str:
    """``held``, ``released``, ``stale`` or ``gone`` (superseded and removed meanwhile)."""
    path = files.claim(number)
    found = try_read_json(path)
    try:
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except FileNotFoundError:
        return "gone"
    if found.ok and isinstance(found.data, dict):
        data = found.data
        if data.get("released"):
            return "released"
        if data.get("host") == socket.gethostname() and isinstance(data.get("pid"), int):
            # A holder on this host is seen: stale once it has ended, held while it lives.
            return "held" if ProcRef(data["pid"], data.get("start")).alive() else "stale"
    # No payload yet (just created, being written) or a holder elsewhere: judged by its age.
    return "stale" if age > CLAIM_STALE_S else "held"


def try_claim(files: Claims) -> Claim | None:
    """Take the claim (a teacher's submit claim: its files), or None when another live process
    holds it (or won it now)."""
    numbers = files.claim_numbers()
    top = max(numbers, default=-1)
    state = claim_state(files, top) if top >= 0 else "released"
    if state in ("held", "gone"):
        return None
    mine = top + 1
    path = files.claim(mine)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return None  # another process took over the same claim first
    with os.fdopen(fd, "w") as handle:
        handle.write(_payload())
    claim = Claim(files, mine)
    later = [n for n in files.claim_numbers() if n > mine]
    if later:  # we listed before a later claim was taken, and re-created a superseded number
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return None
    if state == "stale":
        logger.warning("took over stale claim %s with %s", files.claim(top), path)
    for number in files.claim_numbers():
        if number < mine:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(files.claim(number))
    return claim


@contextlib.contextmanager
def holding(files: Claims, what: str, timeout_s: float) -> Iterator[Claim]:
    """Hold the claim for the block (waiting up to ``timeout_s`` for another holder to release
    it); ``TimeoutError`` naming ``what`` when it does not."""
    try:
        claim = poll_until(lambda: try_claim(files), timeout_s=timeout_s, interval_s=CLAIM_POLL_S,
                           what=f"{what} ({files.folder})")
    except PollTimeout as exc:
        raise TimeoutError(f"{exc}: another podium process holds it") from None
    try:
        yield claim
    finally:
        claim.release()
