"""Rendering a teacher's plain sbatch script from ``podium/templates/teacher.sbatch.j2``.

Pure: a ``TeacherSpec`` and a run directory in, the script text out (what ``podium render`` prints
and the golden-file tests compare). Every user value that reaches a shell line goes through
``shlex.quote``; ``#SBATCH`` flags are rendered from the same parameters submitit gets
(:func:`podium.launcher.submission.slurm_parameters`), so both paths ask Slurm for the same thing.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from podium.config.spec import TeacherSpec
from podium.launcher.files import TeacherFiles
from podium.launcher.submission import slurm_parameters

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
TEACHER_TEMPLATE = "teacher.sbatch.j2"
# submitit parameter -> sbatch option (submitit's own names are python identifiers)
_SBATCH_NAMES = {"job_name": "job-name", "ntasks_per_node": "ntasks-per-node",
                 "cpus_per_task": "cpus-per-task", "gpus_per_node": "gpus-per-node"}


def _flag(name: str, value: Any) -> str:
    option = _SBATCH_NAMES.get(name, name.replace("_", "-"))
    if value is True:
        return f"--{option}"
    return f"--{option}={shlex.quote(str(value))}"


def sbatch_flags(spec: TeacherSpec, files: TeacherFiles) -> list[str]:
    params = slurm_parameters(spec)
    extra = params.pop("additional_parameters", {})
    for name in ("setup", "srun_args", "signal_delay_s"):
        params.pop(name, None)
    params["output"] = str(files.submitit / "%j_sbatch.out")
    params["open-mode"] = "append"
    merged = {**params, **extra}
    return [_flag(k, merged[k]) for k in sorted(merged)]


def render_teacher_script(spec: TeacherSpec, run_dir: Path, python: str | None = None) -> str:
    files = TeacherFiles.of(run_dir, spec.name, spec.key)
    slurm = spec.launcher.get("slurm", {})
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                      keep_trailing_newline=True, autoescape=False)
    srun = ["--unbuffered", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    srun += slurm_parameters(spec).get("srun_args", [])
    return env.get_template(TEACHER_TEMPLATE).render(
        name=spec.name, key=spec.key, aliases=", ".join(spec.aliases),
        sbatch_flags=sbatch_flags(spec, files),
        setup=list(slurm.get("setup") or []),
        teacher_dir=shlex.quote(str(files.folder)),
        srun_args=" ".join(shlex.quote(a) for a in srun),
        log_out=shlex.quote(str(files.submitit / "%j_%t_log.out")),
        log_err=shlex.quote(str(files.submitit / "%j_%t_log.err")),
        python=shlex.quote(python or slurm.get("python") or sys.executable),
    )
