"""An endpoint on its own event loop in a background thread: how synchronous code runs one.

The launcher's lifecycle (:mod:`podium.launcher.job.lifecycle`), the tests and the benchmarks start,
ready, drain and stop an :class:`~podium.teacher.endpoint.server.EndpointServer` through
:class:`ServerThread` without an event loop of their own.
"""

from __future__ import annotations

import asyncio
import threading

from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.endpoint.server import EndpointServer
from podium.teacher.seam import ServedGroup


class ServerThread:
    """An :class:`EndpointServer` on its own event loop in a background thread."""

    def __init__(self, group: ServedGroup, config: EndpointConfig) -> None:
        self.server = EndpointServer(group, config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self.server.url is not None, "server not started"
        return self.server.url

    @property
    def port(self) -> int:
        assert self.server.port is not None, "server not started"
        return self.server.port

    def start(self, timeout: float = 30.0) -> str:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="podium-endpoint", daemon=True)
        self._thread.start()
        try:
            return asyncio.run_coroutine_threadsafe(self.server.start(), loop).result(timeout)
        except BaseException:
            self._close_loop()
            raise

    def set_ready(self, ready: bool, reason: str = "") -> None:
        self.server.set_ready(ready, reason)

    def drain(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.server.drain)

    def stop(self, grace_s: float = 30.0) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(grace_s), self._loop).result(grace_s + 30.0)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(30.0)
        loop.close()

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
