"""``podium wait`` (:func:`podium.launcher.login.status.wait`) with a fake Slurm: how often it asks."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from harness.fake_backend import fake_slurm as fake_slurm_backend
from harness.recipes import two_teachers_on_slurm

from podium.config.plan import load_plan
from podium.launcher.login import status
from podium.launcher.login.up import up

# its recipes name hub ids (Qwen/...): `plan` and `up` find them in the HF cache this fixture makes
pytestmark = pytest.mark.usefixtures("hub_cache")


@pytest.fixture
def fake_slurm(monkeypatch):
    """A Slurm whose sbatch takes a while (so concurrent commands overlap) and that counts queries."""
    with fake_slurm_backend(monkeypatch, submit_delay_s=0.3) as fake:
        yield fake.jobs, fake.queries


def test_wait_polls_slurm_with_backoff(tmp_path: Path, fake_slurm) -> None:
    """``wait`` asks Slurm every few seconds, the records in between."""
    _, queries = fake_slurm
    run_dir = tmp_path / "run"
    up(load_plan(two_teachers_on_slurm(tmp_path)), run_dir)
    queries.clear()
    t0 = time.monotonic()
    with pytest.raises(status.WaitFailed):
        status.wait(run_dir, timeout_s=6)
    gaps = [b - a for a, b in itertools.pairwise(queries)]
    assert len(queries) <= 5 and queries[0] - t0 < 1, (len(queries), gaps)
    assert all(g >= 1.5 for g in gaps), gaps
