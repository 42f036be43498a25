"""Processes a node task started, found and ended by recorded IDs (never by name), and its signals.

A teacher's node task shares its node with other jobs and other Ray clusters, so everything here
works from IDs the task recorded itself:

- a process is named by ``(pid, start time)`` (:class:`ProcRef`; the start time from
  ``/proc/<pid>/stat`` tells a reused PID from the recorded process); a zombie counts as ended;
- ``ray start`` runs in a session of its own (``start_new_session``), so the session id *is* the
  recorded ``ray start`` PID, and every Ray process of that node (GCS, raylet, agents, workers,
  which change their process group but not their session) is a member of it:
  :func:`session_members` lists them, :func:`kill_session` ends them all;
- the node task makes itself a *child subreaper*, so Ray processes orphaned during a teardown are
  re-parented to the task (still inside the Slurm step's process tree, so Slurm's final SIGKILL
  still reaches them) and are reaped by it.

Signals. Slurm sends the preemption signal (``--signal``, submitit's USR2) and SIGTERM to *every*
process of the step, Ray's included: a raylet killed by them takes the Ray driver (the head's node
task) down with it (its core worker exits the process), before it could drain, publish its record
or clean up. So the Ray tree runs with :data:`STOP_SIGNALS` *blocked* (the mask is inherited
through fork and exec, and installing a handler does not unblock it): only the node task reacts to
Slurm, and it ends Ray itself, by session, when it is done. The same mask closes the window at
start: :data:`SHIM_CODE` (what the Slurm job runs instead of plain ``python``) blocks the signals
before Python loads anything; a signal that arrives before the node task's handlers are installed
stays pending and is delivered to them when :func:`unblock_stop_signals` runs, instead of killing
the task.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2})
PR_SET_CHILD_SUBREAPER = 36

# Runs as `python -S -c SHIM_CODE <the real python arguments>`: block (the STOP_SIGNALS), then exec
# the real command with the mask in place.
SHIM_CODE = ("import os,signal,sys;"
             "signal.pthread_sigmask(signal.SIG_BLOCK,(signal.SIGTERM,signal.SIGINT,signal.SIGUSR1,signal.SIGUSR2));"
             "os.execv(sys.executable,[sys.executable]+sys.argv[1:])")


def shim_command(python: str) -> list[str]:
    """The interpreter prefix that blocks :data:`STOP_SIGNALS` before Python loads anything, then
    execs ``python`` with the arguments that follow (``[*shim_command(py), "-m", "mod", ...]``)."""
    return [python, "-S", "-c", SHIM_CODE]


def unblock_stop_signals() -> None:
    """Deliver pending stop signals (to the handlers installed by now) and accept new ones."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Stop signals stay pending in this block (children forked here inherit the blocked mask)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def set_child_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it (Linux); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state is index 0), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None when it does not exist)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


@dataclass(frozen=True)
class ProcRef:
    """A process as recorded: PID and start time (a reused PID is not the same process)."""

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> ProcRef:
        return cls(pid, start_time(pid))

    @classmethod
    def from_dict(cls, data: dict) -> ProcRef:
        return cls(int(data["pid"]), data.get("start"))

    def to_dict(self) -> dict[str, int | None]:
        return {"pid": self.pid, "start": self.start}

    def alive(self) -> bool:
        """Running (not a zombie) and still the recorded process."""
        fields = _stat_fields(self.pid)
        if fields is None or fields[0] in ("Z", "X"):
            return False
        return self.start is None or int(fields[19]) == self.start


def _all_pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def session_members(sid: int, *, include_zombies: bool = False) -> list[int]:
    """PIDs whose session id is ``sid`` (the recorded leader itself included while it lives)."""
    out = []
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if fields is None or int(fields[3]) != sid:
            continue
        if not include_zombies and fields[0] in ("Z", "X"):
            continue
        out.append(pid)
    return out


def session_alive(leader: ProcRef) -> list[int]:
    """Live members of the session ``leader`` started (empty once all have ended).

    Linux does not reuse a PID while any process still has it as its session id, so a different
    process now holding the leader's PID means the recorded session has ended entirely.
    """
    if leader.start is not None:
        now = start_time(leader.pid)
        if now is not None and now != leader.start:
            return []
    return session_members(leader.pid)


def _reap(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not our child (its own parent reaps it)
        except OSError:
            pass


def kill_session(leader: ProcRef, timeout_s: float = 10.0, not_reaped: Iterable[int] = ()) -> list[int]:
    """SIGKILL every live member of ``leader``'s session until none is left; returns survivors.

    Members that are (or become, as orphans of a subreaper) children of this process are reaped,
    except ``not_reaped`` (``Popen`` children whose exit status their owner collects).
    """
    keep = set(not_reaped)
    deadline = time.monotonic() + timeout_s
    seen: set[int] = set()
    while True:
        members = session_alive(leader)
        if not members:
            _reap(seen - keep)
            return []
        for pid in members:
            seen.add(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _reap(seen - keep)
        if time.monotonic() > deadline:
            logger.error("session %d: processes %s survive SIGKILL after %.0fs", leader.pid, members, timeout_s)
            return members
        time.sleep(0.05)


def reap_orphans(exclude: Iterable[int] = ()) -> None:
    """Reap zombie children of this process, except ``exclude`` (``Popen`` children it waits for).

    As a subreaper the node task inherits Ray's orphans; reaping them by PID (never
    ``waitpid(-1)``) leaves the exit status of its own ``subprocess`` children intact.
    """
    me, skip = os.getpid(), set(exclude)
    for pid in _all_pids():
        fields = _stat_fields(pid)
        if pid not in skip and fields is not None and int(fields[1]) == me and fields[0] == "Z":
            _reap([pid])
