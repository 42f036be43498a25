"""A node's block of Ray ports (:mod:`podium.launcher.common.ray_ports`): claimed by one node task
at a time, whatever the (job id, restart) hash says, and a ``ray start`` whose port another process
took is told from other deaths. The node's retry on another block, for real: the shared two-teacher
Slurm run (``tests/integration/test_launcher_slurm.py``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from harness.recipes import RAY_PORT_RANGE

from podium.launcher.common.ray_ports import BLOCK_SIZE, bind_failed, choose_ports, claim_ports
from podium.launcher.job import ray_bootstrap


def test_two_node_tasks_of_one_user_never_claim_one_block(tmp_path: Path) -> None:
    """Two teachers whose (job id, restart) hash to the same block (here: the same ids) get two
    blocks; a released block is claimed again; a skipped one is not."""
    locks = tmp_path / "locks"
    first = claim_ports(RAY_PORT_RANGE, 4224818, 0, 0, locks)
    second = claim_ports(RAY_PORT_RANGE, 4224818, 0, 0, locks)
    assert first.ports.base != second.ports.base
    assert first.lock_path is not None and first.lock_path.parent == locks
    assert (locks.stat().st_mode & 0o777) == 0o700
    first.release()
    first.release()  # harmless when repeated
    again = claim_ports(RAY_PORT_RANGE, 4224818, 0, 0, locks)
    assert again.ports.base == first.ports.base
    other = claim_ports(RAY_PORT_RANGE, 4224818, 0, 0, locks, skip={first.ports.base, second.ports.base})
    assert other.ports.base not in (first.ports.base, second.ports.base)
    for claim in (second, again, other):
        claim.release()


def test_a_claim_is_held_by_its_process_until_it_ends(tmp_path: Path) -> None:
    """Another process (another node task) sees the block as claimed while the claimant lives; the
    kernel drops the claim when it dies, however it dies."""
    locks = tmp_path / "locks"
    code = ("import sys, time; from pathlib import Path; from podium.launcher.common.ray_ports import claim_ports; "
            f"c = claim_ports({RAY_PORT_RANGE}, 7, 0, 0, Path({str(locks)!r})); print(c.ports.base, flush=True); "
            "time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        held = int(child.stdout.readline())
        mine = claim_ports(RAY_PORT_RANGE, 7, 0, 0, locks)
        assert mine.ports.base != held
        mine.release()
    finally:
        child.kill()
        child.wait()
    assert claim_ports(RAY_PORT_RANGE, 7, 0, 0, locks).ports.base == held


def test_a_block_with_a_taken_port_is_skipped(tmp_path: Path) -> None:
    base = choose_ports(RAY_PORT_RANGE, 99, 0, 0).base
    with socket.socket() as taken:
        taken.bind(("", base + BLOCK_SIZE - 1))
        assert choose_ports(RAY_PORT_RANGE, 99, 0, 0).base != base
        assert claim_ports(RAY_PORT_RANGE, 99, 0, 0, tmp_path / "locks").ports.base != base


def test_a_ray_start_whose_port_was_taken_says_so(tmp_path: Path) -> None:
    """A real ``ray start`` whose raylet cannot bind its node-manager port (another process took it
    after the block was checked) is told from other deaths: the node tries another block."""
    claim = claim_ports(RAY_PORT_RANGE, 5, 0, 0, tmp_path / "locks")
    short = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    temp = ray_bootstrap.temp_dir(ray_bootstrap.private_temp_root(short), 5, 0, 0)
    cmd = ray_bootstrap.start_command(head=True, ip="127.0.0.1", ports=claim.ports, temp=temp, num_cpus=1,
                                      object_store_memory_mb=100)
    token = ray_bootstrap.write_auth_token(tmp_path / "ray_token")
    with socket.socket() as taken:
        taken.bind(("", claim.ports.node_manager))
        taken.listen(1)
        proc = ray_bootstrap.RayNodeProcess(cmd, tmp_path / "ray-start.log", token_path=token, temp=temp)
        try:
            with pytest.raises(ray_bootstrap.RayStartError, match="a port of its block was taken") as failed:
                proc.wait_started(120)  # told by the raylet's log, before `ray start`'s own 30 s
            print(failed.value)
            assert proc.ports_taken() and proc.alive()
        finally:
            assert proc.stop() == []
            shutil.rmtree(short, ignore_errors=True)
    claim.release()


def test_bind_failures_are_told_by_rays_own_words() -> None:
    assert bind_failed("[2026-12-08 gcs_server.cc:80] Failed to start the grpc server. The specified port is 24048")
    assert bind_failed("ValueError: Failed to bind to 0.0.0.0:24056 because it's already occupied.")
    assert not bind_failed("Exception: The current node timed out during startup.")
