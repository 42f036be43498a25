"""The ``podium`` command line.

Commands that need no model (``--help``, ``plan``, ``status``, ``down``) import nothing heavy:
torch, ray and megatron are imported inside the commands that use them, so these answer at once on
a login node. A user error (bad recipe, bad override, bad launcher setting) exits with code 2 and a
message that names the key or file at fault; nothing is written or submitted.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path

import typer

from podium.config.errors import ConfigError
from podium.rendezvous.layout import RENDEZVOUS_FILE, RunLayout

app = typer.Typer(
    help="Launch distillation teachers on Slurm, once, and let every trainer find them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_USER_ERROR = 2
WATCH_DEFAULT_S = 2.0  # `status --watch` without seconds

RecipeArg = typer.Argument(..., help="NeMo RL recipe (YAML) with an on_policy_distillation section, or a "
                                          "teachers file.")
EXAMPLE_RECIPE = Path(__file__).parent / "examples" / "mopd_example.yaml"
OverridesArg = typer.Argument(
    None, help="Overrides as NeMo RL users type them: key=value, +key=value, ++key=value, ~key."
)
LauncherOpt = typer.Option(
    None, "--launcher", help="YAML file with podium's launcher section, merged over the recipe's."
)


def _fail(message: str) -> None:
    typer.echo(f"podium: error: {message}", err=True)
    raise typer.Exit(EXIT_USER_ERROR)


@app.command()
def plan(
    recipe: Path | None = typer.Argument(
        None, help="NeMo RL recipe or teachers file (YAML); without one, podium's embedded example recipe."
    ),
    overrides: list[str] | None = OverridesArg,
    launcher: Path | None = LauncherOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Show the unique teachers a recipe needs, their layout and the nodes they reserve; refuse (exit 2,
    every problem listed, after the plan) what `up` would refuse."""
    from podium.config.plan import load_plan
    from podium.launcher.backends import SubmitError
    from podium.launcher.login import up as up_logic

    example = recipe is None
    if recipe is None:
        recipe = EXAMPLE_RECIPE
        typer.echo(f"no recipe given: planning the embedded example {recipe}", err=True)
    try:
        the_plan = load_plan(recipe, overrides or [], launcher)
    except (ConfigError, SubmitError) as exc:  # no plan to show
        _fail(str(exc))
        return
    refused = None
    if not example:  # the example shows planning; its hub ids need not be in this machine's cache
        try:
            up_logic.validate(the_plan)  # what `up` checks before it writes anything: the same words, exit 2
        except (ConfigError, SubmitError) as exc:
            refused = str(exc)  # the plan is still shown (a recipe whose checkpoints are not staged yet)
    elif the_plan.warnings:
        typer.echo(f"the example's checkpoints were not checked ({len(the_plan.warnings)} not found here; "
                   "`podium plan RECIPE` refuses what `up` would)", err=True)
    if refused is not None or example:
        the_plan = dataclasses.replace(the_plan, warnings=())  # the refusal lists them (on stderr), once
    if as_json:
        typer.echo(json.dumps(the_plan.to_dict(), indent=2))
    else:
        from podium.cli_render import print_plan

        print_plan(the_plan)
    if refused is not None:
        _fail(refused)  # `up`'s words, on stderr as `up` writes them


@app.command()
def convert(
    src: Path = typer.Argument(..., help="HF checkpoint directory (config.json + safetensors)."),
    dst: Path = typer.Argument(..., help="Where to write the Megatron torch_dist checkpoint."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size of the writing layout."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size of the writing layout."),
    ep: int = typer.Option(
        1, "--ep", help="Expert-parallel size of the writing layout (MoE: no process holds every expert)."
    ),
    etp: int = typer.Option(1, "--etp", help="Expert-tensor-parallel size of the writing layout (MoE)."),
    precision: str | None = typer.Option(
        None, "--precision", help="bf16, fp16 or fp32 (default: the HF config's dtype, else bf16)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace DST if it exists."),
) -> None:
    """Write a Megatron torch_dist checkpoint from an HF directory (loads at any layout)."""
    from podium.teacher.model.convert import convert_hf_to_torch_dist

    try:
        out = convert_hf_to_torch_dist(src, dst, tp=tp, pp=pp, ep=ep, etp=etp, precision=precision,
                                       overwrite=overwrite)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as exc:
        _fail(str(exc))
        return
    typer.echo(f"wrote {out}")


RunDirArg = typer.Argument(
    ..., help=f"The run directory (or its {RENDEZVOUS_FILE}, or the recipe `up` was given without --run-dir).")


def _run_dir(path: Path) -> Path:
    """The run dir ``path`` names (a run dir, its rendezvous.json, a recipe); exit 2 naming ``path``
    when it names none."""
    from podium.launcher.login.run_dir import NotARunDirError, locate_run_dir

    try:
        run_dir, how = locate_run_dir(path)
    except (NotARunDirError, ConfigError) as exc:
        typer.echo(f"podium: error: {exc}", err=True)
        raise typer.Exit(EXIT_USER_ERROR) from None
    if how:
        _notices([how])
    return run_dir


@app.command()
def up(
    recipe: Path = RecipeArg,
    overrides: list[str] | None = OverridesArg,
    launcher: Path | None = LauncherOpt,
    run_dir: Path | None = typer.Option(
        None, "--run-dir",
        help="Run directory (default: podium.run_dir, else "
             "<$PODIUM_RUNS_DIR or ~/podium-runs>/<recipe stem>-<8 hex of the recipe's path>).",
    ),
    wait_ready: bool = typer.Option(False, "--wait", help="Wait until every teacher is ready."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds --wait waits."),
    replace: bool = typer.Option(
        False, "--replace",
        help="Resubmit live teachers whose podium.* settings (slurm, ray, server) the recipe changed, cancelling "
             "their jobs; stop teachers of this run dir that the recipe no longer has.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run",
        help="Validate as `up` does and print every teacher's job script; write and submit nothing.",
    ),
) -> None:
    """Submit one job per unique teacher (idempotent: live jobs are reattached; changed settings are
    reported, applied with --replace)."""
    from podium.config.plan import load_plan
    from podium.launcher.backends import SubmitError
    from podium.launcher.common.slurm_state import SlurmQueryError
    from podium.launcher.login import up as up_logic
    from podium.launcher.login.run_dir import default_run_dir

    try:
        the_plan = load_plan(recipe, overrides or [], launcher)
        target = run_dir or default_run_dir(the_plan)
        if dry_run:
            submissions = up_logic.dry_run(the_plan, target)
            _notices([*the_plan.notes, *up_logic.notices(the_plan)])
            for submission in submissions:
                typer.echo(f"# ---- {submission.teacher} ({submission.backend}): what `podium up` submits", err=True)
                typer.echo(submission.render(), nl=False)
            return
        result = up_logic.up(the_plan, target, replace=replace)
    except (ConfigError, SubmitError) as exc:
        _fail(str(exc))
        return
    except SlurmQueryError as exc:  # the scheduler did not answer: never guess what runs
        typer.echo(f"podium: error: {exc}", err=True)
        raise typer.Exit(1) from None
    _notices([*the_plan.notes, *result.notices])
    for name, action in result.actions.items():
        if name in result.replaced:
            typer.echo(f"{name}: replaced job {result.replaced[name]} with job {result.job_ids[name]}")
        else:
            typer.echo(f"{name}: {action} job {result.job_ids[name]}")
    for note in result.notes:
        typer.echo(note)
    for orphan in result.orphans:
        verb = "stopped" if replace else "left running (use --replace to stop it)"
        typer.echo(f"{orphan}: no longer in the recipe, {verb}")
    typer.echo(f"rendezvous: {RunLayout(result.run_dir).rendezvous_path}")
    if wait_ready:
        _wait(result.run_dir, timeout)


def _notices(lines: list[str]) -> None:
    from podium.config.plan import note_kind

    for line in lines:
        kind, text = note_kind(line)  # a plan note may be a warning
        typer.echo(f"podium: {kind}: {text}", err=True)


def _wait(run_dir: Path, timeout: float) -> None:
    from podium.cli_render import WaitView
    from podium.launcher.common.slurm_state import SlurmQueryError
    from podium.launcher.login.status import WaitFailed, wait
    from podium.rendezvous.atomic import FileReadError

    view = WaitView()
    try:
        with view:
            wait(run_dir, timeout, on_update=view.update)
    except (WaitFailed, FileReadError, SlurmQueryError) as exc:
        typer.echo(f"podium: error: {exc}", err=True)
        raise typer.Exit(EXIT_USER_ERROR if isinstance(exc, FileReadError) else 1) from None
    typer.echo("all teachers ready")


@app.command()
def wait(
    run_dir: Path = RunDirArg,
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds to wait."),
) -> None:
    """Wait until every teacher of the run is ready (what sbatch scripts call before training)."""
    _wait(_run_dir(run_dir), timeout)


@app.command()
def status(
    run_dir: Path = RunDirArg,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    watch: float | None = typer.Option(
        None, "--watch", min=0.5, metavar="[SECONDS]",
        help=f"Refresh the table every SECONDS until Ctrl-C (`--watch` alone: every {WATCH_DEFAULT_S:g} s)."),
) -> None:
    """Per teacher: job, Slurm state, generation, endpoint, health, load (tokens/s and answer
    bytes/s over the last minute, queue depth, padding share); exit 0 only when all are ready."""
    from podium.launcher.common.slurm_state import SlurmQueryError
    from podium.launcher.login import status as teacher_status
    from podium.rendezvous.atomic import FileReadError

    target = _run_dir(run_dir)
    try:
        rows = teacher_status.status(target)
    except (FileReadError, SlurmQueryError) as exc:
        typer.echo(f"podium: error: {exc}", err=True)
        raise typer.Exit(EXIT_USER_ERROR if isinstance(exc, FileReadError) else 1) from None
    if watch is not None and not as_json:
        from podium.cli_render import watch_status

        watch_status(lambda: teacher_status.status(target), watch, errors=(FileReadError, SlurmQueryError))
        return
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        from podium.cli_render import print_fronts, print_status

        print_status(rows)
        print_fronts(target)
    planned = [r for r in rows if r.in_plan]
    raise typer.Exit(0 if planned and all(r.ready for r in planned) else 1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def front(
    ctx: typer.Context,
    run_dir: Path = RunDirArg,
    listen: str = typer.Option("127.0.0.1:0", "--listen", help="HOST:PORT to listen on (port 0: a free one)."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Take calls without the run's token (loopback only)."),
    call_timeout: float | None = typer.Option(
        None, "--call-timeout", help="Seconds one call may wait for a ready replica, retries included "
                                     "(default: podium's client's call_timeout_s)."),
    exec_: bool = typer.Option(False, "--exec", help="Run the command after `--`, with PODIUM_FRONT_URL and "
                                                     "PODIUM_FRONT_URL_<ALIAS> set; stop when it exits."),
) -> None:
    """One fixed base URL per alias (http://HOST:PORT/<alias>) for trainers that pin one URL: it
    follows the run's generations and replicas as podium's client does."""
    from podium.front.command import run_checked

    raise typer.Exit(run_checked(str(run_dir), listen, not no_auth, call_timeout, exec_, list(ctx.args), _fail,
                                 typer.echo))


@app.command()
def logs(
    run_dir: Path = RunDirArg,
    teacher: str = typer.Argument(
        ..., help="Teacher name, key or any of its aliases, folder name, or NAME#i for its replica i."),
    node: int | None = typer.Option(None, "--node", help="Node rank (default: all)."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing as the log grows."),
) -> None:
    """Print a teacher's job logs."""
    import subprocess

    from podium.launcher.login.logs import log_paths
    from podium.launcher.login.selection import UnknownTeacherError

    try:
        paths = log_paths(_run_dir(run_dir), teacher, node)
    except (FileNotFoundError, UnknownTeacherError) as exc:
        _fail(str(exc))
        return
    existing = [str(p) for p in paths if p.exists()]
    if not existing:
        typer.echo(f"no logs yet: {', '.join(str(p) for p in paths)}", err=True)
        raise typer.Exit(1)
    if follow:
        raise typer.Exit(subprocess.call(["tail", "-n", "+1", "-F", *existing]))
    for path in existing:
        typer.echo(f"==> {path} <==")
        typer.echo(Path(path).read_text(errors="replace"))


@app.command()
def down(
    run_dir: Path = RunDirArg,
    teachers: list[str] | None = typer.Argument(
        None, help="Teachers to stop, each by name, key or any of its aliases, folder name, or NAME#i for its "
             "replica i (default: all)."),
) -> None:
    """Cancel the teachers' jobs and mark their records stopped (safe to repeat)."""
    from podium.launcher.common.slurm_state import SlurmQueryError
    from podium.launcher.login.selection import UnknownTeacherError
    from podium.launcher.login.stop import down as stop_teachers

    try:
        names = stop_teachers(_run_dir(run_dir), teachers or [])
    except UnknownTeacherError as exc:
        _fail(str(exc))
        return
    except SlurmQueryError as exc:
        typer.echo(f"podium: error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"stopped: {', '.join(names) or 'nothing'}")


@app.command()
def scale(
    run_dir: Path = RunDirArg,
    teacher: str = typer.Argument(
        ..., help="Teacher name (its first alias), key or any of its aliases, or the folder name or NAME#i of "
             "any of its replicas."),
    replicas: int = typer.Argument(..., help="How many replicas (independent allocations) serve it from now on."),
) -> None:
    """Change how many replicas serve a running teacher: submit the missing ones, stop those beyond
    (the others are left as they are)."""
    from podium.launcher.backends import SubmitError
    from podium.launcher.common.slurm_state import SlurmQueryError
    from podium.launcher.login.scale import scale as scale_teacher
    from podium.rendezvous.atomic import FileReadError

    try:
        result = scale_teacher(_run_dir(run_dir), teacher, replicas)
    except (ValueError, SubmitError, FileReadError) as exc:
        _fail(str(exc))
        return
    except SlurmQueryError as exc:
        typer.echo(f"podium: error: {exc}", err=True)
        raise typer.Exit(1) from None
    for name, action in result.actions.items():
        typer.echo(f"{name}: {action} job {result.job_ids[name]}")
    for name in result.stopped:
        typer.echo(f"{name}: stopped")
    typer.echo(f"rendezvous: {RunLayout(result.run_dir).rendezvous_path} lists {result.count} replica(s) of "
               f"{result.teacher} (was {result.before})")


@app.command()
def render(
    recipe: Path = RecipeArg,
    overrides: list[str] | None = OverridesArg,
    launcher: Path | None = LauncherOpt,
    teacher: str = typer.Option(
        ..., "--teacher", help="Teacher name (its first alias), key or any of its aliases; NAME#i for its replica i."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Run directory the script uses (default: as `up`)."),
    write: bool = typer.Option(
        False, "--write", help="Also write the run dir (spec, rendezvous, token) so the script can run."
    ),
) -> None:
    """Print one teacher's job script: exactly what `podium up` submits (sbatch it yourself with --write)."""
    from podium.config.plan import load_plan
    from podium.launcher.backends import scheduler_for
    from podium.launcher.common.files import TeacherFiles
    from podium.launcher.login.run_dir import default_run_dir, prepare_run_dir

    try:
        the_plan = load_plan(recipe, overrides or [], launcher)
        spec = the_plan.teacher(teacher)
        target = (run_dir or default_run_dir(the_plan)).absolute()
        if write:
            prepare_run_dir(the_plan, target)
    except ConfigError as exc:
        _fail(str(exc))
        return
    submission = scheduler_for(spec.launcher.cluster).materialise(spec, TeacherFiles.of_spec(target, spec))
    typer.echo(submission.render(), nl=False)


@app.command()
def doctor(
    recipe: Path | None = typer.Argument(None, help="NeMo RL recipe (YAML); without one, podium's default settings."),
    overrides: list[str] | None = OverridesArg,
    launcher: Path | None = LauncherOpt,
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Run directory to check (default: as `up`)."),
    timeout: float = typer.Option(
        300.0, "--timeout", help="Seconds the one-node test job may take, queue wait included."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
) -> None:
    """Check what a first run needs (Slurm, sacct, partitions, GPUs, shared run dir, Python, podium
    and the teacher's packages on a node, ports); exit 0 when all pass."""
    from podium.config.launcher import TeacherLauncherSettings
    from podium.config.plan import load_plan
    from podium.launcher.login.doctor.checks import run_doctor
    from podium.launcher.login.doctor.report import doctor_report, print_checks
    from podium.launcher.login.run_dir import DEFAULT_RUNS_ROOT, RUNS_DIR_ENV, default_run_dir

    the_plan = None
    try:
        if recipe is not None:
            the_plan = load_plan(recipe, overrides or [], launcher)
    except ConfigError as exc:
        _fail(str(exc))
        return
    if the_plan is not None:
        settings = the_plan.teachers[0].launcher if the_plan.teachers else TeacherLauncherSettings()
        target = run_dir or default_run_dir(the_plan)
    else:
        import os

        settings = TeacherLauncherSettings()
        target = run_dir or Path(os.environ.get(RUNS_DIR_ENV) or DEFAULT_RUNS_ROOT).expanduser()
    checks = run_doctor(the_plan, settings, target, timeout)
    if as_json:
        typer.echo(json.dumps(doctor_report(checks), indent=2))
    else:
        title = (f"podium doctor: {recipe or 'default settings'} "
                 f"(cluster: {settings.cluster}, run dir {target.absolute()})")
        print_checks(checks, title)
    raise typer.Exit(0 if all(c.ok for c in checks) else 1)


@app.command()
def demo(
    keep: Path | None = typer.Option(None, "--keep", help="Keep the demo's files in this folder."),
    timeout: float = typer.Option(240.0, "--timeout", help="Seconds to wait for the teachers."),
) -> None:
    """Two tiny teachers, three aliases, served locally (no Slurm) and checked against transformers."""
    from podium.apps.demo import run_demo

    raise typer.Exit(run_demo(keep, timeout))


@app.callback()
def _options(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print podium's INFO log lines (on stderr)."),
) -> None:
    # The CLI's own words are its output; log lines are for when something goes wrong (warnings),
    # or for a closer look (--verbose).
    if verbose:
        logging.getLogger().setLevel(logging.INFO)


def with_watch_default(argv: list[str]) -> list[str]:
    """``argv`` with :data:`WATCH_DEFAULT_S` after a ``--watch`` that has no number after it: the
    README's ``status --watch`` is a flag, ``--watch 5`` still sets 5 (a typer option takes no
    optional value, so the default is filled in here)."""
    out: list[str] = []
    for i, word in enumerate(argv):
        out.append(word)
        if word == "--watch" and (i + 1 == len(argv) or not _is_number(argv[i + 1])):
            out.append(f"{WATCH_DEFAULT_S:g}")
    return out


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app(args=with_watch_default(sys.argv[1:]))


if __name__ == "__main__":  # dist_checkpointing re-imports __main__ in spawned helpers
    main()
    sys.exit(0)
