"""One request relayed to a teacher, on a worker thread: through the teacher's client's own call
loop (:meth:`TeacherClient.send <podium.client.teacher.TeacherClient.send>`: the replica choice,
the retry rule, the hold through a requeue, the fail-at-once after ``down``), its answer streamed
back to the caller as it arrives.

Owns :class:`Relay` and :class:`Workers`. A binary answer (it carries the Open Inference Protocol's
``Inference-Header-Content-Length``: only a 2xx does) goes to the caller chunk by chunk as the
teacher's bytes land (the front's response is prepared at the first chunk), never decoded; any other
answer (JSON, an error) is small and is answered whole, undecoded. Once bytes of an answer went to
the caller, the request cannot be sent again elsewhere: an answer that breaks after that ends the
caller's connection (:class:`CutOff`), so a caller never takes a spliced answer for a whole one.

:class:`Workers` are the threads relays run on: a fixed set, daemon threads (a call held through a
requeue must not keep a stopping front's process alive), each keeping its own kept-alive connection
to each replica (the client's transport holds one per thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from email.message import Message
from typing import Any

from aiohttp import web

from podium.client.teacher import TeacherClient
from podium.client.transport import HTTPResponse
from podium.protocol import oip
from podium.protocol.names import ERROR_KIND_HEADER, GENERATION_HEADER, REQUEST_ID_HEADER, RETRY_AFTER
from podium.rendezvous.records import EndpointRecord

# what goes back to the caller of a teacher's answer's headers
PASSED_HEADERS = ("Content-Type", oip.HEADER_LENGTH, GENERATION_HEADER, REQUEST_ID_HEADER, RETRY_AFTER,
                  ERROR_KIND_HEADER)


class CutOff(Exception):
    """An answer broke after part of it went to the caller: the caller's connection is ended."""


class Relay:
    """One request's way through the front: :meth:`send` on a worker thread, the stream on the loop."""

    def __init__(self, request: web.Request, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.stream: web.StreamResponse | None = None  # prepared once an answer streams
        self.sent = 0  # bytes of the streamed answer written to the caller
        self.last: tuple[Message, memoryview] | None = None  # the last whole answer that did not stream
        self._headers: Message | None = None  # the answer being received
        self._streams = False

    def send(self, teacher: TeacherClient, method: str, route: str, body: bytes | None,
             headers: dict[str, str], timeout_s: float | None) -> tuple[HTTPResponse, EndpointRecord]:
        """The teacher's 2xx answer (streamed already when :attr:`stream` is set); raises what
        :meth:`TeacherClient.send` raises."""
        chunks = [body] if body else None
        return teacher.send(method, route, chunks, headers, timeout_s, watch=self._received)

    def _received(self, body: memoryview, got: int, headers: Message) -> None:
        if headers is not self._headers:  # a new answer: the first, or one to a request sent again
            if self.sent:
                raise CutOff(f"the teacher's answer broke after {self.sent} bytes went to the caller")
            self._headers, self._streams = headers, headers.get(oip.HEADER_LENGTH) is not None
        if not self._streams:
            if got == len(body):
                self.last = (headers, body)
            return
        if self.stream is None:
            self._on_loop(self._prepare(headers, len(body)))
        self._on_loop(self._write(body[self.sent:got]))
        self.sent = got

    def _on_loop(self, work: Any) -> None:
        asyncio.run_coroutine_threadsafe(work, self.loop).result()

    async def _prepare(self, headers: Message, size: int) -> None:
        stream = web.StreamResponse(status=200, headers=passed(headers))
        stream.content_length = size
        await stream.prepare(self.request)
        self.stream = stream

    async def _write(self, data: memoryview) -> None:
        assert self.stream is not None
        await self.stream.write(data)


def passed(headers: Message | Any) -> dict[str, str]:
    """The headers of a teacher's answer that go back to the caller."""
    return {name: str(headers[name]) for name in PASSED_HEADERS if headers.get(name) is not None}


class Workers(concurrent.futures.Executor):
    """A fixed set of daemon threads that run relays (see the module doc)."""

    def __init__(self, size: int, name: str = "podium-front") -> None:
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future, Callable[[], Any]] | None] = \
            queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(size)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, work = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
