"""Slurm's text, parsed: job states from ``sacct --parsable2`` and ``squeue``, node lists, times.

Pure functions over strings (tested on real output of the Slurm 22.05 test cluster, odd cases
included), plus the few queries that run ``sacct``/``squeue``/``scontrol`` (:func:`query_states`,
:func:`query_live_by_comment`, :func:`show_job`).
A failed ``sacct`` is a :class:`SlurmQueryError`, never "status may be inaccurate". Every query
asks for this user's jobs only (``squeue --me``, ``sacct --user``), and a job found by its name and
comment must be this user's too: another user can name a job and set its comment as podium does.

=================  ===========================================================================
state class        Slurm states
=================  ===========================================================================
``pending``        PENDING, REQUEUED, REQUEUE_HOLD, REQUEUE_FED, RESV_DEL_HOLD, CONFIGURING,
                   RESIZING, SUSPENDED, STOPPED, SIGNALING, STAGE_OUT
``running``        RUNNING, COMPLETING
``done``           everything else (COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL,
                   PREEMPTED, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, REVOKED, SPECIAL_EXIT, ...)
=================  ===========================================================================

An unknown state counts as ``done`` only when sacct also shows an end time; otherwise ``pending``
(never resubmit a job we cannot classify while it may still be alive).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

PENDING_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING",
     "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
)
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING"})
DONE_STATES = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
     "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Start", "End")
# squeue -O: job id, state, nodes, reason, restart count (a requeued job keeps its id, counts up).
SQUEUE_FIELDS = ("JobID", "State", "NodeList", "Reason", "RestartCnt")
SQUEUE_FORMAT = ",".join(f"{name}:|" for name in SQUEUE_FIELDS)
# squeue -O to find a teacher's jobs by their identity (sbatch --comment): the comment last, so a
# comment with "|" in it (someone else's) cannot shift the fields; the job's user checked too.
SQUEUE_COMMENT_FIELDS = ("JobID", "State", "UserId", "Comment")
SQUEUE_COMMENT_FORMAT = ",".join(f"{name}:|" for name in SQUEUE_COMMENT_FIELDS)
_USER_ID = re.compile(r"^(?:\S*\()?(\d+)\)?$")  # squeue's UserId: "1000" or "name(1000)"


class SlurmQueryError(RuntimeError):
    """``sacct`` or ``squeue`` failed or printed something that is not their table."""


@dataclass(frozen=True)
class JobState:
    """The state of one job (the job-level row; steps are ignored)."""

    job_id: str
    state: str  # first word of Slurm's state: "CANCELLED by 0" -> "CANCELLED"
    raw_state: str = ""
    exit_code: str = ""
    nodes: tuple[str, ...] = ()
    name: str = ""
    start: str = ""
    end: str = ""
    restarts: int | None = None  # Slurm's restart count (squeue only; None when not known)
    comment: str = ""  # sbatch --comment (squeue with SQUEUE_COMMENT_FORMAT only)
    uid: int | None = None  # the job's user (squeue with SQUEUE_COMMENT_FORMAT only)

    @property
    def kind(self) -> str:
        """``pending``, ``running`` or ``done`` (see the module table)."""
        return state_kind(self.state, self.end)

    @property
    def alive(self) -> bool:
        return self.kind in ("pending", "running")


def state_kind(state: str, end: str = "") -> str:
    word = normalise_state(state)
    if word in PENDING_STATES:
        return "pending"
    if word in RUNNING_STATES:
        return "running"
    if word in DONE_STATES:
        return "done"
    if end and end not in ("Unknown", "None"):
        return "done"
    logger.warning("unknown Slurm state %r: treated as pending", state)
    return "pending"


def normalise_state(state: str) -> str:
    """``"CANCELLED by 0"`` -> ``"CANCELLED"``; ``"RUNNING+"`` -> ``"RUNNING"``."""
    word = state.strip().split(" ", 1)[0] if state.strip() else "UNKNOWN"
    return word.rstrip("+").upper()


_BRACKET = re.compile(r"([^,\[]*)\[([^\]]*)\]([^,]*)")


def expand_nodelist(text: str) -> list[str]:
    """``"n[1-3,5],gpu07"`` -> ``["n1", "n2", "n3", "n5", "gpu07"]`` (zero padding kept).

    ``""``, ``"None assigned"`` and ``"(null)"`` give ``[]``. Only one bracket group per name, as
    Slurm prints them on the clusters podium targets; anything else is a ``ValueError``.
    """
    text = text.strip()
    if not text or text in ("None assigned", "(null)", "None"):
        return []
    names: list[str] = []
    for part in _split_top_level(text):
        match = _BRACKET.fullmatch(part)
        if match is None:
            if "[" in part or "]" in part:
                raise ValueError(f"cannot parse node list {text!r} at {part!r}")
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for chunk in ranges.split(","):
            lo, _, hi = chunk.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"cannot parse node range {chunk!r} in {text!r}")
            width = len(lo)
            names.extend(f"{prefix}{number:0{width}d}{suffix}" for number in range(int(lo), int(hi or lo) + 1))
    return names


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p]


def parse_sacct(text: str) -> dict[str, JobState]:
    """Job-level rows of ``sacct --parsable2`` output with a header line, by job id.

    Step rows (``123.batch``, ``123.0``, ``123.extern``) are skipped; array tasks keep their id
    (``5_1``), a pending array's collapsed row (``5_[2-3]``) too. A requeued job may appear more
    than once: the last row wins (sacct lists the newest last).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0].split("|")
    if "JobID" not in header or "State" not in header:
        raise SlurmQueryError(f"sacct output without a JobID|State header: {lines[0]!r}")
    jobs: dict[str, JobState] = {}
    for line in lines[1:]:
        # lenient: a row whose free text (a job name) holds "|" keeps the fields before it
        row = dict(zip(header, line.split("|"), strict=False))
        job_id = row.get("JobID", "")
        if not job_id or "." in job_id:
            continue
        raw = row.get("State", "")
        jobs[job_id] = JobState(
            job_id=job_id,
            state=normalise_state(raw),
            raw_state=raw,
            exit_code=row.get("ExitCode", ""),
            nodes=tuple(_safe_nodes(row.get("NodeList", ""))),
            name=row.get("JobName", ""),
            start=row.get("Start", ""),
            end=row.get("End", ""),
        )
    return jobs


def parse_squeue(text: str) -> dict[str, JobState]:
    """Rows of ``squeue -h -O 'JobID:|,State:|,NodeList:|,Reason:|,RestartCnt:|'`` by job id.

    Also reads the older ``squeue -h -o '%i|%T|%N|%R'`` rows (no restart count).
    """
    jobs: dict[str, JobState] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 2:
            raise SlurmQueryError(f"squeue line is not JOBID|STATE|NODES|REASON|RESTARTS: {line!r}")
        job_id, state = fields[0].strip(), fields[1].strip()
        nodes = fields[2].strip() if len(fields) > 2 else ""
        restarts = fields[4].strip() if len(fields) > 4 else ""
        jobs[job_id] = JobState(job_id=job_id, state=normalise_state(state), raw_state=state,
                                nodes=tuple(_safe_nodes(nodes)),
                                restarts=int(restarts) if restarts.isdigit() else None)
    return jobs


def parse_squeue_comments(text: str, with_user: bool = False) -> list[JobState]:
    """Rows of ``squeue -h -O 'JobID:|,State:|,Comment:|'`` (a job without a comment: ``(null)``);
    ``with_user``: of ``SQUEUE_COMMENT_FORMAT``, the job's user before the comment."""
    jobs: list[JobState] = []
    first = 3 if with_user else 2  # the comment's first field
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        user = _USER_ID.match(fields[2].strip()) if with_user and len(fields) > 2 else None
        if len(fields) < first + 2 or fields[-1].strip() or (with_user and user is None):
            raise SlurmQueryError(f"squeue line is not JOBID|STATE|{'USERID|' if with_user else ''}COMMENT|: {line!r}")
        job_id, state = fields[0].strip(), fields[1].strip()
        comment = "|".join(fields[first:-1]).strip()
        jobs.append(JobState(job_id=job_id, state=normalise_state(state), raw_state=state,
                             comment="" if comment == "(null)" else comment,
                             uid=int(user.group(1)) if user is not None else None))
    return jobs


def live_with_comment(jobs: Iterable[JobState], comment: str, uid: int | None = None) -> list[str]:
    """Ids of the pending or running jobs whose comment is exactly ``comment`` (with ``uid``: and
    whose user it is)."""
    return [job.job_id for job in jobs if job.comment == comment and job.alive and (uid is None or job.uid == uid)]


def query_live_by_comment(name: str, comment: str, env: Mapping[str, str] | None = None,
                          timeout_s: float = 30.0) -> list[str]:
    """This user's pending or running jobs named ``name`` that carry ``comment`` (``squeue --me``,
    each job's user checked; a failure is a :class:`SlurmQueryError`: never guess that nothing runs)."""
    text = _run(["squeue", "-h", "--me", f"--name={name}", "-O", SQUEUE_COMMENT_FORMAT], env, timeout_s)
    return live_with_comment(parse_squeue_comments(text, with_user=True), comment, uid=os.getuid())


def _safe_nodes(text: str) -> list[str]:
    try:
        return expand_nodelist(text)
    except ValueError as exc:
        logger.warning("%s", exc)
        return []


_SCONTROL_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9:/_]*=|\s*$)")
NO_TIME = ("None", "Unknown", "(null)", "")


def parse_scontrol_job(text: str) -> dict[str, str]:
    """``scontrol show job -o JOB`` (one line of ``Key=Value``) as a dict; values may hold spaces
    and ``=`` (``TRES=cpu=4,node=2``). Empty text gives ``{}``."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return dict(_SCONTROL_FIELD.findall(line))


def slurm_time(value: str | None) -> float | None:
    """``2026-12-01T20:05:42`` (Slurm's local time) as a Unix time; None for ``None``/``Unknown``."""
    if value is None or value in NO_TIME:
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def time_to_minutes(text: str) -> int:
    """Slurm time -> minutes (rounded up). Slurm's forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``,
    ``D-H:M``, ``D-H:M:S``: without a day part one or two fields start at minutes, with a day
    part they start at hours."""
    rest = text.strip()
    days = 0
    if "-" in rest:
        d, rest = rest.split("-", 1)
        days = int(d)
    parts = [int(p) for p in rest.split(":")]
    if days or "-" in text:
        h, m, s = [*parts, 0, 0][:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:
        h, (m, s) = 0, [*parts, 0][:2]
    return days * 1440 + h * 60 + m + (1 if s else 0)


def show_job(job_id: str, timeout_s: float = 10.0) -> dict[str, str]:
    """``scontrol show job -o`` of one job (``SlurmQueryError`` when scontrol fails)."""
    return parse_scontrol_job(_run(["scontrol", "show", "job", "-o", str(job_id)], None, timeout_s))


def query_states(job_ids: Sequence[str], env: Mapping[str, str] | None = None,
                 timeout_s: float = 30.0) -> dict[str, JobState]:
    """States of this user's ``job_ids``: ``squeue`` (live, no accounting lag) then ``sacct`` for the
    rest (another user's job is not listed, as one that neither knows).

    A job that neither knows yet (just submitted) is absent from the answer. A failing command is a
    :class:`SlurmQueryError` naming the command and its stderr.
    """
    ids = [str(j) for j in job_ids if str(j)]
    if not ids:
        return {}
    found = parse_squeue(_run(["squeue", "-h", "--me", "-j", ",".join(ids), "-O", SQUEUE_FORMAT],
                              env, timeout_s, allow_invalid_id=True))
    rest = [j for j in ids if j not in found]
    if rest:
        text = _run(["sacct", "-j", ",".join(rest), f"--user={os.getuid()}", "-o", ",".join(SACCT_FIELDS),
                     "--parsable2"], env, timeout_s)
        for job_id, state in parse_sacct(text).items():
            found.setdefault(job_id, state)
    return found


def _run(cmd: list[str], env: Mapping[str, str] | None, timeout_s: float,
         allow_invalid_id: bool = False) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmQueryError(f"{' '.join(cmd)}: {exc}") from None
    if proc.returncode != 0:
        # squeue -j on a job that left the queue says "Invalid job id specified": not an error.
        if allow_invalid_id and "Invalid job id" in proc.stderr:
            return ""
        raise SlurmQueryError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def job_kinds(states: Iterable[JobState]) -> dict[str, str]:
    return {s.job_id: s.kind for s in states}
