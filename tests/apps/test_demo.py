"""The README's first command, ``podium demo``: a toy trainer against three local teachers, every
alias's answers checked, and everything brought down (no process of a teacher left)."""

from __future__ import annotations

from pathlib import Path

from harness.cli import podium_cli

from podium.launcher.common.cleanup import run_processes
from podium.launcher.login.run_dir import known_teachers


def test_demo_the_readme_first_command(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    demo = podium_cli("demo", "--keep", str(keep), "--timeout", "400", timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "all aliases match" in demo.stdout and "brought everything down" in demo.stdout
    for alias in ("math", "code", "chat"):
        assert f"│ {alias}" in demo.stdout  # one row per alias in the table
    # the demo's output is its own: no progress bars of the libraries it loads, no INFO log lines
    assert "Loading weights" not in demo.stderr and "%|" not in demo.stderr, demo.stderr[-3000:]
    assert not [line for line in demo.stderr.splitlines() if line.startswith("INFO ")], demo.stderr[-3000:]
    for _, files in known_teachers(keep / "run"):
        assert run_processes(files) == {}
