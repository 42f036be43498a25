"""Partitions, judged from ``sinfo``: its node rows parsed, the plan's needs per partition, and
whether a partition can hold them (nodes that take jobs, GPU gres, time limit). Pure: the caller
runs ``sinfo`` (:data:`SINFO_NODES`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from podium.config.spec import TeacherSpec
from podium.launcher.common.slurm_state import time_to_minutes
from podium.launcher.login.doctor.base import FAIL, PASS, Check
from podium.launcher.login.sbatch_errors import REFUSALS

# sinfo's short node states (%t, without the *~#!%$@^- flags) in which a node takes no new job.
UNUSABLE_STATES = frozenset({"down", "drain", "drng", "fail", "failg", "inval", "maint", "unk", "npc", "futr"})
SINFO_NODES = ["sinfo", "-h", "-N", "-o", "%N|%P|%a|%t|%G|%l"]


@dataclass(frozen=True)
class NodeRow:
    """One line of ``sinfo -N -o '%N|%P|%a|%t|%G|%l'``: a node in a partition."""

    node: str
    partition: str  # without the default mark
    default: bool
    available: str  # the partition's: up, down, drain, inact
    state: str  # the node's short state, flags stripped
    gres: str
    time_limit: str

    @property
    def usable(self) -> bool:
        return self.available == "up" and self.state not in UNUSABLE_STATES


def parse_sinfo_nodes(text: str) -> list[NodeRow]:
    """Rows of :data:`SINFO_NODES` output."""
    rows = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        node, part, avail, state, gres, limit = (f.strip() for f in fields)
        rows.append(NodeRow(node, part.rstrip("*"), part.endswith("*"), avail.lower(),
                            state.rstrip("*~#!%$@^-").lower(), gres, limit))
    return rows


def gres_gpus(gres: str) -> int:
    """GPUs in a node's gres (``gpu:8``, ``gpu:a100:4(S:0-1)``, ``gpu:2,nic:1``; ``(null)``: 0)."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] == "gpu":
            count = parts[-1] if len(parts) > 1 else "1"
            total += int(count) if count.isdigit() else 0
    return total


def limit_minutes(limit: str) -> int | None:
    """sinfo's time limit in minutes (``infinite``/``n/a``: None)."""
    if limit.lower() in ("infinite", "n/a", "unlimited", ""):
        return None
    try:
        return time_to_minutes(limit)
    except ValueError:
        return None


@dataclass(frozen=True)
class PartitionNeed:
    """What the plan's teachers in one partition need of it (the most any of them asks)."""

    partition: str | None  # None: the cluster's default partition
    nodes: int
    gpus: int  # per node; 0: no GPUs asked
    minutes: int
    time: str
    teachers: tuple[str, ...]


def partition_needs(specs: Iterable[TeacherSpec]) -> list[PartitionNeed]:
    """One need per partition the teachers use (in the order they first appear)."""
    groups: dict[str | None, list[TeacherSpec]] = defaultdict(list)
    for spec in specs:
        groups[spec.launcher.slurm.partition].append(spec)
    needs = []
    for partition, group in groups.items():
        longest = max(group, key=lambda s: time_to_minutes(s.launcher.slurm.time))
        needs.append(PartitionNeed(
            partition=partition, nodes=max(s.num_nodes for s in group),
            gpus=max((s.gpus_per_node for s in group if s.launcher.slurm.gpus), default=0),
            minutes=time_to_minutes(longest.launcher.slurm.time), time=longest.launcher.slurm.time,
            teachers=tuple(s.name for s in group)))
    return needs


def _fix(kind: str) -> str:
    """The usual fix of a kind of sbatch refusal (one table: :data:`sbatch_errors.REFUSALS`)."""
    return next(r.fix for r in REFUSALS if r.kind == kind)


def judge_partition(need: PartitionNeed, rows: Sequence[NodeRow]) -> Check:
    """Whether the partition of ``need`` can hold its teachers (``rows``: all of sinfo's)."""
    who = f" (teacher{'s' if len(need.teachers) > 1 else ''} {', '.join(need.teachers)})" if need.teachers else ""
    known = sorted({r.partition for r in rows})
    if need.partition is None:
        defaults = sorted({r.partition for r in rows if r.default})
        if not defaults:
            return Check("partition", FAIL, f"podium.slurm.partition is unset and the cluster has no default partition"
                         f"{who}; partitions: {', '.join(known) or 'none'}", "set podium.slurm.partition to one that "
                         "`sinfo -s` lists")
        name, setting = defaults[0], "the default partition"
    else:
        name, setting = need.partition, f"podium.slurm.partition={need.partition!r}"
    mine = [r for r in rows if r.partition == name]
    title = f"partition {name}"
    if not mine:
        return Check(title, FAIL, f"{setting}: no such partition{who}; partitions: {', '.join(known) or 'none'}",
                     _fix("partition"))
    if mine[0].available != "up":
        return Check(title, FAIL, f"{setting} is {mine[0].available}{who}", _fix("partition_down"))
    usable = sorted({r.node for r in mine if r.usable})
    if len(usable) < need.nodes:
        return Check(title, FAIL, f"{setting}: {len(usable)} usable node(s) of {len({r.node for r in mine})}, "
                     f"num_nodes={need.nodes}{who}", _fix("node_count"))
    seen = [f"{len(usable)} usable node(s)"]
    if need.gpus:
        with_gpus = sorted({r.node for r in mine if r.usable and gres_gpus(r.gres) >= need.gpus})
        if len(with_gpus) < need.nodes:
            gres = ", ".join(sorted({r.gres for r in mine})) or "(none)"
            return Check(title, FAIL, f"{setting}: {len(with_gpus)} node(s) with gres gpu:{need.gpus} (gres: {gres}), "
                         f"num_nodes={need.nodes} × gpus_per_node={need.gpus} with podium.slurm.gpus=true{who}",
                         _fix("gres"))
        seen.append(f"{len(with_gpus)} with gpu:{need.gpus}")
    else:
        seen.append("no GPUs asked")
    limit = limit_minutes(mine[0].time_limit)
    if limit is not None and need.minutes > limit:
        return Check(title, FAIL, f"{setting}: podium.slurm.time={need.time!r} is above the partition's limit "
                     f"{mine[0].time_limit}{who}", _fix("time"))
    seen.append(f"time {need.time} within {mine[0].time_limit}")
    return Check(title, PASS, f"{', '.join(seen)}; num_nodes={need.nodes}{who}")
