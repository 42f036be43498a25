"""The node tasks' files (``<rank>.json``, ``head.json``) through their models, and ``PODIUM_FAULTS``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from podium.faults import Faults, faults, parse_faults
from podium.launcher.common.cleanup import node_records
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.node_files import (
    DONE_STATES,
    HeadFile,
    NodeState,
    NodeStateWriter,
    NodeStatus,
    try_read_head,
    try_read_node_state,
    write_head,
)
from podium.rendezvous.atomic import NEWER, FileReadError, file_mode


def test_a_node_state_is_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "nodes" / "7-0" / "1.json"
    writer = NodeStateWriter(path, rank=1, host="n2", generation="7:0")
    writer.write(NodeStatus.STARTING, ip="127.0.0.12", temp="/tmp/podium-7-0-1")
    writer.write(NodeStatus.RAY_STARTING, ray={"pid": 123, "start": 456})
    state = writer.write(NodeStatus.FAILED, error="node n2 (rank 1) failed: boom")
    assert file_mode(path) == 0o600
    raw = json.loads(path.read_text())
    assert raw["state"] == "failed" and raw["pid"] == os.getpid() and raw["schema_version"] == NodeState.SCHEMA_VERSION
    assert raw["ray"] == {"pid": 123, "start": 456} and raw["ip"] == "127.0.0.12"  # earlier fields kept
    assert try_read_node_state(path) == state and state.done and writer.error == state.error
    assert state.temp_dir == Path("/tmp/podium-7-0-1") and state.ray is not None and state.ray.ref.pid == 123


def test_one_done_set() -> None:
    assert {NodeStatus.STOPPED, NodeStatus.ENDED, NodeStatus.FAILED} == DONE_STATES
    assert not any(NodeState(state=s, rank=1, host="n").done
                   for s in ("starting", "ray_starting", "started", "serving"))


def test_a_file_without_a_version_reads_as_before_and_a_damaged_one_as_not_there(tmp_path: Path) -> None:
    old = tmp_path / "0.json"
    old.write_text(json.dumps({"state": "ended", "rank": 0, "host": "n1", "pid": 1, "temp": "/tmp/x"}))
    assert try_read_node_state(old).state is NodeStatus.ENDED
    damaged = tmp_path / "1.json"
    damaged.write_text('{"state": "ended", "ra')
    assert try_read_node_state(damaged) is None and try_read_node_state(tmp_path / "missing.json") is None


def test_a_newer_schema_is_an_error_naming_the_file_and_versions(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path / "run" / "teachers" / "solo-0123abcd")
    path = files.node(7, 0, 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 99, "state": "shiny", "rank": 0, "host": "n1"}))
    with pytest.raises(FileReadError) as err:
        try_read_node_state(path)
    assert err.value.kind == NEWER and str(path) in str(err.value) and "schema 99 > 1" in str(err.value)
    with pytest.raises(FileReadError, match="schema 99"):
        list(node_records(files))  # the sweep does not guess at what a newer podium wrote
    head = files.head(7, 0)
    head.write_text(json.dumps({"schema_version": 2, "address": "a:1"}))
    with pytest.raises(FileReadError, match="a Ray head file written by a newer podium"):
        try_read_head(head)


def test_the_head_file(tmp_path: Path) -> None:
    path = tmp_path / "head.json"
    head = HeadFile(address="127.0.0.11:20000", generation="7:0", host="n1", ports={"gcs": 20000},
                    token_path="/run/ray_token", time=1.0)
    write_head(path, head)
    assert file_mode(path) == 0o600 and try_read_head(path) == head


def test_podium_faults_one_setting() -> None:
    assert faults({}) == Faults()
    assert faults({"PODIUM_FAULTS": "fail_node_rank=1, delay_start_s=5"}) == Faults(fail_node_rank=1, delay_start_s=5)
    assert parse_faults("exit_after_submit").exit_after_submit is True
    assert parse_faults("ray_start_args=--object-store-memory=1048576").ray_start_words() == [
        "--object-store-memory=1048576"]
    assert parse_faults('{"ray_start_args": "--a=1,2 --b"}').ray_start_words() == ["--a=1,2", "--b"]
    assert parse_faults("fail_node_rank=1").injected("fail_node_rank") == "PODIUM_FAULTS fail_node_rank=1"
    slow = parse_faults("slow_ray_agent_rank=1")
    assert slow.ray_start_env(0, 1) == {} and slow.ray_start_env(1, 2) == {} and Faults().ray_start_env(1, 1) == {}
    env = slow.ray_start_env(1, 1)  # that rank's first try only: its agent held back by the sitecustomize
    site = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(site) / "sitecustomize.py").is_file() and float(env["PODIUM_FAULT_AGENT_DELAY_S"]) > 15
    with pytest.raises(ValueError, match=r"PODIUM_FAULTS='fail_rank=1': fail_rank: .*keys: exit_after_submit"):
        parse_faults("fail_rank=1")
