"""Waiting in tests: :func:`wait_for`, a thin wrapper of :func:`podium.poll.poll_until`.

Unlike ``poll_until``, any falsy value (an empty list, 0) means "not yet", the rule the tests'
conditions are written for (``wait_for(lambda: urls, ...)``). A timeout raises
:class:`podium.poll.PollTimeout` naming ``what``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from podium.poll import PollTimeout, poll_until

POLL_S = 0.02  # how often a test's condition is asked
SLOW_POLL_S = 0.1  # the Slurm tests' conditions (they read records and run commands)

__all__ = ["POLL_S", "SLOW_POLL_S", "PollTimeout", "wait_for"]


def wait_for(condition: Callable[[], Any], what: str = "a condition", *, timeout_s: float = 30.0,
             interval_s: float = POLL_S) -> Any:
    """Ask ``condition`` every ``interval_s`` until it returns something truthy; return that."""
    return poll_until(lambda: condition() or None, timeout_s=timeout_s, interval_s=interval_s, what=what)
