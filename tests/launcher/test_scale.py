"""``podium scale`` (:mod:`podium.launcher.login.scale`) with a fake Slurm; its refusals:
``tests/config/test_replicas_plan.py``; on the real cluster: ``tests/integration/test_replicas_slurm.py``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from harness.fake_backend import fake_slurm as fake_slurm_backend
from harness.recipes import two_teachers_on_slurm

from podium.config.plan import load_plan
from podium.launcher.login.scale import scale
from podium.launcher.login.up import up
from podium.rendezvous.manifest import read_rendezvous

# its recipes name hub ids (Qwen/...): `plan` and `up` find them in the HF cache this fixture makes
pytestmark = pytest.mark.usefixtures("hub_cache")


@pytest.fixture
def fake_slurm(monkeypatch):
    """A Slurm whose sbatch takes a while (so concurrent commands overlap) and that counts queries."""
    with fake_slurm_backend(monkeypatch, submit_delay_s=0.3) as fake:
        yield fake.jobs, fake.queries


def test_concurrent_scales_of_two_teachers_keep_both_edits(tmp_path: Path, fake_slurm) -> None:
    """Concurrent ``scale``s (and ``up``) keep each other's rendezvous edits."""
    run_dir = tmp_path / "run"
    up(load_plan(two_teachers_on_slurm(tmp_path)), run_dir)
    errors: list[BaseException] = []

    def scale_teacher(name: str) -> None:
        try:
            scale(run_dir, name, 2, wait_s=1)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=scale_teacher, args=(name,)) for name in ("math", "code")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    rdv = read_rendezvous(run_dir)
    listed = {entry.name: len(entry.replicas) for entry in rdv.teachers.values()}
    assert listed == {"math": 2, "code": 2}, listed
