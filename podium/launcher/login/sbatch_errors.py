"""What ``sbatch`` refusing a teacher's job means in the recipe: the one table of known refusals.

``sbatch`` answers a request it refuses with Slurm's own words (``sbatch: error: Batch job
submission failed: Invalid partition name specified``), which name neither the recipe setting
that made the request nor what to change. :func:`explain` turns that answer into one line that
names the setting (its dotted key in the recipe, with the value the job asked for), says the usual
fix, and keeps what sbatch said.

Each row of :data:`REFUSALS` is one kind of refusal: the pattern of Slurm's message (the texts of
Slurm's error table, ``slurm_strerror``, as ``sbatch`` prints them), the sbatch options whose
recipe settings are at fault, and the fix. The first row that matches wins; an unknown refusal is
reported with sbatch's words and no guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from podium.config.spec import TeacherSpec

# sbatch option -> the setting under podium.slurm that renders it (backends/slurm/scheduler.py sbatch_request)
OPTION_SETTINGS = {
    "partition": "partition", "account": "account", "qos": "qos", "time": "time",
    "constraint": "constraint", "mem": "mem", "cpus-per-task": "cpus_per_task",
}


@dataclass(frozen=True)
class Refusal:
    """One kind of ``sbatch`` refusal: Slurm's message, the settings at fault, the usual fix."""

    kind: str
    pattern: str  # a regular expression, searched (case-insensitive) in sbatch's message
    options: tuple[str, ...]  # sbatch options whose recipe settings are named ("gpus": the GPU request)
    fix: str

    def matches(self, message: str) -> bool:
        return re.search(self.pattern, message, re.IGNORECASE) is not None


REFUSALS: tuple[Refusal, ...] = (
    Refusal("gres", r"Invalid generic resource \(gres\) specification", ("gpus",),
            "the partition has no GPUs Slurm knows as gres 'gpu': choose a GPU partition with podium.slurm.partition, "
            "or set podium.slurm.gpus: false to run the workers on CPU"),
    Refusal("partition", r"Invalid partition name specified|invalid partition specified", ("partition",),
            "no such partition on this cluster: set podium.slurm.partition to one that `sinfo -s` lists, "
            "or remove it for the default partition"),
    Refusal("partition_down", r"Required partition not available", ("partition",),
            "the partition is inactive or draining: choose another with podium.slurm.partition (`sinfo -s`)"),
    Refusal("account", r"Invalid account or account/partition combination", ("account", "partition"),
            "set podium.slurm.account to an account you may use in this partition "
            "(`sacctmgr show assoc user=$USER format=account,partition`), or remove it for your default account"),
    Refusal("qos", r"Invalid qos specification", ("qos", "account"),
            "set podium.slurm.qos to a QOS your account may use (`sacctmgr show assoc user=$USER format=account,qos`), "
            "or remove it for the default QOS"),
    Refusal("time", r"Requested time limit is invalid", ("time", "partition"),
            "podium.slurm.time is above the partition's time limit: lower it to the limit `sinfo -o '%P %l'` shows"),
    Refusal("policy", r"Job violates accounting/QOS policy", ("time", "qos", "nodes", "gpus"),
            "the job is above a limit of your account or QOS (time, nodes, GPUs or jobs): lower podium.slurm.time "
            "or the teacher's num_nodes / gpus_per_node, or use another podium.slurm.qos (`sacctmgr show qos`)"),
    Refusal("constraint", r"Invalid feature specification", ("constraint",),
            "no node has this feature: set podium.slurm.constraint to one that `sinfo -o '%N %f'` lists, or remove it"),
    Refusal("node_config", r"Requested node configuration is not available|Memory specification can not be satisfied",
            ("mem", "cpus-per-task", "nodes", "partition"),
            "no node of the partition has that much memory or that many CPUs: lower podium.slurm.mem or "
            "podium.slurm.cpus_per_task to what `sinfo -o '%P %c %m'` shows, or choose another podium.slurm.partition"),
    Refusal("node_count", r"Node count specification invalid", ("nodes", "partition"),
            "the partition has fewer nodes than the teacher's num_nodes: lower num_nodes, or choose a larger "
            "podium.slurm.partition"),
    Refusal("access", r"Access/permission denied", ("partition", "account"),
            "you may not submit to this partition with this account: choose another podium.slurm.partition or set "
            "podium.slurm.account (`sacctmgr show assoc user=$USER`)"),
)


def find_refusal(message: str) -> Refusal | None:
    """The first row of :data:`REFUSALS` that matches sbatch's message."""
    return next((row for row in REFUSALS if row.matches(message)), None)


def one_line(message: str) -> str:
    """sbatch's message on one line (its lines joined by ' | ', repeats dropped)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " | ".join(dict.fromkeys(lines)) or "(sbatch printed nothing)"


def _setting(spec: TeacherSpec, option: str) -> str:
    """``key=value`` of what renders ``option`` for this teacher (``extra_sbatch`` wins, as it does
    in the script)."""
    slurm = spec.launcher.slurm
    if option in slurm.extra_sbatch:
        return f"podium.slurm.extra_sbatch.{option}={_shown(slurm.extra_sbatch[option])}"
    if option == "gpus":
        gpus = spec.gpus_per_node
        how = f"--gres=gpu:{gpus}" if slurm.gpu_request == "gres" else f"--gpus-per-node={gpus}"
        return f"podium.slurm.gpus={_shown(slurm.gpus)} with gpus_per_node={spec.gpus_per_node} ({how})"
    if option == "nodes":
        return f"num_nodes={spec.num_nodes}"
    name = OPTION_SETTINGS[option]
    value = getattr(slurm, name)
    if option == "cpus-per-task" and value is None:
        return f"podium.slurm.cpus_per_task=(unset: gpus_per_node + 1 = {spec.cpus_per_task})"
    return f"podium.slurm.{name}={_shown(value)}"


def _shown(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def _relevant(spec: TeacherSpec, option: str) -> bool:
    """Whether the teacher's request sets ``option`` at all (an unset account is not at fault)."""
    slurm = spec.launcher.slurm
    if option in slurm.extra_sbatch or option in ("nodes", "cpus-per-task"):
        return True
    if option == "gpus":
        return slurm.gpus
    return getattr(slurm, OPTION_SETTINGS[option]) is not None


def explain(message: str, spec: TeacherSpec) -> str:
    """One line for a refused submission: the settings at fault, the usual fix, sbatch's words."""
    said = one_line(message)
    refusal = find_refusal(message)
    if refusal is None:
        return (f"teacher {spec.label}: sbatch refused the job: {said} (no podium setting is known to cause this "
                f"answer; `podium render` prints the script that was sent)")
    named = [_setting(spec, opt) for opt in refusal.options if _relevant(spec, opt)]
    settings = ", ".join(named) or ", ".join(f"podium.slurm.{OPTION_SETTINGS.get(o, o)}" for o in refusal.options)
    return f"teacher {spec.label}: sbatch refused {settings}: {refusal.fix} (sbatch said: {said})"
