"""The logic of ``podium logs`` (the CLI only prints): where a teacher's node tasks write."""

from __future__ import annotations

from pathlib import Path

from podium.launcher.backends import scheduler_for
from podium.launcher.common.jobs import JobRecord
from podium.launcher.login.selection import resolve


def log_paths(run_dir: Path, teacher: str, node: int | None = None) -> list[Path]:
    """The logs of a teacher's current job's node tasks (one node, or all): the first replica
    ``teacher`` names (:mod:`podium.launcher.login.selection`; a teacher's name: its replica 0)."""
    spec, files = resolve(run_dir, [teacher])[0]
    rec = JobRecord.of(files, spec.launcher.cluster)
    if rec is None:
        raise FileNotFoundError(f"teacher {teacher!r}: no job submitted yet ({files.job} missing)")
    ranks = [node] if node is not None else list(range(spec.num_nodes))
    return scheduler_for(rec.cluster).log_paths(files, rec.job_id, ranks)
