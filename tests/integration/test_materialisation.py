"""What ``podium render`` and ``podium up --dry-run`` print is byte for byte what ``podium up`` submits.

On the real Slurm test cluster: ``up`` submits a teacher held in the queue (``sbatch --hold``, so no
model is loaded); the script Slurm received (submitit keeps it as ``submitit/<job>_submission.sh``,
and ``scontrol write batch_script`` prints what slurmctld stored) equals the one ``render`` prints
and the one ``up --dry-run`` prints; a dry run writes and submits nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harness.cli import podium
from harness.recipes import write_recipe

pytestmark = pytest.mark.slurm


def test_dry_run_and_render_print_exactly_the_submitted_script(slurm_cluster, slurm_jobs, tiny_llama_checkpoint,
                                                              tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", {"math": (tiny_llama_checkpoint, 2)},
                          slurm={"extra_sbatch": {"hold": True}, "setup": ["echo 'setup ran'"]})
    run_dir = tmp_path / "run dir"  # a space: every path in the script must survive the shell
    dry = podium("up", str(recipe), "--run-dir", str(run_dir), "--dry-run")
    assert not run_dir.exists() and "submitted job" not in dry.stdout
    assert "what `podium up` submits" in dry.stderr

    rendered = podium("render", str(recipe), "--teacher", "math", "--run-dir", str(run_dir)).stdout
    assert rendered == dry.stdout
    try:
        podium("up", str(recipe), "--run-dir", str(run_dir))
        (job_file,) = run_dir.glob("teachers/*/job.json")
        job_id = json.loads(job_file.read_text())["job_id"]
        slurm_jobs.append(job_id)
        kept = job_file.parent / "submitit" / f"{job_id}_submission.sh"
        assert kept.read_text() == rendered
        stored = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True,
                                text=True, check=True).stdout
        assert stored == rendered
        assert slurm_cluster.scontrol_job(job_id)["JobState"] == "PENDING"  # held: nothing ran
    finally:
        podium("down", str(run_dir), check=False)
