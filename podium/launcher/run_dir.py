"""Creating a run directory from a plan: resolved recipe, plan JSON, rendezvous, token, spec files.

Everything a later ``podium`` process needs (on any login node) is written here, on the shared
filesystem; nothing lives only in memory. Writing it again for the same plan is harmless (the
token is kept, files are replaced whole).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Optional

from podium.config.plan import Plan
from podium.config.spec import TeacherSpec
from podium.launcher.files import PLAN_FILE, RECIPE_FILE, TeacherFiles
from podium.rendezvous.atomic import atomic_write_json, ensure_dir
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.manifest import build_rendezvous, write_rendezvous
from podium.rendezvous.token import create_token

logger = logging.getLogger(__name__)


def default_run_dir(plan: Plan) -> Path:
    if plan.launcher.run_dir:
        return Path(plan.launcher.run_dir).expanduser()
    return Path("podium-runs") / Path(plan.recipe_path).stem


def prepare_run_dir(plan: Plan, run_dir: Path, recipe_text: Optional[str] = None) -> RunLayout:
    """Write the run directory for ``plan`` and return its layout."""
    run_dir = run_dir.absolute()
    layout = RunLayout(run_dir)
    ensure_dir(run_dir)
    if recipe_text is not None:
        (run_dir / RECIPE_FILE).write_text(recipe_text)
    elif Path(plan.recipe_path).is_file():
        shutil.copyfile(plan.recipe_path, run_dir / RECIPE_FILE)
    atomic_write_json(run_dir / PLAN_FILE, plan.to_dict())
    if not layout.auth_token_path.exists():
        create_token(layout.auth_token_path)
    rendezvous = build_rendezvous(run_dir.name, plan.teachers, layout=layout,
                                  default_alias=plan.default_alias, strict=plan.strict)
    write_rendezvous(layout, rendezvous)
    for spec in plan.teachers:
        write_spec(run_dir, spec)
    return layout


def write_spec(run_dir: Path, spec: TeacherSpec) -> TeacherFiles:
    files = TeacherFiles.of(run_dir, spec.name, spec.key)
    ensure_dir(files.folder)
    ensure_dir(files.submitit)  # sbatch --output points here; Slurm does not create folders
    atomic_write_json(files.spec, spec.to_json())
    return files


def known_teachers(run_dir: Path) -> list[tuple[TeacherSpec, TeacherFiles]]:
    """Every teacher folder of the run dir with its spec (also ones no longer in the plan)."""
    out = []
    teachers = RunLayout(run_dir).teachers_dir
    if not teachers.is_dir():
        return out
    for folder in sorted(teachers.iterdir()):
        files = TeacherFiles(folder)
        if files.spec.is_file():
            out.append((TeacherSpec.read(files.spec), files))
    return out
