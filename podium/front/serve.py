"""A front's lifetime: the run it serves, the address it listens on, the file that says so.

Owns :class:`Front` (``await start()``, ``await stop()``: the application of
:class:`~podium.front.app.FrontApp` listening on ``host:port``, the front's file in the run dir
written once it listens and removed when it stops, :mod:`podium.rendezvous.fronts`),
:class:`FrontThread` (a front on an event loop of its own in a background thread: tests, and
synchronous code) and :class:`FrontError` (what stops a front from serving, said plainly: a folder
that holds no run, a port taken, ``--no-auth`` off loopback).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from podium.client.client import PodiumClient
from podium.front.app import FrontApp
from podium.front.paths import base_url
from podium.net import http_url, is_loopback
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.fronts import FrontRecord, remove_front, write_front
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.token import read_token

MAX_BODY_BYTES = 1 << 30  # the largest request body the front takes (the teacher bounds its own)
LOOPBACK_NOTE = ("--no-auth: every user of this node can reach a loopback address; "
                 "the front answers them all without a token")


class FrontError(Exception):
    """The front cannot serve: the message says why and what to do."""


class Front:
    """One run's aliases behind one listener (asyncio API)."""

    def __init__(self, run: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 0, auth: bool = True,
                 call_timeout_s: float | None = None, **client_options: Any) -> None:
        self.layout = RunLayout.from_rendezvous_path(run)
        if not self.layout.rendezvous_path.is_file():
            raise FrontError(f"{run}: no podium run here ({self.layout.rendezvous_path} does not exist); give the run "
                             f"dir `podium up` printed, or its rendezvous.json")
        if not auth and not is_loopback(host):
            raise FrontError(f"--no-auth needs a loopback listen address (127.0.0.1, ::1, localhost), not {host!r}: "
                             f"a front without auth on {host} would open the run's teachers to the network")
        try:
            token = read_token(self.layout.auth_token_path)
            client = PodiumClient(self.layout.rendezvous_path, token=token, **client_options)
        except FileReadError as exc:
            raise FrontError(f"cannot read the run: {exc}") from None
        self.host, self.port, self.auth = host, port, auth
        self.app = FrontApp(client, token, auth=auth, call_timeout_s=call_timeout_s)
        self._runner: web.AppRunner | None = None
        self.record_path: Path | None = None
        self.url = ""

    @property
    def aliases(self) -> dict[str, str]:
        """Each alias's base URL."""
        return {alias: base_url(self.url, alias) for alias in self.app.client.aliases()}

    async def start(self) -> str:
        """Listen; returns the front's URL once it does (:class:`FrontError` when it cannot)."""
        runner = web.AppRunner(self.app.application(MAX_BODY_BYTES), access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=1024)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise FrontError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc} (another process "
                             f"holds the port? pick another with --listen HOST:PORT, or port 0 for a free one)") \
                from None
        self._runner = runner
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]
        self.url = http_url(self.host, self.port)
        record = FrontRecord(url=self.url, host=socket.gethostname(), pid=os.getpid(), aliases=self.aliases,
                             auth=self.auth)
        self.record_path = write_front(self.layout, record)
        return self.url

    async def stop(self) -> None:
        """Stop listening (calls in flight are cut after a short grace), remove the front's file."""
        if self.record_path is not None:
            remove_front(self.record_path)
            self.record_path = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.app.close()


class FrontThread:
    """A :class:`Front` on its own event loop in a background thread."""

    def __init__(self, run: str | os.PathLike[str], **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="podium-front", daemon=True)
        self.front = Front(run, **kwargs)

    @property
    def url(self) -> str:
        return self.front.url

    def start(self, timeout: float = 30.0) -> FrontThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.front.start(), self._loop).result(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.front.stop(), self._loop).result(timeout)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            self._loop.close()

    def __enter__(self) -> FrontThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
