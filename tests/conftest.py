"""Shared test fixtures: one Slurm test cluster, one Ray test cluster, tiny checkpoints, NeMo RL recipes,
a machine without CUDA (on a GPU node too), the real teacher groups and tokenizers the client,
NeMo RL and endpoint tests share, an HF hub cache holding the hub ids the recipes name.

Each lives in its own module under tests/fixtures/ and is registered here as a pytest plugin.
Under CI (``CI=true``) a skip is a failure, at collection too (``fixtures.ci_rules``): a missing
service, module or file must turn CI red.
"""

from __future__ import annotations

pytest_plugins = [
    "fixtures.ci_rules",
    "fixtures.slurm_cluster",
    "fixtures.ray_cluster",
    "fixtures.checkpoints",
    "fixtures.recipes",
    "fixtures.devices",
    "fixtures.groups",
    "fixtures.tokenizers",
    "fixtures.hub_cache",
    "fixtures.load_groups",
]
