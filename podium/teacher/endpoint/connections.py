"""The endpoint's connections: deadlines, caps, and which one to close when room is needed.

Anyone on the cluster network can open connections to a teacher's port without the token. aiohttp
alone would keep a half-sent request open forever and accept until the process runs out of file
descriptors; then nobody (health probes, metrics, trainers) is answered. :class:`ConnectionGuard`
sits between the listening socket and aiohttp's protocol and bounds what a connection may hold:

- a connection must complete a request's headers within ``header_timeout_s`` of its first byte
  (or of connecting), and may stay idle ``idle_timeout_s`` between requests; past either it is
  closed. A request in the handler (reading its body, queued, computing) or an answer still being
  written is never closed here: the body's own deadline is the endpoint's (a 408);
- at most ``max_connections`` in all and ``max_connections_per_peer`` per client address; at a
  cap the oldest idle connection (of that peer, or of all; one that never sent a whole request
  first) is closed to make room, and a new one is refused only when every connection has a
  request in progress.

:func:`guard_middleware` tells the guard when a request is in the handler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(eq=False)
class Connection:
    """One accepted connection: who, and what it is doing."""

    transport: asyncio.Transport
    peer: str
    opened: float = field(default_factory=time.monotonic)
    last_done: float | None = None  # when its last request left the handler
    pending_since: float | None = None  # first byte of a request not yet in the handler
    busy: int = 0  # requests in the handler
    closing: bool = False  # close once its answer is written (the rest of a request never came)

    def idle(self) -> bool:
        """No request in the handler and nothing left to write: closing it loses nothing."""
        return self.busy == 0 and self.transport.get_write_buffer_size() == 0


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, watched by the guard."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.conn = self.guard.admit(transport)
        if self.conn is None:
            transport.abort()
            return
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is not None and conn.busy == 0 and conn.pending_since is None:
            conn.pending_since = time.monotonic()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.conn is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.guard.forget(self.conn)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class ConnectionGuard:
    """Deadlines and caps for the connections of one listening socket (see the module doc)."""

    def __init__(self, *, header_timeout_s: float, idle_timeout_s: float, max_connections: int,
                 max_connections_per_peer: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max(1, max_connections)
        self.max_connections_per_peer = max(1, min(max_connections_per_peer, self.max_connections))
        self._conns: dict[asyncio.Transport, Connection] = {}  # in the order they were accepted
        self._per_peer: dict[str, dict[asyncio.Transport, Connection]] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.closed_late = 0  # connections closed past a deadline
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # connections refused: every one at the cap had a request in progress

    @property
    def open(self) -> int:
        return len(self._conns)

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for ``loop.create_server``: aiohttp's ``inner``, guarded."""
        return lambda: _Guarded(self, inner())

    def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="podium-connections")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
            self._sweeper = None

    # ---------------------------------------------------------------- bookkeeping

    def admit(self, transport: asyncio.Transport) -> Connection | None:
        """The new connection's record, after making room for it; None: refuse it."""
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else "?"
        mine = self._per_peer.get(peer, {})
        if len(mine) >= self.max_connections_per_peer and not self._evict(mine):
            self.refused += 1
            return None
        if len(self._conns) >= self.max_connections and not self._evict(self._conns):
            self.refused += 1
            return None
        conn = Connection(transport, peer)
        self._conns[transport] = conn
        self._per_peer.setdefault(peer, {})[transport] = conn
        return conn

    def forget(self, conn: Connection) -> None:
        if self._conns.pop(conn.transport, None) is not None:
            mine = self._per_peer.get(conn.peer, {})
            mine.pop(conn.transport, None)
            if not mine:
                self._per_peer.pop(conn.peer, None)

    def _evict(self, conns: dict[asyncio.Transport, Connection]) -> bool:
        """Close the oldest idle connection of ``conns`` that never completed a request (a flood's),
        else the oldest idle one; False when none is idle. Oldest first: the scan stops early."""
        victim = None
        for conn in conns.values():
            if conn.idle():
                if conn.last_done is None:
                    victim = conn
                    break
                victim = victim or conn
        if victim is None:
            return False
        self.evicted += 1
        self._close(victim)
        return True

    def _close(self, conn: Connection) -> None:
        self.forget(conn)
        conn.transport.abort()  # frees the descriptor now; the peer gets a reset

    def request_started(self, transport: Any) -> None:
        conn = self._conns.get(transport)
        if conn is not None:
            conn.busy += 1
            conn.pending_since = None

    def request_done(self, transport: Any, close: bool = False) -> None:
        conn = self._conns.get(transport)
        if conn is not None:
            conn.busy = max(0, conn.busy - 1)
            conn.last_done = time.monotonic()
            conn.closing = conn.closing or close

    def overdue(self, now: float) -> list[Connection]:
        """Connections past a deadline: a request's headers not complete within
        ``header_timeout_s`` (of its first byte, or of connecting), idle past ``idle_timeout_s``,
        or answered and marked to close."""
        late = []
        for conn in self._conns.values():
            if not conn.idle():
                continue
            if conn.closing:
                late_by = 1.0
            elif conn.pending_since is not None:
                late_by = now - conn.pending_since - self.header_timeout_s
            elif conn.last_done is None:
                late_by = now - conn.opened - self.header_timeout_s
            else:
                late_by = now - conn.last_done - self.idle_timeout_s
            if late_by > 0:
                late.append(conn)
        return late

    async def _sweep(self) -> None:
        period = max(0.05, min(1.0, self.header_timeout_s / 4, self.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            late = self.overdue(time.monotonic())
            for conn in late:
                self._close(conn)
            if late:
                self.closed_late += len(late)
                logger.debug("closed %d connections past their deadline (%d open)", len(late), len(self._conns))


def guard_middleware(guard: ConnectionGuard) -> Any:
    """Tells ``guard`` while a request is in the handler (its connection is then never closed for
    a deadline); after an answer that leaves the connection unusable (a 408: the rest of its body
    never came) the guard closes it once the answer is written (aiohttp would wait for the body)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        guard.request_started(transport)
        close = False
        try:
            response = await handler(request)
            if response.status == 408:
                response.force_close()
                close = True
            return response
        finally:
            guard.request_done(transport, close)

    return middleware


class GuardedSite(web.SockSite):
    """aiohttp's :class:`~aiohttp.web.SockSite` whose connections go through ``guard``."""

    def __init__(self, runner: web.AppRunner, sock: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(runner, sock, **kwargs)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner (SockSite.start's first step)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.factory(server), sock=self._sock, backlog=self._backlog)
