"""Waiting for a call's tasks on the group's ranks: the first failure at once, and the watch.

:func:`await_watched` is how the driver waits for one call (:meth:`TeacherWorkerGroup.compute`):
it raises a rank's exception as soon as it comes (the other ranks may be stuck in a collective the
failed one left), notes when each rank's task returns, asks the unfinished ranks where they are
(:meth:`TeacherWorker.progress`, in the workers' :data:`WATCH_GROUP`, a thread of their own beside
the call) and raises :class:`StuckForwardError` with the watch's verdict once the call is stuck
(:mod:`podium.teacher.compute.liveness` decides). :func:`workers_settled` says, after a failure,
whether the group is still whole; :func:`get_first_error` waits for setup's tasks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from podium.teacher.compute.liveness import CallWatch

logger = logging.getLogger(__name__)

WATCH_TICK_S = 0.5  # the driver looks at a call's tasks this often while it waits
WATCH_POLL_S = 1.0  # and asks its unfinished ranks where they are this often
WATCH_GROUP = "watch"  # the workers' concurrency group that answers the watch beside a call


class StuckForwardError(RuntimeError):
    """A call (or the warm-up forward) made no progress for longer than its allowance; the message
    names the ranks (:mod:`podium.teacher.compute.liveness`). The group is broken from then on."""


@dataclass(frozen=True)
class RankTask:
    """One rank's part of a call."""

    rank: int
    dp_rank: int
    is_output: bool
    future: Any  # the Ray object ref of its get_logprobs


def await_watched(tasks: Sequence[RankTask], watch: CallWatch, actors: Sequence[Any],
                  returned: Callable[[int, float], None]) -> list[Any]:
    """Every task's result, in order (see the module doc); ``returned(rank, seconds)`` as each
    rank's task returns."""
    import ray

    by_ref = {task.future: task for task in tasks}
    pending = list(by_ref)
    polls: dict[int, Any] = {}  # rank -> its unanswered question
    next_poll = watch.started + WATCH_POLL_S
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=WATCH_TICK_S)
        if done and pending:  # whatever else returned meanwhile
            more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
            done += more
        now = time.monotonic()
        for ref in done:
            watch.rank_finished(by_ref[ref].rank, now)
            returned(by_ref[ref].rank, now - watch.started)
        ray.get(done)  # raises a worker's exception (a RayTaskError subclassing the original)
        if pending and now >= next_poll:
            _poll(watch, actors, polls, [by_ref[ref].rank for ref in pending], now)
            next_poll = now + WATCH_POLL_S
        verdict = watch.stuck(now) if pending else None
        if verdict is not None:
            raise StuckForwardError(verdict)
    return ray.get([task.future for task in tasks])


def _poll(watch: CallWatch, actors: Sequence[Any], polls: dict[int, Any], ranks: Sequence[int], now: float) -> None:
    """The watch's answers that came since the last poll; a new question to each unfinished rank
    with none outstanding (a frozen rank keeps its one question unanswered)."""
    import ray

    if polls:
        ready, _ = ray.wait(list(polls.values()), num_returns=len(polls), timeout=0)
        answered = set(ready)
        for rank, ref in list(polls.items()):
            if ref in answered:
                del polls[rank]
                try:
                    watch.report(rank, ray.get(ref), now)
                except Exception as exc:  # a dead worker: its task's failure says so
                    logger.debug("watch: rank %d did not answer: %s", rank, exc)
    for rank in ranks:
        if rank not in polls:
            polls[rank] = actors[rank].progress.options(concurrency_group=WATCH_GROUP).remote()


def workers_settled(futures: list[Any], settle_s: float) -> bool:
    """After a call failed: whether the group is still whole, i.e. every worker of the call is alive
    and finished (with its answer or its own exception) within ``settle_s``. A call that raised on
    live workers that all came back failed alone (the next call starts afresh); a dead worker, or
    one still stuck (in a collective its peers left), means the group is broken."""
    import ray

    _, pending = ray.wait(futures, num_returns=len(futures), timeout=settle_s)
    if pending:
        return False
    for future in futures:
        try:
            ray.get(future)
        except ray.exceptions.RayActorError:
            return False
        except Exception:  # the task's own error, on a live worker
            pass
    return True


def get_first_error(futures: list[Any], timeout: float | None) -> list[Any]:
    """``ray.get`` all futures, but raise as soon as any one fails (others may be stuck in a collective)."""
    import ray

    pending = list(futures)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        wait_for = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = ray.wait(pending, num_returns=1, timeout=wait_for)
        if not done:
            raise TimeoutError(f"{len(pending)} teacher worker call(s) unfinished after {timeout}s")
        ray.get(done)  # raises the worker's exception (a RayTaskError subclassing the original)
    return ray.get(futures)
