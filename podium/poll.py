"""Polling: the one loop that asks "is it there yet?" until a deadline.

Owns :func:`poll_until` and :class:`PollTimeout`. Callers pass their interval as a named setting or
constant (never a literal at the call site), and say ``what`` they wait for, so a timeout names it.
Standard library only: the trainer's client, the login-side launcher and the node side all use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PollTimeout(TimeoutError):
    """The condition did not hold within the timeout; ``what`` says what was waited for."""

    def __init__(self, what: str, timeout_s: float) -> None:
        super().__init__(f"timed out after {timeout_s:g}s waiting for {what}")
        self.what = what
        self.timeout_s = timeout_s


def poll_until(
    condition: Callable[[], T | bool | None],
    *,
    timeout_s: float,
    interval_s: float,
    what: str,
    max_interval_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``condition`` until it returns something other than ``None`` or ``False``; return that.

    ``condition`` is called at once, then every ``interval_s`` seconds; with ``max_interval_s`` the
    interval doubles after each miss up to that bound (backoff). The last sleep is cut short at the
    deadline and ``condition`` is asked once more there, so it is always asked at least once and
    never waited for past ``timeout_s`` (a slow ``condition`` itself may overrun it). An exception
    from ``condition`` propagates (a caller's "failed for good" ends the wait at once). Raises
    :class:`PollTimeout` naming ``what`` when the deadline passes. Note that ``0``, ``""`` and
    empty containers are results, returned as such: only ``None`` and ``False`` mean "not yet".
    """
    if interval_s <= 0:
        raise ValueError(f"poll_until({what}): interval_s={interval_s} must be > 0")
    if max_interval_s is not None and max_interval_s < interval_s:
        raise ValueError(f"poll_until({what}): max_interval_s={max_interval_s} < interval_s={interval_s}")
    deadline = clock() + max(timeout_s, 0.0)
    interval = interval_s
    while True:
        result = condition()
        if result is not None and result is not False:
            return result  # type: ignore[return-value]  # None and False are excluded above
        left = deadline - clock()
        if left <= 0:
            raise PollTimeout(what, timeout_s)
        sleep(min(interval, left))
        if max_interval_s is not None:
            interval = min(interval * 2, max_interval_s)
