"""Rich rendering of what the CLI shows a person: plans, ``status`` tables, ``--wait`` progress."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from podium.config.checkpoints import hub_snapshot_path
from podium.config.needs import teacher_needs
from podium.config.plan import Plan

if TYPE_CHECKING:
    from rich.live import Live


def print_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"podium plan: {plan.recipe_path}", title_justify="left")
    table.add_column("teacher", overflow="fold", ratio=3)
    table.add_column("key", no_wrap=True)
    table.add_column("aliases", justify="right", no_wrap=True)
    table.add_column("checkpoint", overflow="fold", ratio=3)
    table.add_column("TP/PP/CP/EP", no_wrap=True)
    table.add_column("DP", justify="right", no_wrap=True)
    table.add_column("T", justify="right", no_wrap=True)  # temperature: logits are divided by it
    table.add_column("nodes×GPUs", no_wrap=True)
    replicated = any(spec.launcher.replicas > 1 for spec in plan.teachers)
    if replicated:
        table.add_column("replicas", justify="right", no_wrap=True)
    for spec in plan.teachers:
        if Path(spec.model_name).is_absolute():
            found = "found" if Path(spec.model_name).exists() else "[red]missing[/red]"
        else:  # a hub id: the snapshot the plan pinned (the full commit is printed below the table)
            found = f"HF cache @ {spec.revision[:12]}" if spec.revision else "hub id, [red]not in the HF cache[/red]"
        table.add_row(
            spec.name,
            spec.key,
            str(len(spec.aliases)),
            f"{spec.model_name} ({found})",
            f"{spec.tensor_model_parallel_size}/{spec.pipeline_model_parallel_size}/"
            f"{spec.context_parallel_size}/{spec.expert_model_parallel_size}",
            str(spec.data_parallel_size),
            f"{spec.temperature:g}",
            f"{spec.num_nodes}×{spec.gpus_per_node}",
            *([str(spec.launcher.replicas)] if replicated else []),
        )
    console.print(table)
    for spec in plan.teachers:
        console.print(f"[bold]{spec.name}[/bold] serves: {', '.join(spec.aliases)}", highlight=False)
        if spec.revision:
            console.print(f"  checkpoint: {spec.model_name} pinned at snapshot {spec.revision} "
                          f"({hub_snapshot_path(spec.model_name, spec.revision)})", highlight=False, markup=False)
        for line in teacher_needs(spec):
            console.print(f"  needs: {line}", highlight=False)
    totals = plan.totals
    console.print(
        f"{totals['teachers']} unique teacher(s) for {totals['aliases']} alias(es)"
        + (f", {totals['replicas']} replica allocations" if replicated else "")
        + f"; {totals['nodes']} node(s) reserved instead of {totals['nodes_without_dedup']} without dedup."
    )
    if plan.default_alias:
        strict = " (strict agent-name match)" if plan.strict else ""
        console.print(f"Unmapped agents go to {plan.default_alias!r}{strict}.")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, markup=False)


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f}s"


# What a ready replica's /metrics says (podium.teacher.endpoint.metrics.summary): "out/s 1m" is the answers'
# body bytes sent per second, high while tok/s stays low when the wire, not the model, is the limit.
LOAD_COLUMNS = ("tok/s 1m", "out/s 1m", "queue", "padding")


def bytes_per_s(value: float) -> str:
    """``value`` bytes/s in the largest decimal unit it reaches: ``2.4 GB``, ``310.5 kB``, ``12 B``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def status_table(rows: list, title: str = "podium status") -> Table:
    table = Table(title=title, title_justify="left")
    # a replica of a teacher is a row of its own, named `name#i` (i >= 1)
    for col in ("teacher", "aliases", "T", "job", "slurm", "restarts", "generation", "status", "endpoint", "health",
                "heartbeat", *LOAD_COLUMNS):
        table.add_column(col, overflow="fold", justify="right" if col in LOAD_COLUMNS else "left")
    for r in rows:
        health = {True: "[green]ok[/green]", False: "[red]down[/red]", None: "-"}[r.health]
        status = r.status + (f" ({r.reason})" if r.reason and r.status in ("failed", "stopped", "draining") else "")
        if r.superseded:
            status += " [dim](earlier run; requeued)[/dim]"
        elif r.status == "failed" and r.restart:
            failures = f"{r.restart.get('consecutive_failures')}/{r.restart.get('max_consecutive_failures')} failures"
            status += f" [red]final after {failures}[/red]" if r.final else f" [yellow]retrying: {failures}[/yellow]"
        name = r.display if r.in_plan else f"{r.display} [dim](not in the rendezvous)[/dim]"
        restarts = "-" if r.restarts is None else str(r.restarts)
        load = r.load or {}
        out = load.get("bytes_out_per_s_1m")
        figures = (f"{load['tokens_per_s_1m']:.0f}", "-" if out is None else bytes_per_s(out),
                   f"{load['queue_depth']:.0f}", f"{load['padding_share']:.1%}") if load else ("-",) * len(LOAD_COLUMNS)
        table.add_row(name, ", ".join(r.aliases), f"{r.temperature:g}", r.job_id or "-", r.slurm_state, restarts,
                      r.generation or "-", status, r.url or "-", health, _age(r.heartbeat_age_s), *figures)
    return table


def print_status(rows: list, console: Console | None = None) -> None:
    (console or Console()).print(status_table(rows))


def watch_status(read: Callable[[], list], interval_s: float, console: Console | None = None,
                 errors: tuple[type[BaseException], ...] = ()) -> None:
    """``status --watch``: the table refreshed every ``interval_s`` until Ctrl-C (in place on a
    terminal; otherwise one table per refresh, for a log). A read that fails with one of
    ``errors`` (sacct not answering for a moment) shows the error and the watch goes on."""
    import time

    from rich.live import Live
    from rich.text import Text

    console = console or Console()

    def view() -> Any:
        stamp = time.strftime("%H:%M:%S")
        try:
            return status_table(read(), title=f"podium status ({stamp})")
        except errors as exc:
            return Text(f"podium status ({stamp}): {exc}", style="red")

    try:
        if console.is_terminal:
            with Live(view(), console=console, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval_s)
                    live.update(view())
        while True:
            console.print(view())
            time.sleep(interval_s)
    except KeyboardInterrupt:
        pass


class WaitView:
    """Live progress of ``--wait``: a rich table on a terminal, plain lines (on change) otherwise."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._live: Live | None = None
        self._last: dict[str, str] = {}
        self._since: dict[str, float] = {}

    def __enter__(self) -> WaitView:
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(Table(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, rows: list, elapsed: float) -> None:
        for r in rows:
            if self._last.get(r.display) != r.phase:
                self._since[r.display] = elapsed
                self._last[r.display] = r.phase
                if self._live is None:
                    gen = f", generation {r.generation}" if r.generation and not r.superseded else ""
                    self.console.print(f"[{elapsed:6.1f}s] {r.display}: {r.phase}"
                                       + (f" (job {r.job_id}{gen})" if r.job_id else ""), highlight=False)
        if self._live is not None:
            table = Table(title=f"waiting for teachers ({elapsed:.0f}s)", title_justify="left")
            for col in ("teacher", "job", "generation", "phase", "since"):
                table.add_column(col)
            for r in rows:
                table.add_row(r.display, r.job_id or "-", r.generation or "-", r.phase,
                              f"{elapsed - self._since.get(r.display, 0):.0f}s")
            self._live.update(table)
