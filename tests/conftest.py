"""Shared test fixtures: one Slurm test cluster, one Ray test cluster, tiny checkpoints.

Each lives in its own module under tests/fixtures/ and is registered here as a pytest plugin.
"""

pytest_plugins = [
    "fixtures.slurm_cluster",
    "fixtures.ray_cluster",
    "fixtures.checkpoints",
]
