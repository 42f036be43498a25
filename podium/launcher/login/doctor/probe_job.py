"""The doctor's one test job: the ``srun`` command a teacher's settings make of it, running it, and
the rows its report turns into (test job, run dir, python, podium, and the node's ports and address).
The program it runs is :mod:`podium.launcher.login.doctor.probe`."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import podium
from podium.config.launcher import TeacherLauncherSettings
from podium.launcher.common.packages import (
    LAUNCHER_INSTALL,
    LAUNCHER_PACKAGES,
    TEACHER_INSTALL,
    TEACHER_PACKAGES,
    missing_message,
)
from podium.launcher.login.doctor import probe
from podium.launcher.login.doctor.base import (
    DOCTOR_DIR,
    FAIL,
    PASS,
    QUERY_TIMEOUT_S,
    SKIP,
    Check,
    missing_folders,
    remove_empty,
    run_query,
)
from podium.launcher.login.doctor.probe import PROBE_MARK
from podium.launcher.login.sbatch_errors import find_refusal, one_line

TEST_JOB_MINUTES = 2
RUN_DIR_FIX = ("put the run dir on a filesystem that every compute node mounts at the same path "
               "(--run-dir, podium.run_dir or $PODIUM_RUNS_DIR)")
PYTHON_FIX = ("set podium.slurm.python to an interpreter on the compute nodes that has podium installed, or "
              "podium.slurm.setup lines that activate your environment there")
PODIUM_FIX = ("install podium where the compute nodes' Python finds it (a virtual environment on the shared "
              "filesystem), or set podium.slurm.python / podium.slurm.setup; the job inherits this shell's "
              "environment (PYTHONPATH included)")
PACKAGES_FIX = (f"install the teacher's packages into the nodes' Python (`{TEACHER_INSTALL}`; on a machine "
                "without CUDA the CPU build of torch first, as the README says), or set podium.slurm.python / "
                "podium.slurm.setup to a Python that has them; `podium up` needs submitit where it runs "
                f"(`{LAUNCHER_INSTALL}`)")


def check_packages(found: Mapping[str, str | None], python: str, where: str) -> Check:
    """The ``packages`` row: the teacher's packages as the node's Python ``python`` found them
    (:func:`podium.launcher.login.doctor.probe.packages`; ``where`` names the node), and submitit
    here, which ``podium up`` submits with (and, for cluster: local, runs the job with)."""
    missing = [module for module, version in found.items() if version is None]
    problems = [f"{where}: " + missing_message(missing, TEACHER_PACKAGES, TEACHER_INSTALL, python=python,
                                               advice="")] if missing else []
    here = probe.packages(dict(LAUNCHER_PACKAGES))
    if None in here.values():
        problems.append("here (`podium up`): " + missing_message(
            [m for m, v in here.items() if v is None], LAUNCHER_PACKAGES, LAUNCHER_INSTALL, advice=""))
    if problems:
        return Check("packages", FAIL, "; ".join(problems), PACKAGES_FIX)
    return Check("packages", PASS, f"{where}: {python} imports {_versions(found)}; here (`podium up`): "
                 f"{_versions(here)}")


def _versions(found: Mapping[str, str | None]) -> str:
    return ", ".join(f"{TEACHER_PACKAGES.get(m) or LAUNCHER_PACKAGES.get(m) or m} {v}" for m, v in found.items())


def local_packages(python: str, folder: Path) -> Check:
    """The ``packages`` row of cluster: local, whose job runs ``python`` (podium.slurm.python, else
    this one) on this machine: the probe's program run by that Python, as on a node."""
    args = {"token": "local", "out": str(folder / "packages.json"), "settings": {}, "packages": dict(TEACHER_PACKAGES)}
    rc, out, err = run_query([python, "-c", Path(probe.__file__).read_text(encoding="utf-8"), json.dumps(args)])
    lines = [line for line in out.splitlines() if line.startswith(PROBE_MARK)]
    if not lines:
        return Check("packages", FAIL, f"{python} did not run the probe (exit {rc}): {one_line(err + out)}",
                     PYTHON_FIX)
    report = json.loads(lines[-1][len(PROBE_MARK):])
    return check_packages(report.get("packages") or {}, python, "this machine (cluster: local)")


def probe_command(spec_settings: TeacherLauncherSettings, args: Mapping[str, Any], job_name: str,
                  partition: str | None) -> list[str]:
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
    # The probe's text, not its path: the node (or its container) need not see this installation.
    program = [python, "-c", Path(probe.__file__).read_text(encoding="utf-8"), json.dumps(dict(args))]
    if s.setup:  # the teacher's batch script runs them before its srun; here in the task itself
        return [*cmd, "bash", "-c", "\n".join([*s.setup, 'exec "$@"']), "podium-doctor", *program]
    return [*cmd, *program]


def _cancel_by_name(job_name: str) -> None:
    run_query(["scancel", f"--name={job_name}", f"--user={getpass.getuser()}"])


def check_test_job(settings: TeacherLauncherSettings, run_dir: Path, partition: str | None,
                   timeout_s: float, where: str) -> list[Check]:
    """Run the one test job and turn what it reports into rows (see the package's table)."""
    names = ("run dir", "python", "podium", "packages", "ports", "address")
    token = uuid.uuid4().hex[:12]
    job_name = f"podium-doctor-{token}"
    probe_dir = run_dir / DOCTOR_DIR
    made = missing_folders(probe_dir)
    try:
        probe_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [Check("run dir", FAIL, f"cannot create {probe_dir}: {exc}", RUN_DIR_FIX),
                *(Check(n, SKIP, "not checked: no run dir") for n in names[1:])]
    out = probe_dir / f"{token}.json"
    args = {"token": token, "out": str(out), "settings": settings.model_dump(mode="json"),
            "packages": dict(TEACHER_PACKAGES)}
    cmd = probe_command(settings, args, job_name, partition)
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
        remove_empty(made)


def _judge_probe(rc: int, stdout: str, stderr: str, out: Path, where: str, names: Sequence[str]) -> list[Check]:
    """The rows of a finished test job: its exit code and output, and the file it wrote at ``out``."""
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
        rows.append(Check("python", PASS,
                          f"node {host}: {report['python']} (Python {version}; here: {sys.executable})"))
    packages = check_packages(report.get("packages") or {}, report["python"], f"node {host}")
    if "import_error" in report or "podium" not in report:
        rows.append(Check("podium", FAIL, f"node {host}: import podium failed: {report.get('import_error')}",
                          PODIUM_FIX))
        rows.append(packages)
        rows += [Check(n, SKIP, "not checked: podium does not import on the node") for n in ("ports", "address")]
        return rows
    theirs = report["podium"]
    if theirs["version"] != podium.__version__:
        rows.append(Check("podium", FAIL, f"node {host}: podium {theirs['version']} at {theirs['file']}, here "
                          f"{podium.__version__} at {podium.__file__}", PODIUM_FIX))
    else:
        same = "same path" if theirs["file"] == podium.__file__ else f"here: {podium.__file__}"
        rows.append(Check("podium", PASS, f"node {host}: podium {theirs['version']} at {theirs['file']} ({same})"))
    rows.append(packages)
    rows += [Check(**{**row, "detail": f"node {host}: {row['detail']}"}) for row in report.get("checks", [])]
    return rows
