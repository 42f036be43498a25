"""Open file descriptors: every podium process that serves raises its limit to the hard one.

A teacher's endpoint holds a socket per connection; with the soft ``RLIMIT_NOFILE`` many sites
leave (1,024 or 4,096) a few thousand idle connections from anyone on the cluster would exhaust it
and the process could no longer accept, open a file or talk to Ray. The hard limit is what the
site allows a process; raising the soft one to it needs no privilege. The endpoint also caps its
connections below what is left (:func:`connection_budget`).
"""

from __future__ import annotations

import logging
import resource

logger = logging.getLogger(__name__)


def raise_nofile_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` of this process to its hard limit; return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return soft
    target = hard
    if hard == resource.RLIM_INFINITY:
        target = max(soft, 1 << 20)  # "unlimited" is refused as a soft value on Linux: a large number
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. above fs.nr_open: keep what we have
        logger.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
        return soft
    logger.debug("open-files limit raised from %d to %d", soft, target)
    return target


def connection_budget() -> int | None:
    """File descriptors this process may spend on connections: the soft limit less a reserve for
    everything else it opens (a quarter, at least 64); None where there is no limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - max(64, soft // 4))
