"""``podium status``'s table shows each teacher's load from its endpoint's /metrics; the figures
themselves are what ``podium.teacher.endpoint.metrics.summary`` reads from a real registry."""

from __future__ import annotations

from rich.console import Console

from podium.cli_render import status_table
from podium.launcher.login.status import TeacherStatus
from podium.teacher.endpoint.metrics import EndpointMetrics, summary


def test_summary_reads_the_figures_of_a_registry():
    metrics = EndpointMetrics("t", queue_depth=lambda: 3, queued_rows=lambda: 7)
    metrics.answered(200)
    metrics.answered(503)
    metrics.served(rows=2, tokens=90)
    metrics.batch(seconds=0.1, tokens=90, computed_tokens=100, microbatches=2, waits=[0.01])
    metrics.failed("group")
    figures = summary(metrics.render().decode())
    assert figures["requests"] == 2 and figures["errors"] == 1 and figures["queue_depth"] == 3
    assert abs(figures["padding_share"] - 0.1) < 1e-9
    assert abs(figures["tokens_per_s_1m"] - 90 / 60) < 1e-9


def test_the_status_table_shows_the_load_or_dashes():
    busy = TeacherStatus(name="math", key="k" * 12, aliases=("math",), status="ready", health=True,
                         load={"tokens_per_s_1m": 1234.4, "queue_depth": 2.0, "padding_share": 0.0612,
                               "requests": 9.0, "errors": 0.0})
    idle = TeacherStatus(name="chat", key="c" * 12, aliases=("chat",))
    console = Console(width=250, record=True)
    console.print(status_table([busy, idle]))
    text = console.export_text()
    assert "tok/s 1m" in text and "queue" in text and "padding" in text
    math_line = next(line for line in text.splitlines() if "math" in line)
    assert "1234" in math_line and "6.1%" in math_line
    chat_line = next(line for line in text.splitlines() if "chat" in line)
    assert chat_line.rstrip(" │").endswith("-")


def test_status_of_a_run_dir_that_does_not_exist_names_its_rendezvous_file(tmp_path):
    """A typo'd run dir is an error naming <run dir>/rendezvous.json (not a file beside it), with
    --watch too (no traceback)."""
    from typer.testing import CliRunner

    from podium.cli import app

    missing = tmp_path / "nope"
    for args in (["status", str(missing)], ["status", str(missing), "--watch", "1"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert f"{missing}/rendezvous.json: missing" in result.output and "Traceback" not in result.output
