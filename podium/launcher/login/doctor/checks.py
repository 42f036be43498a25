"""The checks asked of this machine and the cluster (Slurm, accounting, partitions, checkpoints,
the local backend's rules, the run dir here) and :func:`run_doctor`, which picks them by cluster kind
and adds the test job's rows (:mod:`podium.launcher.login.doctor.probe_job`)."""

from __future__ import annotations

import getpass
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

from podium.config.launcher import TeacherLauncherSettings
from podium.config.plan import Plan
from podium.launcher.backends import SubmitError, environment_for, scheduler_for
from podium.launcher.common.devices import cuda_device_count
from podium.launcher.common.slurm_state import time_to_minutes
from podium.launcher.login.doctor.base import (
    DOCTOR_DIR,
    FAIL,
    PASS,
    SKIP,
    Check,
    missing_folders,
    remove_empty,
    run_query,
)
from podium.launcher.login.doctor.node import node_checks
from podium.launcher.login.doctor.partitions import (
    SINFO_NODES,
    PartitionNeed,
    judge_partition,
    parse_sinfo_nodes,
    partition_needs,
)
from podium.launcher.login.doctor.probe_job import check_test_job, local_packages
from podium.launcher.login.sbatch_errors import one_line

SLURM_FIX = ("run podium where Slurm's client commands reach the controller (a login node of the cluster; "
             "`scontrol ping` says whether it answers), or set podium.cluster: local to run without Slurm")
SACCT_FIX = ("podium asks sacct about teachers' jobs once they have left the queue (`podium status`, `up`, "
             "`down`): ask the cluster's admins for job accounting (AccountingStorageType="
             "accounting_storage/slurmdbd)")


# ---------------------------------------------------------------------------------------------- Slurm

def check_slurm() -> Check:
    """``sinfo`` and ``squeue`` answer."""
    for cmd in (["sinfo", "-h", "-o", "%P"], ["squeue", "-h", "-u", getpass.getuser(), "-o", "%i"]):
        rc, _, err = run_query(cmd)
        if rc != 0:
            return Check("slurm", FAIL, f"`{' '.join(cmd)}` failed: {one_line(err)}", SLURM_FIX)
    return Check("slurm", PASS, "sinfo and squeue answer")


def check_sacct() -> Check:
    """Job accounting answers (``sacct`` of the last hour)."""
    rc, _, err = run_query(["sacct", "-n", "-X", "--parsable2", "-o", "JobID", "-S", "now-1hours"])
    if rc != 0:
        return Check("sacct", FAIL, f"`sacct` failed: {one_line(err)}", SACCT_FIX)
    return Check("sacct", PASS, "job accounting answers")


def check_partitions(needs: Sequence[PartitionNeed]) -> tuple[list[Check], set[str]]:
    """One row per need, and the partitions that are up (where the test job may run)."""
    rc, out, err = run_query(SINFO_NODES)
    if rc != 0:
        return [Check("partition", FAIL, f"`{' '.join(SINFO_NODES)}` failed: {one_line(err)}", SLURM_FIX)], set()
    rows = parse_sinfo_nodes(out)
    return [judge_partition(need, rows) for need in needs], {r.partition for r in rows if r.available == "up"}


# ---------------------------------------------------------------------------------------------- the plan

def check_checkpoints(plan: Plan | None) -> Check:
    """What ``up`` refuses about the plan's checkpoints (:func:`podium.config.plan.require_checkpoints`)."""
    if plan is None:
        return Check("checkpoints", SKIP, "no recipe given")
    if plan.warnings:
        return Check("checkpoints", FAIL, " | ".join(plan.warnings),
                     "point the recipe's checkpoint paths at HF or Megatron torch_dist checkpoint directories "
                     "that exist, and fetch its hub ids into the HF cache the nodes read (the message names the "
                     "command; `podium plan RECIPE` shows each one)")
    local = [s for s in plan.teachers if Path(s.model_name).is_absolute()]
    return Check("checkpoints", PASS, f"{len(local)} local checkpoint(s) found, "
                 f"{len(plan.teachers) - len(local)} hub id(s) in the local HF cache (their snapshot pinned)")


# ---------------------------------------------------------------------------------------------- local

def check_local_gpus(plan: Plan | None) -> list[Check]:
    """The local backend's own rule per teacher (``check`` refuses, ``notices`` says CPU)."""
    if plan is None:
        return [Check("teacher", PASS, f"{cuda_device_count()} CUDA device(s) here; no recipe, nothing asked")]
    scheduler = scheduler_for("local")
    rows = []
    for spec in plan.teachers:
        try:
            scheduler.check(spec)
        except SubmitError as exc:
            rows.append(Check(f"teacher {spec.name}", FAIL, str(exc), "change the recipe as the message says"))
            continue
        notices = scheduler.notices(spec)
        asked = environment_for("local").node_gpus(spec) if not notices else 0
        rows.append(Check(f"teacher {spec.name}", PASS, notices[0] if notices else
                          f"gpus_per_node={spec.gpus_per_node}: {asked} of {cuda_device_count()} CUDA device(s) used"))
    return rows


def check_run_dir_here(run_dir: Path) -> Check:
    """The run dir (or the folder it will be made in) is writable here."""
    probe = run_dir / DOCTOR_DIR
    made = missing_folders(probe)
    try:
        probe.mkdir(parents=True, exist_ok=True)
        test = probe / f"{uuid.uuid4().hex[:12]}.txt"
        test.write_text("podium doctor\n")
        ok = test.read_text() == "podium doctor\n"
        test.unlink()
    except OSError as exc:
        return Check("run dir", FAIL, f"cannot write {run_dir}: {exc}", "choose a writable --run-dir (or "
                     "podium.run_dir, $PODIUM_RUNS_DIR)")
    finally:
        remove_empty(made)
    return Check("run dir", PASS if ok else FAIL, f"{run_dir} is writable here")


# ---------------------------------------------------------------------------------------------- all

def run_doctor(plan: Plan | None, settings: TeacherLauncherSettings, run_dir: Path,
               timeout_s: float = 300.0) -> list[Check]:
    """Every check for ``settings.cluster`` (``plan``: the recipe's, None without a recipe)."""
    run_dir = run_dir.absolute()
    if settings.cluster == "local":
        with tempfile.TemporaryDirectory(prefix="podium-doctor-") as scratch:
            here = local_packages(settings.slurm.python or sys.executable, Path(scratch))
        return [*check_local_gpus(plan), check_checkpoints(plan), check_run_dir_here(run_dir), here,
                *(Check(**row) for row in node_checks(settings.model_dump(mode="json"), local=True))]
    slurm = check_slurm()
    if not slurm.ok:
        return [slurm, *(Check(n, SKIP, "not checked: Slurm does not answer") for n in
                         ("sacct", "partition", "test job")), check_checkpoints(plan)]
    specs = plan.teachers if plan is not None else ()
    needs = partition_needs(specs) if specs else [
        PartitionNeed(settings.slurm.partition, 1, 0, time_to_minutes(settings.slurm.time), settings.slurm.time, ())]
    partitions, up = check_partitions(needs)
    # One test job, in the first teacher's partition (the default one if that is not up); it
    # asks for no GPUs, so a partition without them still runs it.
    first = specs[0].launcher if specs else settings
    usable = first.slurm.partition is None or first.slurm.partition in up
    partition = first.slurm.partition if usable else None
    where = (f"in partition {first.slurm.partition!r}" if usable and first.slurm.partition else
             "in the default partition" + ("" if usable else f" (no partition {first.slurm.partition!r} is up)"))
    return [slurm, check_sacct(), *partitions, check_checkpoints(plan),
            *check_test_job(first, run_dir, partition, timeout_s, where)]
