"""Creating a run directory from a plan: resolved recipe, plan JSON, rendezvous, token, spec files.

Everything a later ``podium`` process needs (on any login node) is written here, on the shared
filesystem; nothing lives only in memory. Writing it again for the same plan is harmless (the
token is kept, files are replaced whole).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from podium.config.plan import Plan
from podium.config.spec import TeacherSpec
from podium.launcher.files import PLAN_FILE, RECIPE_FILE, TeacherFiles
from podium.rendezvous.atomic import atomic_write_json, ensure_dir
from podium.rendezvous.layout import RunLayout, teacher_dir_name
from podium.rendezvous.manifest import build_rendezvous, write_rendezvous
from podium.rendezvous.token import create_token

logger = logging.getLogger(__name__)

RUNS_DIR_ENV = "PODIUM_RUNS_DIR"
DEFAULT_RUNS_ROOT = "~/podium-runs"


def default_run_dir(plan: Plan) -> Path:
    """Where a run lives when ``--run-dir`` is not given: ``podium.run_dir`` when set, else
    ``<root>/<recipe stem>-<8 hex of the recipe's absolute resolved path>``, with ``<root>`` =
    ``$PODIUM_RUNS_DIR`` or ``~/podium-runs``.

    The name follows the recipe file, not the current directory: ``up`` of the same recipe from
    anywhere finds the same run (and reattaches to its jobs), and two recipes that share a file
    name (``a/mopd.yaml``, ``b/mopd.yaml``) get different runs. The home directory is shared
    between login and compute nodes on typical clusters, so the jobs see the run dir too; where it
    is not, set ``PODIUM_RUNS_DIR`` (or ``podium.run_dir``) to a shared filesystem.
    """
    if plan.launcher.run_dir:
        return Path(plan.launcher.run_dir).expanduser()
    recipe = Path(plan.recipe_path).expanduser().resolve()
    root = Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_ROOT).expanduser()
    digest = hashlib.sha256(str(recipe).encode()).hexdigest()[:8]
    return root / f"{recipe.stem}-{digest}"


def prepare_run_dir(plan: Plan, run_dir: Path, recipe_text: str | None = None,
                    replicas: Mapping[str, Sequence[int]] | None = None) -> RunLayout:
    """Write the run directory for ``plan`` and return its layout: the spec of every replica the
    plan asks for, and a rendezvous that lists, per teacher key, the replicas ``replicas`` names
    (default: those the plan asks for)."""
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
    for spec in plan.teachers:
        for replica in spec.replica_specs():
            write_spec(run_dir, replica)
    rendezvous = build_rendezvous(run_dir.name, plan.teachers, layout=layout, default_alias=plan.default_alias,
                                  strict=plan.strict, replicas=replicas)
    write_rendezvous(layout, rendezvous)
    return layout


def write_spec(run_dir: Path, spec: TeacherSpec) -> TeacherFiles:
    """Write the spec of the replica ``spec`` describes into its folder (created)."""
    files = TeacherFiles.of_spec(run_dir, spec)
    ensure_dir(files.folder)
    ensure_dir(files.submitit)  # sbatch --output points here; Slurm does not create folders
    atomic_write_json(files.spec, spec.to_json())
    return files


def known_teachers(run_dir: Path) -> list[tuple[TeacherSpec, TeacherFiles]]:
    """Every teacher folder of the run dir with its spec (also ones no longer in the plan): one
    per replica, each spec naming its ``replica``; sorted by folder, so a teacher's replica 0 comes
    before its others."""
    out: list[tuple[TeacherSpec, TeacherFiles]] = []
    teachers = RunLayout(run_dir).teachers_dir
    if not teachers.is_dir():
        return out
    for folder in teachers.iterdir():
        files = TeacherFiles(folder)
        if files.spec.is_file():
            out.append((TeacherSpec.read(files.spec), files))
    out.sort(key=lambda found: (teacher_dir_name(found[0].name, found[0].key), found[0].replica))
    return out
