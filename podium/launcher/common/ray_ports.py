"""A node's address and its block of Ray ports: what a teacher's node task binds, and what
``podium doctor`` checks on a node with the same functions (so it finds the same errors).

Nodes may be shared with other jobs and other Ray clusters (on the test cluster every emulated node
shares one port space), so every port Ray opens is chosen here and checked free by binding it.

Port block of one node (``BLOCK_SIZE`` consecutive ports taken from ``ray.port_range``):

======  ===========================  =========================================================
offset  port                         who binds it
======  ===========================  =========================================================
0       GCS (``--port``)             head only (reserved on workers too, keeps blocks uniform)
1       node manager                 raylet
2       object manager               raylet
3       metrics export               raylet / agent
4       dashboard agent gRPC         dashboard agent
5       dashboard agent listen       dashboard agent (node address and 127.0.0.1)
6       runtime env agent            runtime env agent
7       Ray client server            head only
8       dashboard                    head only (dashboard disabled; the port is given anyway)
9       torch rendezvous             the teacher group's ``MASTER_PORT`` (TCPStore, on the
                                     node's address), handed to the group as its only choice
10..    worker ports                 one per Ray worker process (``BLOCK_SIZE - 10`` of them)
======  ===========================  =========================================================

A ``ray.port_range`` below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, often
32768-60999) keeps outgoing connections from taking a port of a block between the check and the
bind.

The search starts at a block derived from (job id, restart) plus the node's rank, so two nodes of
one job on one machine start at different blocks and two jobs rarely meet; a block any of whose
ports does not bind is skipped.

Rarely is not never: two teachers of one user on one machine can hash to the same block and both
find it free at the same instant (1 chance in the range's blocks per pair; it failed ``podium demo``
twice in a row). A node task therefore **claims** its block (:func:`claim_ports`): an exclusive
``flock`` on ``<lock dir>/ray-ports-<base>.lock`` in the user's private temp root, held by the node
task until its teardown (the kernel drops it when the task dies, however it dies), and taken before
the ports are checked. Two tasks of one user never take one block. Another user's process can still
take a port between the check and Ray's bind (no lock of ours stops it): the node then starts Ray
again on another block (:func:`bind_failed` tells that death from others).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import socket
import subprocess
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from podium.net import port_free

logger = logging.getLogger(__name__)

BLOCK_SIZE = 48
LOCK_DIR_NAME = "ray-port-locks"  # in the user's private temp root (ray_bootstrap.private_temp_root)
# What Ray's daemons (the GCS, the raylet: one gRPC server code) and `ray start`'s own port check
# log when a port of the block was taken between our check and their bind.
BIND_FAILED_MARKS = ("Failed to start the grpc server", "Address already in use", "because it's already occupied")
NAMED_PORTS = ("gcs", "node_manager", "object_manager", "metrics_export", "dashboard_agent_grpc",
               "dashboard_agent_listen", "runtime_env_agent", "ray_client_server", "dashboard", "torch_master")


class RayStartError(RuntimeError):
    """Ray could not start on this node (no free ports, `ray start` died, GCS never answered)."""


@dataclass(frozen=True)
class RayPorts:
    base: int

    def __getattr__(self, name: str) -> int:
        if name in NAMED_PORTS:
            return self.base + NAMED_PORTS.index(name)
        raise AttributeError(name)

    @property
    def min_worker(self) -> int:
        return self.base + len(NAMED_PORTS)

    @property
    def max_worker(self) -> int:
        return self.base + BLOCK_SIZE - 1

    def to_dict(self) -> dict[str, int]:
        out = {name: self.base + i for i, name in enumerate(NAMED_PORTS)}
        out.update(min_worker=self.min_worker, max_worker=self.max_worker)
        return out


def node_ip(interface: str | None = None, hostname: str | None = None) -> str:
    """This node's address: the configured interface's IPv4, else ``getent hosts $(hostname)``."""
    if interface:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", interface],
                             capture_output=True, text=True)
        for line in out.stdout.splitlines():
            fields = line.split()
            if "inet" in fields:
                return fields[fields.index("inet") + 1].split("/")[0]
        raise RayStartError(f"interface {interface!r} has no IPv4 address on {socket.gethostname()}"
                            f" ({out.stderr.strip() or 'ip printed nothing'})")
    host = hostname or socket.gethostname()
    out = subprocess.run(["getent", "hosts", host], capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.split():
        return out.stdout.split()[0]
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise RayStartError(f"cannot resolve this node's hostname {host!r}: {exc}") from None


def _search_order(port_range: tuple[int, int], job_id: int | str, restart: int, rank: int) -> Iterator[int]:
    """The base port of every block of ``port_range``, from the job's and rank's start block on."""
    lo, hi = port_range
    blocks = (hi - lo + 1) // BLOCK_SIZE
    if blocks < 1:
        raise RayStartError(
            f"ray.port_range {lo}-{hi} holds {hi - lo + 1} ports < one node's block of {BLOCK_SIZE}"
        )
    digest = hashlib.sha256(f"{job_id}:{restart}".encode()).digest()
    start = (int.from_bytes(digest[:4], "big") + rank) % blocks
    for step in range(blocks):
        yield lo + ((start + step) % blocks) * BLOCK_SIZE


def _block_free(base: int) -> bool:
    return all(port_free(p) for p in range(base, base + BLOCK_SIZE))


def _no_block(port_range: tuple[int, int], what: str = "free") -> RayStartError:
    lo, hi = port_range
    return RayStartError(f"no {what} block of {BLOCK_SIZE} ports in ray.port_range {lo}-{hi} "
                         f"({(hi - lo + 1) // BLOCK_SIZE} blocks tried) on {socket.gethostname()}")


def choose_ports(port_range: tuple[int, int], job_id: int | str, restart: int, rank: int) -> RayPorts:
    """The first block whose every port binds, searching from the job's and rank's start block
    (claims nothing: what ``podium doctor`` checks; a node task uses :func:`claim_ports`)."""
    for base in _search_order(port_range, job_id, restart, rank):
        if _block_free(base):
            return RayPorts(base)
    raise _no_block(port_range)


@dataclass
class PortClaim:
    """A block of ports this process holds (its lock file's ``flock``) until :meth:`release`."""

    ports: RayPorts
    lock_dir: Path
    lock_path: Path | None  # None: the lock dir takes no locks (the block is only checked free)
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        """Let the block go (harmless when repeated); the lock file stays, for the next claimant."""
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


NO_LOCKS = -1  # what _try_lock returns where the filesystem takes no locks


def _try_lock(path: Path) -> int | None:
    """An fd holding ``path``'s exclusive flock; None when another process holds it;
    :data:`NO_LOCKS` when the filesystem takes none (some shared ones: blocks are only checked free)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        logger.warning("cannot lock %s (%s): Ray's port blocks are only checked free", path, exc)
        return NO_LOCKS


def claim_ports(port_range: tuple[int, int], job_id: int | str, restart: int, rank: int, lock_dir: Path,
                skip: Collection[int] = ()) -> PortClaim:
    """The first block of the search (:func:`choose_ports`'s order) not in ``skip`` (base ports of
    blocks that failed to bind) whose lock this process gets and whose every port binds, claimed.
    ``lock_dir`` is this user's (private); the lock is taken before the ports are checked."""
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for base in _search_order(port_range, job_id, restart, rank):
        if base in skip:
            continue
        path = lock_dir / f"ray-ports-{base}.lock"
        fd = _try_lock(path)
        if fd is None:  # another of this user's node tasks holds it
            continue
        held = fd if fd != NO_LOCKS else None
        if _block_free(base):
            return PortClaim(RayPorts(base), lock_dir, path if held is not None else None, held)
        if held is not None:
            os.close(held)
    raise _no_block(port_range, "free, unclaimed")


def bind_failed(log_text: str) -> bool:
    """Whether a Ray log says one of its ports was taken (:data:`BIND_FAILED_MARKS`)."""
    return any(mark in log_text for mark in BIND_FAILED_MARKS)
