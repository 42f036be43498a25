"""Creating a run directory from a plan: resolved recipe, plan JSON, rendezvous, token, spec files.

Everything a later ``podium`` process needs (on any login node) is written here, on the shared
filesystem; nothing lives only in memory. Writing it again for the same plan is harmless (the
token is kept, files are replaced whole).

The run dir is the user's own: 0700 (made so again when an older one is written), the files the
launcher writes 0600. Every read-modify-write of ``rendezvous.json`` (``up``, ``scale``) holds the
run's rendezvous claim (:func:`editing_rendezvous`, :mod:`podium.launcher.login.claims`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from podium.config.errors import ConfigError
from podium.config.launcher import SECTION
from podium.config.plan import Plan
from podium.config.recipe import load_recipe, resolve_section
from podium.config.spec import TeacherSpec
from podium.launcher.common.files import FILE_MODE, PLAN_FILE, RECIPE_FILE, RENDEZVOUS_CLAIM_PREFIX, TeacherFiles
from podium.launcher.login.claims import Claim, ClaimSet, holding
from podium.rendezvous.atomic import atomic_write_bytes, atomic_write_json, ensure_dir
from podium.rendezvous.layout import RENDEZVOUS_FILE, RunLayout, teacher_dir_name
from podium.rendezvous.manifest import build_rendezvous, write_rendezvous
from podium.rendezvous.token import create_token

logger = logging.getLogger(__name__)

RUNS_DIR_ENV = "PODIUM_RUNS_DIR"
DEFAULT_RUNS_ROOT = "~/podium-runs"
RUN_DIR_MODE = 0o700
RENDEZVOUS_CLAIM_WAIT_S = 120.0  # another `up`/`scale` edits rendezvous.json for seconds at most


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
    return _run_dir_for(Path(plan.recipe_path), plan.launcher.run_dir)


def _run_dir_for(recipe: Path, run_dir_setting: str | None) -> Path:
    """:func:`default_run_dir`'s rule, from the recipe's path and its ``podium.run_dir``."""
    if run_dir_setting:
        return Path(run_dir_setting).expanduser()
    recipe = recipe.expanduser().resolve()
    root = Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_ROOT).expanduser()
    digest = hashlib.sha256(str(recipe).encode()).hexdigest()[:8]
    return root / f"{recipe.stem}-{digest}"


class NotARunDirError(ValueError):
    """A path given as a run dir names none (nor its ``rendezvous.json``, nor a recipe whose run dir exists)."""


RECIPE_SUFFIXES = (".yaml", ".yml")
RUN_DIR_HINT = ("give the run dir `podium up` printed (the folder of its `rendezvous:` line), its rendezvous.json, "
                "or the recipe `up` was given")


def is_run_dir(path: Path) -> bool:
    """``path`` holds a run: its ``rendezvous.json``, or the teacher folders an ``up`` writes first."""
    layout = RunLayout(path)
    return layout.rendezvous_path.is_file() or layout.teachers_dir.is_dir()


def locate_run_dir(path: Path) -> tuple[Path, str | None]:
    """The run dir that ``path``, as typed after a run-dir command (``down``, ``status``, ``wait``,
    ``logs``, ``scale``), names, and how it was found when that is not plain (a recipe: which run
    dir it names, and why). A run dir, or its ``rendezvous.json``, names itself; a recipe names the
    run dir ``up`` gives it without ``--run-dir`` (:func:`default_run_dir`: ``podium.run_dir``, else
    the default), refused when that does not exist. Anything else is a :class:`NotARunDirError`
    naming the path, so a typo never passes as a run with nothing to do; a bad recipe is its
    :class:`~podium.config.errors.ConfigError`."""
    absolute = path.expanduser().absolute()
    if path.is_file() and path.name != RENDEZVOUS_FILE:
        if path.suffix not in RECIPE_SUFFIXES:
            raise NotARunDirError(f"{path} is a file, neither a run dir's {RENDEZVOUS_FILE} nor a recipe "
                                  f"({'/'.join(RECIPE_SUFFIXES)}): {RUN_DIR_HINT}")
        return _recipe_run_dir(path)
    run_dir = RunLayout.from_rendezvous_path(absolute).run_dir
    if not is_run_dir(run_dir):
        what = "no such folder" if not run_dir.exists() else "no rendezvous.json and no teachers/ folder"
        raise NotARunDirError(f"{path} is not a podium run dir: {RunLayout(run_dir).rendezvous_path}: missing "
                              f"({what}); {RUN_DIR_HINT}")
    return run_dir, None


def _recipe_run_dir(recipe: Path) -> tuple[Path, str]:
    """The run dir recipe ``recipe`` names (``podium.run_dir``, else the default); an error when no
    run is there."""
    setting = resolve_section(load_recipe(recipe), f"{SECTION}.run_dir", required=False)
    if setting is not None and not isinstance(setting, str):
        raise ConfigError(f"{SECTION}.run_dir: must be a path, got {setting!r}")
    run_dir = _run_dir_for(recipe, setting).absolute()
    how = (f"its {SECTION}.run_dir" if setting else f"no {SECTION}.run_dir: the default, "
           f"<${RUNS_DIR_ENV} or {DEFAULT_RUNS_ROOT}>/<recipe stem>-<8 hex of its path>")
    if not is_run_dir(run_dir):
        raise NotARunDirError(f"{recipe} is a recipe; the run dir it names, {run_dir} ({how}), holds no run: "
                              f"nothing was brought up there from it. If `podium up` was given --run-dir (or "
                              f"--launcher, or overrides that set {SECTION}.run_dir), name that run dir")
    return run_dir, f"{recipe} is a recipe: its run dir is {run_dir} ({how})"


def prepare_run_dir(plan: Plan, run_dir: Path, recipe_text: str | None = None,
                    replicas: Mapping[str, Sequence[int]] | None = None) -> RunLayout:
    """Write the run directory for ``plan`` and return its layout: the spec of every replica the
    plan asks for, and a rendezvous that lists, per teacher key, the replicas ``replicas`` names
    (default: those the plan asks for)."""
    run_dir = run_dir.absolute()
    layout = RunLayout(run_dir)
    make_run_dir(run_dir)
    if recipe_text is None and Path(plan.recipe_path).is_file():
        recipe_text = Path(plan.recipe_path).read_text()
    if recipe_text is not None:
        atomic_write_bytes(run_dir / RECIPE_FILE, recipe_text.encode(), mode=FILE_MODE)
    atomic_write_json(run_dir / PLAN_FILE, plan.to_dict(), mode=FILE_MODE)
    if not layout.auth_token_path.exists():
        create_token(layout.auth_token_path)
    for spec in plan.teachers:
        for replica in spec.replica_specs():
            write_spec(run_dir, replica)
    rendezvous = build_rendezvous(run_dir.name, plan.teachers, layout=layout, default_alias=plan.default_alias,
                                  strict=plan.strict, replicas=replicas)
    write_rendezvous(layout, rendezvous)
    return layout


def make_run_dir(run_dir: Path) -> Path:
    """Create the run dir (0700; one of this user's with a wider mode is narrowed)."""
    ensure_dir(run_dir, mode=RUN_DIR_MODE)
    info = run_dir.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        logger.info("%s: mode %o narrowed to %o (the run dir is yours only)", run_dir, info.st_mode & 0o777,
                    RUN_DIR_MODE)
        os.chmod(run_dir, RUN_DIR_MODE)
    return run_dir


def rendezvous_claims(run_dir: Path) -> ClaimSet:
    """The claim every read-modify-write of the run's ``rendezvous.json`` holds."""
    return ClaimSet(run_dir, RENDEZVOUS_CLAIM_PREFIX)


def editing_rendezvous(run_dir: Path) -> AbstractContextManager[Claim]:
    """The run's rendezvous claim, held around a read-modify-write of ``rendezvous.json``."""
    return holding(rendezvous_claims(run_dir), "the claim on rendezvous.json", RENDEZVOUS_CLAIM_WAIT_S)


def write_spec(run_dir: Path, spec: TeacherSpec) -> TeacherFiles:
    """Write the spec of the replica ``spec`` describes into its folder (created)."""
    files = TeacherFiles.of_spec(run_dir, spec)
    ensure_dir(files.folder)
    ensure_dir(files.submitit)  # sbatch --output points here; Slurm does not create folders
    atomic_write_json(files.spec, spec.to_json(), mode=FILE_MODE)
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
