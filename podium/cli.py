"""The ``podium`` command line.

Commands that need no model (``--help``, ``plan``, ``status``, ``down``) import nothing heavy:
torch, ray and megatron are imported inside the commands that use them, so these answer at once on
a login node. A user error (bad recipe, bad override, bad launcher setting) exits with code 2 and a
message that names the key or file at fault; nothing is written or submitted.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import List, Optional

import typer

from podium.config.errors import ConfigError

app = typer.Typer(
    help="Launch distillation teachers on Slurm, once, and let every trainer find them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_USER_ERROR = 2

RecipeArg = typer.Argument(..., help="NeMo RL recipe (YAML) with an on_policy_distillation section.")
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
    recipe: Optional[Path] = typer.Argument(
        None, help="NeMo RL recipe (YAML); without one, podium's embedded example recipe."
    ),
    overrides: Optional[List[str]] = OverridesArg,
    launcher: Optional[Path] = LauncherOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Show the unique teachers a recipe needs, their layout and the nodes they reserve."""
    from podium.config.plan import load_plan

    if recipe is None:
        recipe = EXAMPLE_RECIPE
        typer.echo(f"no recipe given: planning the embedded example {recipe}", err=True)
    try:
        the_plan = load_plan(recipe, overrides or [], launcher)
    except ConfigError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(the_plan.to_dict(), indent=2))
        return
    from podium.cli_render import print_plan

    print_plan(the_plan)


@app.command()
def convert(
    src: Path = typer.Argument(..., help="HF checkpoint directory (config.json + safetensors)."),
    dst: Path = typer.Argument(..., help="Where to write the Megatron torch_dist checkpoint."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size of the writing layout."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size of the writing layout."),
) -> None:
    """Write a Megatron torch_dist checkpoint from an HF directory (loads at any layout)."""
    from podium.teacher.convert import convert_hf_to_torch_dist

    try:
        out = convert_hf_to_torch_dist(src, dst, tp=tp, pp=pp)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as exc:
        _fail(str(exc))
        return
    typer.echo(f"wrote {out}")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":  # dist_checkpointing re-imports __main__ in spawned helpers
    main()
    sys.exit(0)
