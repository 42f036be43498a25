"""The doctor's rows for a person (a rich table with the fix under each failed row) and for
``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from podium.launcher.login.doctor.base import FAIL, PASS, SKIP, Check

MARKS = {PASS: "✔", FAIL: "✘", SKIP: "–"}
COLOURS = {PASS: "green", FAIL: "red", SKIP: "dim"}


def doctor_report(checks: Sequence[Check]) -> dict[str, Any]:
    """What ``--json`` prints."""
    return {"ok": all(c.ok for c in checks), "checks": [c.to_dict() for c in checks]}


def print_checks(checks: Sequence[Check], title: str) -> None:
    """The table: ✔/✘/– per row, what was seen, and the fix under a failed row's detail."""
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("what podium found (and the fix)", overflow="fold")
    for check in checks:
        text = escape(check.detail)
        if check.fix:
            text += f"\n[bold]fix:[/bold] {escape(check.fix)}"
        table.add_row(f"[{COLOURS[check.state]}]{MARKS[check.state]}[/]", check.name, text)
    console = Console()
    console.print(table)
    failed = [c for c in checks if c.state == FAIL]
    console.print(f"{len(failed)} check(s) failed" if failed else "all checks passed", highlight=False)
