"""A teacher named by a hub id loads, on every node, the snapshot its plan pinned
(``TeacherSpec.revision``), found by the planner's own rule (``podium.config.checkpoints``), even
after ``main`` moved to another snapshot in the HF cache; a pinned snapshot gone from the cache is
an error naming the id, the revision, the cache and the command that fetches it. The cache is a
real HF layout made here (``fixtures.hub_cache.write_snapshot``), never a download.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixtures.checkpoints import SEED, make_tiny_checkpoint
from fixtures.hub_cache import commit_of, write_snapshot

from podium.teacher.model.checkpoint_loader import describe_model, resolve_checkpoint

HUB_ID = "acme/tiny-llama"
PINNED, NEWER = commit_of(HUB_ID), commit_of(HUB_ID, 1)


@pytest.fixture
def moved_cache(tmp_path: Path, tiny_llama_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache where the tiny Llama was fetched (the plan pinned it), then ``main`` moved to other
    weights (another seed); ``HF_HUB_CACHE`` names it."""
    cache = tmp_path / "hub"
    write_snapshot(cache, HUB_ID, tiny_llama_checkpoint, commit=PINNED)
    write_snapshot(cache, HUB_ID, make_tiny_checkpoint("llama", tmp_path / "newer", seed=SEED + 1), commit=NEWER)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def snapshot(cache: Path, commit: str) -> Path:
    return cache / "models--acme--tiny-llama" / "snapshots" / commit


def test_the_loader_reads_the_pinned_snapshot_not_what_main_names_now(moved_cache: Path) -> None:
    pinned = resolve_checkpoint(HUB_ID, revision=PINNED)
    assert (pinned.kind, pinned.path, pinned.name) == ("hf", snapshot(moved_cache, PINNED), HUB_ID)
    assert pinned.config_path == snapshot(moved_cache, PINNED) / "config.json"
    assert describe_model(HUB_ID, revision=PINNED).num_layers == 4
    # without a pin (`podium convert acme/tiny-llama`), the commit refs/main names now
    assert resolve_checkpoint(HUB_ID).path == snapshot(moved_cache, NEWER)


def test_a_pinned_snapshot_gone_from_the_cache_names_the_id_the_revision_and_the_cache(moved_cache: Path) -> None:
    shutil.rmtree(snapshot(moved_cache, PINNED))
    with pytest.raises(ValueError, match="pinned when the teacher was planned") as err:
        resolve_checkpoint(HUB_ID, revision=PINNED)
    assert str(err.value) == (
        f"checkpoint {HUB_ID}: its snapshot {PINNED} (pinned when the teacher was planned) is not in the local HF "
        f"cache {moved_cache} (no models--acme--tiny-llama/snapshots/{PINNED}); podium does not download weights: "
        "fetch it into the cache the nodes read, on a login node with network access: "
        f"`HF_HUB_CACHE={moved_cache} hf download {HUB_ID} --revision {PINNED}`, or plan the teacher again "
        "(`podium up`) to pin the snapshot the cache has")


def test_a_local_path_that_does_not_exist_is_said_as_before(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"checkpoint {tmp_path}/nope: no such directory"):
        resolve_checkpoint(tmp_path / "nope")


@pytest.mark.ray
@pytest.mark.megatron
def test_a_group_started_from_a_hub_id_serves_the_pinned_weights(
        ray_cluster, moved_cache: Path, tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    """One real group: its workers (Ray actors, the cache named in their environment as a job's
    nodes have it) load the pinned snapshot: the answers are the pinned weights', not main's."""
    from fixtures.checkpoints import hf_oracle_logprobs
    from harness.teacher_groups import TOL, assert_matches_oracle, ragged_batch, shut_down_and_check, teacher_cfg

    from podium.teacher.compute.group import TeacherWorkerGroup

    group = TeacherWorkerGroup(teacher_cfg(HUB_ID, revision=PINNED), env_vars={"HF_HUB_CACHE": str(moved_cache)})
    try:
        assert group.spec.model_name == HUB_ID
        assert group.facts.checkpoint_path == str(snapshot(moved_cache, PINNED))  # its tokenizer is read there too
        batch = ragged_batch(256, width=20)
        served = assert_matches_oracle(group, tiny_llama_checkpoint, batch)["logprobs"]
        mains = hf_oracle_logprobs(tmp_path / "newer", batch["input_ids"], batch["input_lengths"])
        assert (served - mains).abs().max().item() > 100 * TOL  # main's weights would answer otherwise
    finally:
        shut_down_and_check(group)
