"""Ray on one node (:mod:`podium.launcher.job.ray_bootstrap`): its temp dirs under a parent that is
this user's own. Ray started and stopped for real: ``tests/integration/``."""

from __future__ import annotations

import os
import stat
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
