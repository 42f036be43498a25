"""Rich rendering of what the CLI shows a person (plans now; status tables later)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from podium.config.plan import Plan

def print_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"podium plan: {plan.recipe_path}", title_justify="left")
    table.add_column("teacher", overflow="fold", ratio=3)
    table.add_column("key", no_wrap=True)
    table.add_column("aliases", justify="right", no_wrap=True)
    table.add_column("checkpoint", overflow="fold", ratio=3)
    table.add_column("TP/PP/CP/EP", no_wrap=True)
    table.add_column("DP", justify="right", no_wrap=True)
    table.add_column("nodes×GPUs", no_wrap=True)
    for spec in plan.teachers:
        if Path(spec.model_name).is_absolute():
            found = "found" if Path(spec.model_name).exists() else "[red]missing[/red]"
        else:
            found = "hub id"
        table.add_row(
            spec.name,
            spec.key,
            str(len(spec.aliases)),
            f"{spec.model_name} ({found})",
            f"{spec.tensor_model_parallel_size}/{spec.pipeline_model_parallel_size}/"
            f"{spec.context_parallel_size}/{spec.expert_model_parallel_size}",
            str(spec.data_parallel_size),
            f"{spec.num_nodes}×{spec.gpus_per_node}",
        )
    console.print(table)
    for spec in plan.teachers:
        console.print(f"[bold]{spec.name}[/bold] serves: {', '.join(spec.aliases)}", highlight=False)
    totals = plan.totals
    console.print(
        f"{totals['teachers']} unique teacher(s) for {totals['aliases']} alias(es); "
        f"{totals['nodes']} node(s) reserved instead of {totals['nodes_without_dedup']} without dedup."
    )
    if plan.default_alias:
        strict = " (strict agent-name match)" if plan.strict else ""
        console.print(f"Unmapped agents go to {plan.default_alias!r}{strict}.")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
