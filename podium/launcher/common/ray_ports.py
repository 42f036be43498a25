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
"""

from __future__ import annotations

import hashlib
import socket
import subprocess
from dataclasses import dataclass

from podium.net import port_free

BLOCK_SIZE = 48
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


def choose_ports(port_range: tuple[int, int], job_id: int | str, restart: int, rank: int) -> RayPorts:
    """The first block whose every port binds, searching from the job's and rank's start block."""
    lo, hi = port_range
    blocks = (hi - lo + 1) // BLOCK_SIZE
    if blocks < 1:
        raise RayStartError(
            f"ray.port_range {lo}-{hi} holds {hi - lo + 1} ports < one node's block of {BLOCK_SIZE}"
        )
    digest = hashlib.sha256(f"{job_id}:{restart}".encode()).digest()
    start = (int.from_bytes(digest[:4], "big") + rank) % blocks
    for step in range(blocks):
        base = lo + ((start + step) % blocks) * BLOCK_SIZE
        if all(port_free(p) for p in range(base, base + BLOCK_SIZE)):
            return RayPorts(base)
    raise RayStartError(f"no free block of {BLOCK_SIZE} ports in ray.port_range {lo}-{hi} "
                        f"({blocks} blocks tried) on {socket.gethostname()}")
