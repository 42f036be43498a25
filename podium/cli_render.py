"""Rich rendering of what the CLI shows a person: plans, ``status`` tables, ``--wait`` progress."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from podium.config.checkpoints import hub_snapshot_path
from podium.config.needs import teacher_needs
from podium.config.plan import Plan

if TYPE_CHECKING:
    from rich.live import Live


def compact_table(title: str | None) -> Table:
    """The CLI's tables: a rule under the header, no box (100 columns hold a plan or a status)."""
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))


def print_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    table = compact_table(f"podium plan: {plan.recipe_path}")
    table.add_column("teacher", no_wrap=True)  # a name read in pieces is misread
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
    for kind, text in plan.notices():
        console.print(f"{kind}: {text}", highlight=False, markup=False)


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


STATE_COLUMNS = ("job", "slurm", "restarts", "generation", "status", "health", "heartbeat")
SERVING_COLUMNS = ("endpoint", "T", *LOAD_COLUMNS)
# Never broken over lines (a URL, a name, a job id read in pieces is misread); the status wraps.
WHOLE = frozenset({"teacher", "job", "slurm", "generation", "endpoint", "T", *LOAD_COLUMNS})
UNLIMITED = 100_000  # a width no table reaches: a table measured against it is at its natural width


def _status_word(r: Any) -> str:
    """The status cell: the record's status and what comes of it (the reason goes below the table)."""
    status = r.status
    if (r.load or {}).get("stuck"):  # the watch fired: the record says ready until it fails the generation
        status = "[red]stuck[/red]"
    elif r.slow:
        status += " [yellow](slow)[/yellow]"
    if r.superseded:
        status += " [dim](earlier run; requeued)[/dim]"
    elif r.status == "failed" and r.restart:
        n, limit = r.restart.get("consecutive_failures"), r.restart.get("max_consecutive_failures")
        if not r.final:
            status += f" [yellow]retrying: {n}/{limit} failures[/yellow]"
        else:
            gave_up = n and limit and n >= limit  # else final for another reason (the record's reason says)
            status += f" [red]final after {n}/{limit} failures[/red]" if gave_up else " [red]final[/red]"
    if not r.in_plan:
        status += " [dim](not in the rendezvous)[/dim]"
    return status


def _cells(r: Any) -> dict[str, str]:
    """Every column's cell of one row."""
    load = r.load or {}
    out = load.get("bytes_out_per_s_1m")
    figures = (f"{load['tokens_per_s_1m']:.0f}", "-" if out is None else bytes_per_s(out),
               f"{load['queue_depth']:.0f}", f"{load['padding_share']:.1%}") if load else ("-",) * len(LOAD_COLUMNS)
    return {"teacher": r.display, "T": f"{r.temperature:g}", "job": r.job_id or "-", "slurm": r.slurm_state,
            "restarts": "-" if r.restarts is None else str(r.restarts), "generation": r.generation or "-",
            "status": _status_word(r), "endpoint": r.url or "-",
            "health": {True: "[green]ok[/green]", False: "[red]down[/red]", None: "-"}[r.health],
            "heartbeat": _age(r.heartbeat_age_s), **dict(zip(LOAD_COLUMNS, figures, strict=True))}


def _table(rows: list, title: str | None, columns: tuple[str, ...]) -> Table:
    table = compact_table(title)
    for col in ("teacher", *columns):
        table.add_column(col, no_wrap=col in WHOLE, overflow="fold",
                         justify="right" if col in LOAD_COLUMNS else "left")
    for r in rows:
        cells = _cells(r)
        table.add_row(*(cells[col] for col in ("teacher", *columns)))
    return table


class StatusView:
    """``podium status``'s screen: one table where the console is wide enough for each row on one
    line; else two (the jobs' state, then where each replica serves and its load), each narrow
    enough for 100 columns with a URL, a name and a job id unbroken. Below them, each teacher's aliases,
    each replica's OpenAI ``base_url`` (where it has an endpoint) and each replica's reason (a failure's
    cause, why it stopped), as lines that wrap at words."""

    def __init__(self, rows: list, title: str = "podium status") -> None:
        self.rows, self.title = rows, title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = _table(self.rows, self.title, (*STATE_COLUMNS[:-2], "endpoint", *STATE_COLUMNS[-2:], "T",
                                              *LOAD_COLUMNS))
        if Measurement.get(console, options.update_width(UNLIMITED), wide).maximum <= options.max_width:
            yield wide
        else:
            yield _table(self.rows, self.title, STATE_COLUMNS)
            yield _table(self.rows, None, SERVING_COLUMNS)
        for name, aliases in {r.name: r.aliases for r in self.rows}.items():
            yield Text.assemble((name, "bold"), f" serves: {', '.join(aliases)}")
        for r in self.rows:  # what an OpenAI client (vLLM's scoring calls) is given
            if r.base_url:
                yield Text.assemble((r.display, "bold"), f" OpenAI base_url: {r.base_url}")
        for r in self.rows:
            if r.reason and r.status in ("failed", "stopped", "draining"):
                yield Text(f"{r.display}: {r.status}: {r.reason}")
        for r in self.rows:
            if r.slow:
                yield Text(f"{r.display}: {r.slow}")
        for r in self.rows:
            line = _liveness_line(r.load or {})
            if line:
                yield Text(f"{r.display}: {line}")


def _liveness_line(load: dict) -> str | None:
    """What a serving replica's watch says (its /metrics): the oldest request's age, the slowest
    rank of the last call; None before any call."""
    if load.get("slowest_rank", -1) < 0 and not load.get("oldest_request_s"):
        return None
    parts = [f"oldest request {load.get('oldest_request_s', 0.0):.0f}s"]
    if load.get("slowest_rank", -1) >= 0:
        parts.append(f"slowest rank {load['slowest_rank']:.0f} ({load['slowest_rank_s']:.2f}s in the last call)")
    return ", ".join(parts)


def status_table(rows: list, title: str = "podium status") -> StatusView:
    """What ``podium status`` prints for ``rows`` (:class:`StatusView`)."""
    return StatusView(rows, title)


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
                    # one line each, never cut at the console's width: a script's log is read by grep
                    self.console.print(f"[{elapsed:6.1f}s] {r.display}: {r.phase}"
                                       + (f" (job {r.job_id}{gen})" if r.job_id else ""), highlight=False,
                                       soft_wrap=True)
                    if r.status == "failed" and r.final is False and r.reason and not r.superseded:
                        # why it failed, as the record says (a retry's line alone does not; a
                        # failure for good is said once, in up's error)
                        self.console.print(f"{'':9}why: {r.reason}", highlight=False, markup=False, soft_wrap=True)
        if self._live is not None:
            table = Table(title=f"waiting for teachers ({elapsed:.0f}s)", title_justify="left")
            for col in ("teacher", "job", "generation", "phase", "since"):
                table.add_column(col)
            for r in rows:
                table.add_row(r.display, r.job_id or "-", r.generation or "-", r.phase,
                              f"{elapsed - self._since.get(r.display, 0):.0f}s")
            self._live.update(table)


def print_fronts(run_dir: Path) -> None:
    """The run's fronts (``podium front``), one line each, under the teachers' table."""
    from podium.rendezvous.fronts import FrontRecord, read_fronts
    from podium.rendezvous.layout import RunLayout

    for found in read_fronts(RunLayout(run_dir)):
        if not isinstance(found, FrontRecord):
            print(f"front: {found}")
            continue
        alive = found.alive_here()
        state = "" if alive is None else " (running)" if alive else " (its process is gone: a stale file)"
        aliases = ", ".join(f"{a} {u}" for a, u in found.aliases.items())
        auth = "" if found.auth else ", no auth"
        print(f"front: {found.url} pid {found.pid} on {found.host}{state}{auth}: {aliases}")
