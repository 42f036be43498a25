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
