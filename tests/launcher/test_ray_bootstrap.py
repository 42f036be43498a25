"""Ray on one node (:mod:`podium.launcher.job.ray_bootstrap`): its temp dirs under a parent that is
this user's own. Ray started and stopped for real: ``tests/integration/``."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

from podium.launcher.job import ray_bootstrap


def test_ray_temp_dirs_live_under_a_private_parent(tmp_path: Path) -> None:
    """Ray's temp dirs live under a private parent of this user."""
    parent = ray_bootstrap.private_temp_root(str(tmp_path))
    temp = ray_bootstrap.temp_dir(parent, "12", 0, 1)
    info = parent.lstat()
    assert temp.parent == parent and parent.parent == tmp_path
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert ray_bootstrap.private_temp_root(str(tmp_path)) == parent  # the same one next time


def test_a_parent_someone_else_made_is_not_used(tmp_path: Path) -> None:
    taken = tmp_path / ray_bootstrap.private_temp_name()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    taken.symlink_to(elsewhere)  # a link planted where this user's parent goes
    parent = ray_bootstrap.private_temp_root(str(tmp_path))
    assert parent != taken and not parent.is_symlink() and stat.S_IMODE(parent.stat().st_mode) == 0o700
    if os.geteuid() == 0:  # as root (CI), a directory another user owns
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 12345, 12345)
        taken.unlink()
        other.rename(taken)
        parent = ray_bootstrap.private_temp_root(str(tmp_path))
        assert parent != taken and parent.stat().st_uid == os.getuid()


def test_the_jobs_ray_processes_use_the_jobs_token_never_an_inherited_one(tmp_path: Path) -> None:
    """A user's RAY_AUTH_TOKEN (for a Ray of their own) would win over the job's token file: the
    job's nodes and driver never inherit it."""
    token = tmp_path / "ray_token"
    base = {"RAY_AUTH_TOKEN": "0" * 64, "PATH": "/usr/bin"}
    env = ray_bootstrap.ray_env(base, token_path=token)
    assert "RAY_AUTH_TOKEN" not in env and env["RAY_AUTH_TOKEN_PATH"] == str(token)
    assert env["RAY_AUTH_MODE"] == "token" and env["PATH"] == "/usr/bin" and base["RAY_AUTH_TOKEN"] == "0" * 64
    environ = dict(base)
    ray_bootstrap.use_ray_env(environ, token_path=token)  # the head's driver: its own environment, in place
    assert environ == env
    assert ray_bootstrap.ray_env(base)["RAY_AUTH_TOKEN"] == "0" * 64  # no job token: nothing to protect


RAY_START_LOGS = Path(__file__).parent / "data" / "ray_start"


def _session_with_raylet_log(temp: Path, text: str) -> Path:
    """``temp`` laid out as Ray leaves a node's temp dir: its newest session's raylet log."""
    logs = temp / "session_2026-12-07_14-30-26_912_1" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text(text)
    (temp / "session_latest").symlink_to(logs.parent.name)
    return temp


def test_raylet_cause_names_the_agent_wait_or_the_fatal_line(tmp_path: Path) -> None:
    """What ``ray start`` hides when its raylet died (it only says the node did not register): from
    a raylet log captured on 2 cores at load 40 (the dashboard agent not up within the raylet's
    fixed 15 s), from another fatal line, and from a log with none."""
    captured = (RAY_START_LOGS / "node_start_timed_out.raylet.out").read_text()
    temp = _session_with_raylet_log(tmp_path / "agent", captured)
    assert ray_bootstrap.raylet_cause(temp) == (
        "its raylet gave up waiting for the node's dashboard agent (Ray's fixed 15 s: a starved or slow node)")
    other = ("[2026-12-07 14:31:14,900 I 1 1] (raylet) main.cc:283: Setting cluster ID\n"
             "[2026-12-07 14:31:14,918 C 1 1] (raylet) object_manager.cc:12: Check failed: plasma store died\n"
             "*** StackTrace Information ***\nray::ObjectManager::Start()\n")
    temp = _session_with_raylet_log(tmp_path / "other", other)
    assert ray_bootstrap.raylet_cause(temp) == "its raylet died: object_manager.cc:12: Check failed: plasma store died"
    assert ray_bootstrap.raylet_cause(temp, since=time.time() + 60) is None  # an earlier try's session
    temp = _session_with_raylet_log(tmp_path / "fine", captured.split(" C ")[0])
    assert ray_bootstrap.raylet_cause(temp) is None
    assert ray_bootstrap.raylet_cause(tmp_path / "no-session") is None


def test_a_missed_start_limit_is_told_from_other_deaths(tmp_path: Path) -> None:
    """A ``ray start`` that ended as Ray's start limits end it (its captured log) is worth another
    try, and says why in one line with its raylet's cause; one that died of anything else, or
    still runs, is not."""
    captured = (RAY_START_LOGS / "node_start_timed_out.log").read_text()
    raylet_log = (RAY_START_LOGS / "node_start_timed_out.raylet.out").read_text()

    def ended(text: str, name: str, code: int = 1) -> ray_bootstrap.RayNodeProcess:
        cmd = [sys.executable, "-c", f"import sys; sys.stdout.write({text!r}); sys.exit({code})"]
        proc = ray_bootstrap.RayNodeProcess(cmd, tmp_path / name, temp=tmp_path / f"{name}.temp")
        _session_with_raylet_log(tmp_path / f"{name}.temp", raylet_log)  # the session this try made
        proc.proc.wait(60)
        return proc

    timed_out = ended(captured, "timed_out.log")
    assert timed_out.missed_start_limit()
    line = timed_out.describe_exit()
    assert line.startswith(f"`ray start` (pid {timed_out.pid}) exited with 1: Exception: The current node timed out")
    assert "; its raylet gave up waiting for the node's dashboard agent" in line
    assert line.endswith(f"; log {tmp_path / 'timed_out.log'}") and "\n" not in line
    refused = ended("Error: Invalid value for '--num-gpus': 'x' is not a valid integer.\n", "refused.log", 2)
    assert not refused.missed_start_limit()
    running = ray_bootstrap.RayNodeProcess([sys.executable, "-c", f"print({captured!r}); import time; time.sleep(60)"],
                                           tmp_path / "running.log")
    try:
        assert not running.missed_start_limit()
    finally:
        running.stop()
