"""Under CI=true a skip fails the run, at collection too (``fixtures.ci_rules``); locally it is a skip.

Each case runs a child pytest on a few files in a tmp dir whose conftest loads the very plugin the
suite uses (``fixtures.ci_rules``), once with ``CI=true`` and once without ``CI``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent  # where the ``fixtures`` package lives

MODULE_SKIP = """
import pytest

pytest.skip("no frobnicator on this machine", allow_module_level=True)


def test_never_collected():
    pass
"""

IMPORTORSKIP = """
import pytest

pytest.importorskip("podium_no_such_module_for_ci_rules")


def test_never_collected():
    pass
"""

SKIPS_WHILE_RUNNING = """
import pytest


@pytest.fixture
def service():
    pytest.skip("the service is not running")


def test_skips_in_its_body():
    pytest.skip("skipped inside the test")


def test_skips_in_a_fixture(service):
    pass


@pytest.mark.skip(reason="marked skip")
def test_marked_skip():
    pass


@pytest.mark.xfail(reason="a known bug", strict=True)
def test_expected_failure():
    assert False


def test_passes():
    pass
"""


def run_pytest(tmp_path: Path, files: dict[str, str], *, ci: bool,
               args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -ra -p no:cacheprovider\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["fixtures.ci_rules"]\n')
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", *args, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize(("source", "reason"), [
    (MODULE_SKIP, "no frobnicator on this machine"),
    (IMPORTORSKIP, "could not import 'podium_no_such_module_for_ci_rules'"),
], ids=["module-level-skip", "importorskip"])
def test_a_skip_at_collection_fails_under_ci(tmp_path: Path, source: str, reason: str) -> None:
    proc = run_pytest(tmp_path, {"test_mod.py": source, "test_other.py": "def test_ok():\n    pass\n"}, ci=True)
    text = output(proc)
    assert proc.returncode not in (0, 5), text
    assert "test_mod.py: skipped at collection under CI=true, which counts as a failure" in proc.stdout, text
    assert reason in proc.stdout, text
    assert "ERROR test_mod.py" in proc.stdout, text  # in the short summary too
    assert " skipped" not in proc.stdout.splitlines()[-1], text


@pytest.mark.parametrize("source", [MODULE_SKIP, IMPORTORSKIP], ids=["module-level-skip", "importorskip"])
def test_a_skip_at_collection_is_a_plain_skip_outside_ci(tmp_path: Path, source: str) -> None:
    proc = run_pytest(tmp_path, {"test_mod.py": source, "test_other.py": "def test_ok():\n    pass\n"}, ci=False)
    text = output(proc)
    assert proc.returncode == 0, text
    assert "1 passed, 1 skipped" in proc.stdout.splitlines()[-1], text
    assert "counts as a failure" not in proc.stdout, text


def test_a_skip_while_a_test_runs_fails_under_ci_and_xfail_stays_xfail(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, {"test_run.py": SKIPS_WHILE_RUNNING}, ci=True)
    text = output(proc)
    assert proc.returncode == 1, text
    for reason in ("skipped inside the test", "the service is not running", "marked skip"):
        assert f"skipped under CI=true, which counts as a failure: Skipped: {reason}" in proc.stdout \
            or f"skipped under CI=true, which counts as a failure: {reason}" in proc.stdout, (reason, text)
    # a skip in the test's body fails the test; one in setup (a fixture, a skip marker) is an error
    summary = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    assert any(line.startswith("FAILED test_run.py::test_skips_in_its_body") for line in summary), text
    for name in ("test_skips_in_a_fixture", "test_marked_skip"):
        assert any(line.startswith(f"ERROR test_run.py::{name}") for line in summary), (name, text)
    last = proc.stdout.splitlines()[-1]
    assert "1 failed" in last and "2 errors" in last and "1 passed" in last and "1 xfailed" in last, text
    assert "skipped" not in last, text


def test_a_skip_while_a_test_runs_is_a_plain_skip_outside_ci(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, {"test_run.py": SKIPS_WHILE_RUNNING}, ci=False)
    text = output(proc)
    assert proc.returncode == 0, text
    last = proc.stdout.splitlines()[-1]
    assert "1 passed" in last and "3 skipped" in last and "1 xfailed" in last, text
    assert "failed" not in last.replace("xfailed", ""), text


# CI runs the suite on pytest-xdist workers (.ci/run, fixtures.load_groups): there the skips happen in
# a worker and the controller reports them; they must fail the run just the same.
XDIST = ("-p", "xdist", "-n", "2")


def test_under_xdist_a_skip_while_a_test_runs_still_fails_under_ci(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, {"test_run.py": SKIPS_WHILE_RUNNING}, ci=True, args=XDIST)
    text = output(proc)
    assert proc.returncode == 1, text
    last = proc.stdout.splitlines()[-1]
    assert "1 failed" in last and "2 errors" in last and "1 passed" in last and "1 xfailed" in last, text
    assert "skipped" not in last and "counts as a failure" in proc.stdout, text


def test_under_xdist_a_skip_at_collection_still_fails_under_ci(tmp_path: Path) -> None:
    proc = run_pytest(tmp_path, {"test_mod.py": MODULE_SKIP, "test_other.py": "def test_ok():\n    pass\n"}, ci=True,
                      args=XDIST)
    text = output(proc)
    assert proc.returncode not in (0, 5), text
    assert "test_mod.py: skipped at collection under CI=true, which counts as a failure" in proc.stdout, text
    assert " skipped" not in proc.stdout.splitlines()[-1], text
