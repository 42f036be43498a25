"""``podium doctor``: what a first run needs, checked before anything is submitted.

Each check is a small function that returns :class:`Check` rows (✔ pass, ✘ fail with the fix,
– not checked because an earlier check failed). :func:`run_doctor` picks them by cluster kind:

=================  =========================================================================
check              ``cluster: slurm``
=================  =========================================================================
``slurm``          ``sinfo`` and ``squeue`` answer (the controller is reachable)
``sacct``          accounting answers (podium asks ``sacct`` about jobs that left the queue)
``partition``      per partition the plan uses: it exists, is up, has ``num_nodes`` usable
                   nodes, gres ``gpu`` of ``gpus_per_node`` where GPUs are asked, a time limit
                   at or above ``slurm.time``
``checkpoints``    the plan's checkpoint problems (what ``up`` refuses)
``test job``       one short ``srun`` job (one node, one task, 2 minutes) in the first
                   teacher's partition, account and QOS, with its ``setup`` lines, container and
                   interpreter; it reports the rows below
``run dir``        the job wrote a file in the run dir that this machine then reads back
``python``         the node's interpreter and its version, against this one's
``podium``         ``import podium`` on the node: its version and path, against this one's
``ports``          ``ray.port_range`` has a free block and ``server.port_range`` a free port
                   on the node (the same functions the teacher uses, so the same errors)
``address``        the address Ray and the endpoint use there (``ray.interface``,
                   ``server.interface``, else the node's hostname)
=================  =========================================================================

With ``cluster: local``: ``teacher <name>`` (the local backend's own rules: one node, CUDA devices against
``gpus_per_node``), ``checkpoints``, ``run dir`` (writable here), ``ports`` and ``address`` here.

Nothing here changes the run dir beyond a ``.doctor/`` folder it removes again.
"""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from podium.config.launcher import TeacherLauncherSettings
from podium.config.plan import Plan
from podium.config.spec import TeacherSpec
from podium.launcher.sbatch_errors import REFUSALS, find_refusal, one_line

PASS, FAIL, SKIP = "pass", "fail", "skip"
MARKS = {PASS: "✔", FAIL: "✘", SKIP: "–"}
QUERY_TIMEOUT_S = 30.0
TEST_JOB_MINUTES = 2
DOCTOR_DIR = ".doctor"  # inside the run dir; removed after the check
# sinfo's short node states (%t, without the *~#!%$@^- flags) in which a node takes no new job.
UNUSABLE_STATES = frozenset({"down", "drain", "drng", "fail", "failg", "inval", "maint", "unk", "npc", "futr"})


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


def _fix(kind: str) -> str:
    """The usual fix of a kind of sbatch refusal (one table: :data:`sbatch_errors.REFUSALS`)."""
    return next(r.fix for r in REFUSALS if r.kind == kind)


def _run(cmd: Sequence[str], timeout_s: float = QUERY_TIMEOUT_S) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a command; 127 when it is not installed, 124 on timeout."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return 127, "", f"{cmd[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer within {timeout_s:.0f}s"
    return proc.returncode, proc.stdout, proc.stderr


# ---------------------------------------------------------------------------------------------- Slurm

SLURM_FIX = ("run podium where Slurm's client commands reach the controller (a login node of the cluster; "
             "`scontrol ping` says whether it answers), or set podium.cluster: local to run without Slurm")


def check_slurm() -> Check:
    """``sinfo`` and ``squeue`` answer."""
    for cmd in (["sinfo", "-h", "-o", "%P"], ["squeue", "-h", "-u", getpass.getuser(), "-o", "%i"]):
        rc, _, err = _run(cmd)
        if rc != 0:
            return Check("slurm", FAIL, f"`{' '.join(cmd)}` failed: {one_line(err)}", SLURM_FIX)
    return Check("slurm", PASS, "sinfo and squeue answer")


SACCT_FIX = ("podium asks sacct about teachers' jobs once they have left the queue (`podium status`, `up`, "
             "`down`): ask the cluster's admins for job accounting (AccountingStorageType="
             "accounting_storage/slurmdbd)")


def check_sacct() -> Check:
    """Job accounting answers (``sacct`` of the last hour)."""
    rc, _, err = _run(["sacct", "-n", "-X", "--parsable2", "-o", "JobID", "-S", "now-1hours"])
    if rc != 0:
        return Check("sacct", FAIL, f"`sacct` failed: {one_line(err)}", SACCT_FIX)
    return Check("sacct", PASS, "job accounting answers")


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


SINFO_NODES = ["sinfo", "-h", "-N", "-o", "%N|%P|%a|%t|%G|%l"]


def parse_sinfo_nodes(text: str) -> list[NodeRow]:
    """Rows of :data:`SINFO_NODES` output (pure)."""
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


def limit_minutes(limit: str) -> Optional[int]:
    """sinfo's time limit in minutes (``infinite``/``n/a``: None)."""
    from podium.launcher.slurm_state import time_to_minutes

    if limit.lower() in ("infinite", "n/a", "unlimited", ""):
        return None
    try:
        return time_to_minutes(limit)
    except ValueError:
        return None


@dataclass(frozen=True)
class PartitionNeed:
    """What the plan's teachers in one partition need of it (the most any of them asks)."""

    partition: Optional[str]  # None: the cluster's default partition
    nodes: int
    gpus: int  # per node; 0: no GPUs asked
    minutes: int
    time: str
    teachers: tuple[str, ...]


def partition_needs(specs: Iterable[TeacherSpec]) -> list[PartitionNeed]:
    """One need per partition the teachers use (in the order they first appear)."""
    from podium.launcher.slurm_state import time_to_minutes

    groups: dict[Optional[str], list[TeacherSpec]] = defaultdict(list)
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


def judge_partition(need: PartitionNeed, rows: Sequence[NodeRow]) -> Check:
    """Whether the partition of ``need`` can hold its teachers (pure; ``rows``: all of sinfo's)."""
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


def check_partitions(needs: Sequence[PartitionNeed]) -> tuple[list[Check], set[str]]:
    """One row per need, and the partitions that are up (where the test job may run)."""
    rc, out, err = _run(SINFO_NODES)
    if rc != 0:
        return [Check("partition", FAIL, f"`{' '.join(SINFO_NODES)}` failed: {one_line(err)}", SLURM_FIX)], set()
    rows = parse_sinfo_nodes(out)
    return [judge_partition(need, rows) for need in needs], {r.partition for r in rows if r.available == "up"}


# ---------------------------------------------------------------------------------------------- the plan

def check_checkpoints(plan: Optional[Plan]) -> Check:
    """What ``up`` refuses about the plan's checkpoints (:func:`podium.config.plan.require_checkpoints`)."""
    if plan is None:
        return Check("checkpoints", SKIP, "no recipe given")
    if plan.warnings:
        return Check("checkpoints", FAIL, " | ".join(plan.warnings),
                     "point the recipe's checkpoint paths at HF or Megatron torch_dist checkpoint directories "
                     "that exist (`podium plan RECIPE` shows each one)")
    local = [s for s in plan.teachers if Path(s.model_name).is_absolute()]
    return Check("checkpoints", PASS, f"{len(local)} local checkpoint(s) found, "
                 f"{len(plan.teachers) - len(local)} hub id(s) not checked")


# ---------------------------------------------------------------------------------------------- node checks

PORTS_FIX = ("choose podium.ray.port_range / podium.server.port_range where ports are free on the nodes, below "
             "the kernel's ephemeral range (`cat /proc/sys/net/ipv4/ip_local_port_range`)")
ADDRESS_FIX = ("set podium.ray.interface (and podium.server.interface) to a network interface that "
               "`ip -4 -o addr` lists on the compute nodes, one the login and trainer nodes reach")


def node_checks(settings: Mapping[str, Any], local: bool = False) -> list[dict[str, str]]:
    """Ports and address on this node, as a teacher's node task would find them (the same
    functions, so the same errors). ``settings``: a ``TeacherLauncherSettings`` dump (JSON);
    ``local``: the local backend's addresses (loopback unless an interface is named)."""
    from podium.launcher.ray_bootstrap import RayStartError, choose_ports, node_ip
    from podium.net import find_free_port

    ray, server = settings["ray"], settings["server"]
    rows: list[Check] = []
    try:
        block = choose_ports(tuple(ray["port_range"]), 0, 0, 0)
        port = find_free_port(tuple(server["port_range"]))
        rows.append(Check("ports", PASS, f"ray.port_range {ray['port_range'][0]}-{ray['port_range'][1]}: a free block "
                          f"at {block.base}; server.port_range {server['port_range'][0]}-{server['port_range'][1]}: "
                          f"{port} free"))
    except (RayStartError, OSError) as exc:
        rows.append(Check("ports", FAIL, str(exc), PORTS_FIX))
    seen = []
    try:
        for key in ("ray", "server"):
            interface = settings[key].get("interface")
            if local and not interface:
                seen.append(f"{key}: 127.0.0.1 (local, no interface set)")
                continue
            how = f"interface {interface!r}" if interface else "the hostname"
            seen.append(f"{key}: {node_ip(interface)} ({how})")
        rows.append(Check("address", PASS, "; ".join(seen)))
    except RayStartError as exc:
        rows.append(Check("address", FAIL, str(exc), ADDRESS_FIX))
    return [r.to_dict() for r in rows]


# What the test job runs: standalone up to `import podium`, so a node without podium still
# reports its Python and writes its file (the run dir's check does not depend on the import).
PROBE_CODE = r"""
import json, os, socket, sys
args = json.loads(sys.argv[1])
report = {"token": args["token"], "host": socket.gethostname(), "python": sys.executable,
          "version": list(sys.version_info[:3])}
try:
    import podium
    report["podium"] = {"file": podium.__file__, "version": podium.__version__}
    from podium.launcher.doctor import node_checks
    report["checks"] = node_checks(args["settings"])
except Exception as exc:
    report["import_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    with open(args["out"] + ".tmp", "w") as f:
        json.dump(report, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(args["out"] + ".tmp", args["out"])
except OSError as exc:
    report["write_error"] = str(exc)
print("PODIUM-DOCTOR " + json.dumps(report), flush=True)
"""
PROBE_MARK = "PODIUM-DOCTOR "


def probe_command(spec_settings: TeacherLauncherSettings, args: Mapping[str, Any], job_name: str,
                  partition: Optional[str]) -> list[str]:
    """The test job: ``srun`` with the teacher's partition, account, QOS, constraint, container and
    ``setup`` lines, one node, one task, :data:`TEST_JOB_MINUTES`; no GPUs (cheap: the partition
    check reads the gres)."""
    s = spec_settings.slurm
    cmd = ["srun", f"--job-name={job_name}", "--nodes=1", "--ntasks=1", f"--time={TEST_JOB_MINUTES}"]
    for option, value in (("partition", partition), ("account", s.account), ("qos", s.qos),
                          ("constraint", s.constraint)):
        if value:
            cmd.append(f"--{option}={value}")
    if s.container_image:
        cmd.append(f"--container-image={s.container_image}")
        if s.container_mounts:
            cmd.append(f"--container-mounts={','.join(s.container_mounts)}")
    python = s.python or sys.executable
    probe = [python, "-c", PROBE_CODE, json.dumps(dict(args))]
    if s.setup:  # the teacher's batch script runs them before its srun; here in the task itself
        return [*cmd, "bash", "-c", "\n".join([*s.setup, 'exec "$@"']), "podium-doctor", *probe]
    return [*cmd, *probe]


def _cancel_by_name(job_name: str) -> None:
    _run(["scancel", f"--name={job_name}", f"--user={getpass.getuser()}"])


def check_test_job(settings: TeacherLauncherSettings, run_dir: Path, partition: Optional[str],
                   timeout_s: float, where: str) -> list[Check]:
    """Run the one test job and turn what it reports into rows (see the module table)."""
    names = ("run dir", "python", "podium", "ports", "address")
    token = uuid.uuid4().hex[:12]
    job_name = f"podium-doctor-{token}"
    probe_dir = run_dir / DOCTOR_DIR
    made = _missing(probe_dir)
    try:
        probe_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [Check("run dir", FAIL, f"cannot create {probe_dir}: {exc}", RUN_DIR_FIX),
                *(Check(n, SKIP, "not checked: no run dir") for n in names[1:])]
    out = probe_dir / f"{token}.json"
    cmd = probe_command(settings, {"token": token, "out": str(out), "settings": settings.model_dump(mode="json")},
                        job_name, partition)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _cancel_by_name(job_name)
            proc.terminate()
            stdout, stderr = proc.communicate(timeout=QUERY_TIMEOUT_S)
            return [Check("test job", FAIL, f"a one-node job {where} did not finish within {timeout_s:.0f}s "
                          f"(cancelled; `squeue -p {partition or '<default>'}` shows what holds the nodes)",
                          "run `podium doctor` again with a larger --timeout, or choose a partition with idle nodes"),
                    *(Check(n, SKIP, "not checked: the test job did not run") for n in names)]
        return _judge_probe(proc.returncode, stdout, stderr, out, where, names)
    finally:
        out.unlink(missing_ok=True)
        _remove_empty(made)


RUN_DIR_FIX = ("put the run dir on a filesystem that every compute node mounts at the same path "
               "(--run-dir, podium.run_dir or $PODIUM_RUNS_DIR)")
PYTHON_FIX = ("set podium.slurm.python to an interpreter on the compute nodes that has podium installed, or "
              "podium.slurm.setup lines that activate your environment there")
PODIUM_FIX = ("install podium where the compute nodes' Python finds it (a virtual environment on the shared "
              "filesystem), or set podium.slurm.python / podium.slurm.setup; the job inherits this shell's "
              "environment (PYTHONPATH included)")


def _missing(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first (what ``mkdir -p`` makes)."""
    out = []
    while not path.exists() and path != path.parent:
        out.append(path)
        path = path.parent
    return out


def _remove_empty(made: Sequence[Path]) -> None:
    """Remove the folders the doctor made (deepest first), if they are still empty."""
    for path in made:
        try:
            path.rmdir()
        except OSError:
            return


def _judge_probe(rc: int, stdout: str, stderr: str, out: Path, where: str, names: Sequence[str]) -> list[Check]:
    lines = [line for line in stdout.splitlines() if line.startswith(PROBE_MARK)]
    if not lines:
        said = one_line(stderr + "\n" + stdout)
        refusal = find_refusal(said)
        if refusal is not None:
            first = Check("test job", FAIL, f"Slurm refused a one-node job {where}: {said}", refusal.fix)
        elif rc != 0 and ("No such file" in said or "execve" in said):
            first = Check("python", FAIL, f"the test job {where} could not start the interpreter: {said}", PYTHON_FIX)
        else:
            first = Check("test job", FAIL, f"the test job {where} exited {rc} without a report: {said}",
                          "run the same job by hand to see why: "
                          "`srun -N1 -n1 -t 2 python -c 'import podium'`")
        return [first, *(Check(n, SKIP, "not checked: the test job did not report") for n in names
                         if n != first.name)]
    report = json.loads(lines[-1][len(PROBE_MARK):])
    host = report.get("host", "?")
    rows: list[Check] = [Check("test job", PASS, f"ran {where} on node {host}")]
    if "write_error" in report:
        rows.append(Check("run dir", FAIL, f"node {host} cannot write {out}: {report['write_error']}", RUN_DIR_FIX))
    else:
        try:
            seen = json.loads(out.read_text())
        except (OSError, ValueError) as exc:
            seen = {"error": str(exc)}
        if seen.get("token") == report.get("token"):
            rows.append(Check("run dir", PASS, f"node {host} wrote {out.parent}, this machine read it back"))
        else:
            rows.append(Check("run dir", FAIL, f"node {host} wrote {out}, this machine cannot read it "
                              f"({seen.get('error', 'other content')}): the run dir is not on a filesystem both see",
                              RUN_DIR_FIX))
    mine = list(sys.version_info[:3])
    version = ".".join(map(str, report["version"]))
    if report["version"][:2] != mine[:2]:
        rows.append(Check("python", FAIL, f"node {host}: {report['python']} is Python {version}, this machine's "
                          f"{sys.executable} is {'.'.join(map(str, mine))}", PYTHON_FIX))
    else:
        rows.append(Check("python", PASS, f"node {host}: {report['python']} (Python {version}; here: {sys.executable})"))
    import podium

    if "import_error" in report or "podium" not in report:
        rows.append(Check("podium", FAIL, f"node {host}: import podium failed: {report.get('import_error')}",
                          PODIUM_FIX))
        rows += [Check(n, SKIP, "not checked: podium does not import on the node") for n in ("ports", "address")]
        return rows
    theirs = report["podium"]
    if theirs["version"] != podium.__version__:
        rows.append(Check("podium", FAIL, f"node {host}: podium {theirs['version']} at {theirs['file']}, here "
                          f"{podium.__version__} at {podium.__file__}", PODIUM_FIX))
    else:
        same = "same path" if theirs["file"] == podium.__file__ else f"here: {podium.__file__}"
        rows.append(Check("podium", PASS, f"node {host}: podium {theirs['version']} at {theirs['file']} ({same})"))
    rows += [Check(**{**row, "detail": f"node {host}: {row['detail']}"}) for row in report.get("checks", [])]
    return rows


# ---------------------------------------------------------------------------------------------- local

def check_local_gpus(plan: Optional[Plan]) -> list[Check]:
    """The local backend's own rule per teacher (``check`` refuses, ``notices`` says CPU)."""
    from podium.launcher.backends import SubmitError, backend_for
    from podium.launcher.devices import cuda_device_count

    if plan is None:
        return [Check("teacher", PASS, f"{cuda_device_count()} CUDA device(s) here; no recipe, nothing asked")]
    backend = backend_for("local")
    rows = []
    for spec in plan.teachers:
        try:
            backend.check(spec)
        except SubmitError as exc:
            rows.append(Check(f"teacher {spec.name}", FAIL, str(exc), "change the recipe as the message says"))
            continue
        notices = backend.notices(spec)
        asked = backend.node_gpus(spec) if not notices else 0
        rows.append(Check(f"teacher {spec.name}", PASS, notices[0] if notices else
                          f"gpus_per_node={spec.gpus_per_node}: {asked} of {cuda_device_count()} CUDA device(s) used"))
    return rows


def check_run_dir_here(run_dir: Path) -> Check:
    """The run dir (or the folder it will be made in) is writable here."""
    probe = run_dir / DOCTOR_DIR
    made = _missing(probe)
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
        _remove_empty(made)
    return Check("run dir", PASS if ok else FAIL, f"{run_dir} is writable here")


# ---------------------------------------------------------------------------------------------- all

def run_doctor(plan: Optional[Plan], settings: TeacherLauncherSettings, run_dir: Path,
               timeout_s: float = 300.0) -> list[Check]:
    """Every check for ``settings.cluster`` (``plan``: the recipe's, None without a recipe)."""
    run_dir = run_dir.absolute()
    if settings.cluster == "local":
        return [*check_local_gpus(plan), check_checkpoints(plan), check_run_dir_here(run_dir),
                *(Check(**row) for row in node_checks(settings.model_dump(mode="json"), local=True))]
    slurm = check_slurm()
    if not slurm.ok:
        return [slurm, *(Check(n, SKIP, "not checked: Slurm does not answer") for n in
                         ("sacct", "partition", "test job")), check_checkpoints(plan)]
    specs = plan.teachers if plan is not None else ()
    needs = partition_needs(specs) if specs else [
        PartitionNeed(settings.slurm.partition, 1, 0, _minutes(settings.slurm.time), settings.slurm.time, ())]
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


def _minutes(time: str) -> int:
    from podium.launcher.slurm_state import time_to_minutes

    return time_to_minutes(time)


def doctor_report(checks: Sequence[Check]) -> dict[str, Any]:
    """What ``--json`` prints."""
    return {"ok": all(c.ok for c in checks), "checks": [c.to_dict() for c in checks]}


def print_checks(checks: Sequence[Check], title: str) -> None:
    """The table: ✔/✘/– per row, what was seen, and the fix under a failed row's detail."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("what podium found (and the fix)", overflow="fold")
    colour = {PASS: "green", FAIL: "red", SKIP: "dim"}
    for check in checks:
        text = escape(check.detail)
        if check.fix:
            text += f"\n[bold]fix:[/bold] {escape(check.fix)}"
        table.add_row(f"[{colour[check.state]}]{MARKS[check.state]}[/]", check.name, text)
    console = Console()
    console.print(table)
    failed = [c for c in checks if c.state == FAIL]
    console.print(f"{len(failed)} check(s) failed" if failed else "all checks passed", highlight=False)

