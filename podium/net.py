"""Ports and addresses: choosing a free port by binding it, and writing an address into a URL.

Nodes are shared with other jobs (on the test cluster every emulated node shares one port space),
so podium never trusts a port it has not bound. Two variants of the one rule, by what happens next:

- a port that *another process* will bind (Ray's ports, torch's ``MASTER_PORT``): the bind test is
  on all addresses (``host=""``), because those servers listen on all of them, and the socket is
  closed again (:func:`port_free`, :func:`find_free_port`);
- a port that *this process* serves on (the teacher's HTTP endpoint): the bind is the test and the
  socket is kept, so nobody can take the port in between (:func:`listen_on_free_port`).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import random
import socket

logger = logging.getLogger(__name__)

PortRange = tuple[int, int]


def family_of(host: str) -> socket.AddressFamily:
    """``AF_INET6`` for an IPv6 literal (``::1``, ``fe80::1%eth0``), else ``AF_INET``."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_free(port: int, host: str = "") -> bool:
    """True when TCP ``port`` binds on ``host`` (``""``: all IPv4 addresses of this node)."""
    with socket.socket(family_of(host), socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(port_range: PortRange | None = None, host: str = "", *, shuffle: bool = False) -> int:
    """A port of ``port_range`` that binds on ``host`` (in order, or shuffled so that concurrent
    callers spread); without a range, one the kernel picks. ``OSError`` when none is free."""
    if port_range is None:
        with socket.socket(family_of(host), socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    lo, hi = port_range
    candidates = list(range(lo, hi + 1))
    if shuffle:
        random.shuffle(candidates)
    for port in candidates:
        if port_free(port, host):
            return port
    raise OSError(errno.EADDRINUSE, f"no free port in {lo}-{hi} on {host or socket.gethostname()}")


def listen_on_free_port(host: str, port_range: PortRange, backlog: int = 128) -> socket.socket:
    """A non-blocking listening socket on the first port of ``port_range`` that binds on ``host``
    (``(0, 0)``: any free port). The bind itself is the test."""
    lo, hi = port_range
    tried: list[str] = []
    for port in range(lo, hi + 1):
        sock = socket.socket(family_of(host), socket.SOCK_STREAM)
        try:
            # Lets a restarted server reuse a port whose old connections sit in TIME_WAIT; a port
            # with a live listener still fails with EADDRINUSE on Linux.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
            sock.setblocking(False)
            if tried:
                logger.info("ports %s on %s busy, bound %d", ",".join(tried[:5]), host, sock.getsockname()[1])
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                tried.append(str(port))
                continue
            raise
    raise OSError(errno.EADDRINUSE, f"no free port on {host} in {lo}-{hi} ({len(tried)} tried)")


def url_host(host: str) -> str:
    """``host`` as it goes into a URL: IPv6 literals in brackets (``[::1]``), others unchanged."""
    try:
        is_v6 = ipaddress.ip_address(host.split("%", 1)[0]).version == 6
    except ValueError:
        is_v6 = False
    return f"[{host}]" if is_v6 else host


def http_url(host: str, port: int) -> str:
    return f"http://{url_host(host)}:{port}"


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"
