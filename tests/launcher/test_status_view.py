"""``podium status``'s table shows each teacher's load from its endpoint's /metrics; the figures
themselves are what ``podium.teacher.endpoint.metrics.summary`` reads from a real registry."""

from __future__ import annotations

import time

import pytest
from rich.console import Console

from podium.cli_render import status_table
from podium.launcher.login.status import TeacherStatus
from podium.teacher.endpoint.metrics import EndpointMetrics, summary
from podium.teacher.seam import Liveness, RankLiveness


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


def test_the_watch_of_a_group_reaches_status_through_metrics():
    """What a group's watch knows (the oldest request's age, each rank's part of the last call,
    whether it found a call stuck) is read from /metrics, shown below the table, and a replica
    whose watch fired reads ``stuck`` though its record still says ready."""
    now = time.time()
    ranks = (RankLiveness(0, "10.0.0.1, pid 11", now - 4.0, 0.41), RankLiveness(1, "10.0.0.2, pid 22", now - 4.2, 2.5),
             RankLiveness(2, "10.0.0.3, pid 33"))
    live = Liveness(call_age_s=None, stuck=None, ranks=ranks)
    metrics = EndpointMetrics("t", queue_depth=lambda: 1, queued_rows=lambda: 1, liveness=lambda: live,
                              oldest_request_s=lambda: 12.3)
    figures = summary(metrics.render().decode())
    assert figures["oldest_request_s"] == pytest.approx(12.3) and figures["stuck"] == 0
    assert figures["slowest_rank"] == 1 and figures["slowest_rank_s"] == pytest.approx(2.5)
    row = TeacherStatus(name="math", key="k" * 12, aliases=("math",), status="ready", health=True, load=figures)
    console = Console(width=250, record=True)
    console.print(status_table([row]))
    text = console.export_text()
    assert "math: oldest request 12s, slowest rank 1 (2.50s in the last call)" in text, text
    assert "stuck" not in text

    live = Liveness(call_age_s=40.0, stuck="teacher 'math': stuck call: no progress for 301 s", ranks=ranks)
    row.load = summary(metrics.render().decode())
    assert row.load["stuck"] == 1
    console = Console(width=250, record=True)
    console.print(status_table([row]))
    line = next(line for line in console.export_text().splitlines() if line.startswith("math "))
    assert " stuck " in line and " ready " not in line, line


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


ULTRA_ALIASES = ("math_with_judge_simple_agent", "equivalence_llm_judge_simple_agent", "mcqa_simple_agent",
                 "swe_pivot_single_step_tool_use_with_argument_comparison_agent")
URL = "http://10.120.33.141:20345"


@pytest.mark.parametrize("width", [100, 120])
def test_at_100_and_120_columns_no_url_name_or_alias_is_broken(width: int) -> None:
    """NeMo RL's Ultra names its general teacher ``math_with_judge_simple_agent``; at a terminal's
    usual width the status shows the endpoint URL, the teacher's name and each alias on one line
    each, and a failure's cause in full under the tables."""
    ready = TeacherStatus(name=ULTRA_ALIASES[0], key="d6c9ae644f19", aliases=ULTRA_ALIASES, job_id="4216489",
                          slurm_state="RUNNING", job_kind="running", restarts=0, generation="4216489:0",
                          status="ready", url=URL, health=True, heartbeat_age_s=2.0,
                          load={"tokens_per_s_1m": 1234.4, "bytes_out_per_s_1m": 310540.0, "queue_depth": 2.0,
                                "padding_share": 0.0612, "requests": 9.0, "errors": 0.0})
    cause = ("MissingPackagesError: node n1: /shared/me/venv/bin/python cannot import torch, megatron.core: install "
             "them into that Python (`pip install 'podium[teacher]'`)")
    failed = TeacherStatus(name="code", key="c" * 12, aliases=("code",), job_id="4216490", slurm_state="FAILED",
                           job_kind="done", status="failed", reason=cause, final=True, generation="4216490:0",
                           restart={"consecutive_failures": 1, "max_consecutive_failures": 3})
    console = Console(width=width, record=True)
    console.print(status_table([ready, failed]))
    text = console.export_text()
    print(text)  # what a user reads (shown with -rP)
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= width for line in lines)
    assert any(URL in line for line in lines), text
    for word in (*ULTRA_ALIASES, "4216489:0", "RUNNING", "310.5 kB"):
        assert any(word in line for line in lines), (word, text)
    assert sum(ULTRA_ALIASES[0] in line for line in lines) >= 3  # its rows (state, serving) and its aliases line
    assert "final" in text and "final after" not in text  # final at once: not a count of failures
    assert " ".join(text.split()).count(cause) == 1, text  # the cause in full, once, below the tables


def test_a_wide_console_shows_one_table_and_the_aliases_below_it() -> None:
    row = TeacherStatus(name="math", key="k" * 12, aliases=("math", "code"), status="ready", url=URL, health=True)
    console = Console(width=250, record=True)
    console.print(status_table([row]))
    lines = console.export_text().splitlines()
    (header,) = [line for line in lines if "teacher" in line]
    assert "endpoint" in header and "tok/s 1m" in header and "aliases" not in header
    assert "math serves: math, code" in lines


@pytest.mark.parametrize("width", [100, 250])
def test_each_serving_replica_shows_its_openai_base_url_below_the_tables_and_in_json(width: int) -> None:
    """What an OpenAI client is given (the endpoint's URL + protocol.names.OPENAI_BASE), per replica,
    whole on its line; none for a replica without an endpoint yet; ``base_url`` in ``--json``."""
    from podium.protocol.names import OPENAI_BASE

    first = TeacherStatus(name=ULTRA_ALIASES[0], key="k" * 12, aliases=ULTRA_ALIASES, status="ready", url=URL)
    second = TeacherStatus(name=ULTRA_ALIASES[0], key="k" * 12, aliases=ULTRA_ALIASES, replica=1, status="ready",
                           url="http://10.120.33.142:20346")
    pending = TeacherStatus(name="chat", key="c" * 12, aliases=("chat",))
    console = Console(width=width, record=True)
    console.print(status_table([first, second, pending]))
    lines = console.export_text().splitlines()
    assert f"{ULTRA_ALIASES[0]} OpenAI base_url: {URL}/v1" in lines, lines
    assert f"{ULTRA_ALIASES[0]}#1 OpenAI base_url: http://10.120.33.142:20346/v1" in lines, lines
    assert not any("chat OpenAI" in line for line in lines)
    assert first.to_dict()["base_url"] == URL + OPENAI_BASE and pending.to_dict()["base_url"] is None


def test_watch_is_a_flag_with_a_default_interval_and_still_takes_seconds() -> None:
    """The README's ``status RUN --watch`` (a flag) refreshes every 2 s; ``--watch 5`` every 5 s."""
    from podium.cli import WATCH_DEFAULT_S, with_watch_default

    assert WATCH_DEFAULT_S == 2
    assert with_watch_default(["status", "run", "--watch"]) == ["status", "run", "--watch", "2"]
    assert with_watch_default(["status", "--watch", "run"]) == ["status", "--watch", "2", "run"]
    assert with_watch_default(["status", "run", "--watch", "--json"]) == ["status", "run", "--watch", "2", "--json"]
    for kept in (["status", "run", "--watch", "5"], ["status", "run", "--watch=0.5"], ["status", "run"]):
        assert with_watch_default(kept) == kept


def test_up_wait_says_why_a_teacher_that_retries_failed_and_a_failure_for_good_once() -> None:
    """``up --wait`` from a script (plain lines): a generation that failed and is retried shows its
    cause on the line below its phase (the phase alone says only when it comes back); a failure for
    good does not (``up``'s error says it, once)."""
    from podium.cli_render import WaitView

    cause = "NodeStartError: node n2 (rank 1): `ray start` (pid 7) exited with 1: Exception: ...; log /run/x.log"
    retrying = TeacherStatus(name="math", key="m" * 12, aliases=("math",), job_id="16", slurm_state="RUNNING",
                             job_kind="running", restarts=0, generation="16:0", status="failed", reason=cause,
                             final=False, restart={"why": "failure 1 of at most 3 in a row: requeued after 30s"})
    for_good = TeacherStatus(name="chat", key="c" * 12, aliases=("chat",), job_id="17", slurm_state="FAILED",
                             job_kind="done", status="failed", reason="ValueError: bad checkpoint", final=True,
                             generation="17:0")
    console = Console(width=100, record=True, force_terminal=False)
    with WaitView(console) as view:
        view.update([retrying, for_good], 55.2)
        view.update([retrying, for_good], 56.0)  # unchanged: not said again
    lines = console.export_text().splitlines()
    print("\n".join(lines))  # what a script captures (shown with -rP)
    assert lines[0].startswith("[  55.2s] math: failed, retrying (failure 1 of at most 3")
    assert " ".join(lines[1].split()) == f"why: {cause}"
    assert lines[2].startswith("[  55.2s] chat: failed") and "why:" not in "\n".join(lines[2:])
    assert len([line for line in lines if "why:" in line]) == 1
