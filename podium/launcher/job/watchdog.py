"""The head's watch over its whole job while it serves: a lost node or a broken group, found in seconds.

Every ``interval_s`` the :class:`Watchdog` thread checks, in order:

=================================  ==========================================================
check                              a fault when
=================================  ==========================================================
the head's own ``ray start``       it has exited
each node Ray counted at start     Ray marks it dead (found by its Ray node id) (its raylet is
                                   gone; the GCS health check is tuned to notice in about 3 s,
                                   :data:`podium.launcher.job.ray_bootstrap.RAY_ENV`)
each worker node task              its ``<rank>.json`` is done (``failed`` or ``ended``,
                                   :data:`~podium.launcher.common.node_files.DONE_STATES`) while the
                                   head still serves
the teacher group                  a call found a worker dead (``group.broken``) and, within
                                   :data:`CAUSE_WAIT_S`, no lost node explains it (a worker on
                                   a node that died fails its call before Ray marks the node
                                   dead: the node is the cause worth naming)
=================================  ==========================================================

The first fault found is handed to ``on_fault(reason, node)`` once (``node``: the host at fault,
when there is one) and the watch ends; the lifecycle turns readiness off, publishes ``failed``
naming the node and the restart policy decides what comes next.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.node_files import NodeState, try_read_node_state
from podium.teacher.seam import ServedGroup

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
CAUSE_WAIT_S = 8.0  # a broken group waits this long for Ray to name a lost node as its cause


@dataclass(frozen=True)
class WatchedNode:
    """One Ray node of the job, as Ray named it at start (``node_id``), with the task that runs
    it when known (``rank``, ``host``; Ray may advertise another address than the task recorded,
    e.g. a rewritten loopback address)."""

    node_id: str
    ip: str
    rank: int | None
    host: str

    def describe(self) -> str:
        rank = f"rank {self.rank}, " if self.rank is not None else ""
        return f"node {self.host} ({rank}{self.ip})"


Fault = tuple[str, str | None]  # (reason, host at fault)


class Watchdog:
    """Checks the job's nodes and group every ``interval_s`` until stopped or a fault is found."""

    def __init__(self, *, files: TeacherFiles, job_id: str, restart: int, nodes: list[WatchedNode],
                 group: ServedGroup, head_alive: Callable[[], str | None],
                 on_fault: Callable[[str, str | None], None], interval_s: float = WATCH_INTERVAL_S) -> None:
        self.files, self.job_id, self.restart = files, job_id, restart
        self.nodes = nodes
        self.group = group
        self.head_alive = head_alive  # None while the head's Ray runs, else why it does not
        self.on_fault = on_fault
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._broken_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="podium-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                fault = self.check()
            except Exception as exc:  # a check that cannot run is logged, not a fault
                logger.warning("watchdog check failed: %s: %s", type(exc).__name__, exc)
                continue
            if fault is not None and not self._stop.is_set():
                logger.error("fault: %s", fault[0])
                self.on_fault(*fault)
                return

    def check(self) -> Fault | None:
        """The first fault found now, or None."""
        head = self.head_alive()
        if head is not None:
            return f"head node: {head}", None
        fault = self._ray_nodes()
        if fault is not None:
            return fault
        for node in self.nodes:
            if node.rank in (None, 0):
                continue
            state = try_read_node_state(self.files.node(self.job_id, self.restart, node.rank))
            if state is not None and state.done:
                detail = state.error or state.stop or "no error recorded"
                return f"{node.describe()} task {state.state.value} while serving: {detail}", node.host
        broken = self.group.broken
        if broken:
            # The endpoint already answers 503 (the group says it is broken): waiting a few
            # seconds for the cause costs no request.
            now = time.monotonic()
            self._broken_since = self._broken_since or now
            if now - self._broken_since >= CAUSE_WAIT_S:
                return f"teacher group broken: {broken}", None
        return None

    def _ray_nodes(self) -> Fault | None:
        import ray

        by_id = {info.get("NodeID"): info for info in ray.nodes()}
        for node in self.nodes:
            info = by_id.get(node.node_id)
            if info is None or not info.get("Alive"):
                why = (info or {}).get("DeathReasonMessage") or "Ray marked it dead"
                return f"{node.describe()} lost: {why}", node.host
        return None


def watched_nodes(alive: list[dict], recorded: Sequence[NodeState], head_host: str) -> list[WatchedNode]:
    """The job's Ray nodes (``ray.nodes()`` entries alive at start) matched to the node tasks'
    states (``<rank>.json``: ``ip``, ``host``, ``rank``) by address; a node no state matches is
    the head's when it is the only one (``cluster: local``, where Ray rewrites 127.0.0.1)."""
    by_ip = {str(r.ip): (r.rank, r.host) for r in recorded}
    out = []
    for info in alive:
        ip = str(info.get("NodeManagerAddress"))
        rank, host = by_ip.get(ip, (None, ip))
        if ip not in by_ip and len(alive) == 1:
            rank, host = 0, head_host
        out.append(WatchedNode(str(info.get("NodeID")), ip, rank, host))
    return out
