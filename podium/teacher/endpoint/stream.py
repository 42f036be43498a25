"""Large answers on their way out: streamed from numpy's memory by a sender thread, never joined.

A top-k answer is ~100 MB (64 × 2048 × 64 values and ids). Joining it into one ``bytes`` before
the first byte leaves, then writing it through the event loop's transport (which copies what the
socket does not take into its own buffer and sends it a socket-buffer at a time between other
callbacks), moved a third of what the machine's loopback moves. :class:`AnswerSender` answers a
body of at least :data:`STREAM_FROM` bytes with a :class:`StreamedAnswer`: aiohttp sends its
status line, headers (``Content-Length`` set, so clients and middleware know the size) and the
small JSON header; then a thread of the sender's pool writes each tensor's bytes to the socket
straight from the arrays' memory (each batch's row block in turn; a block whose dtype is not
its wire dtype a megabyte at a time, cast as it goes: :class:`~podium.protocol.pieces.CastBlock`),
and the event loop goes on serving others (health probes answer while 100 MB leave).

The thread writes to a duplicate of the connection's descriptor while the event loop's transport
has nothing buffered (it has written the headers; the client sends nothing until the answer is
whole), so the two never interleave. While it writes, the connection guard counts the connection
busy (never closed as idle). A client that goes away mid-answer ends the write at its next send
(a reset or broken pipe); a client that stops reading for ``stall_timeout_s`` is cut off; a
server stopping shuts the socket down. Either way the connection is aborted (its body cannot be
finished), the thread is free again and nothing is logged as an error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import select
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from aiohttp import web

from podium.protocol.pieces import CastBlock, Chunk, chunk_nbytes, join
from podium.teacher.endpoint.connections import ConnectionGuard

logger = logging.getLogger(__name__)

STREAM_FROM = 1 << 20  # bodies this large are streamed by a sender thread; smaller ones leave in one write
SENDERS = 16  # answers written at once (one thread each); more wait for a thread
_POLL_SLICE_MS = 200  # how often a waiting sender looks whether it was told to stop


class StreamStopped(ConnectionResetError):
    """The answer could not be written whole (client gone or stalled, server stopping)."""


class AnswerSender:
    """Writes large answers on threads of its own (see the module's docstring)."""

    def __init__(self, guard: ConnectionGuard, stall_timeout_s: float, threads: int = SENDERS) -> None:
        self.guard = guard
        self.stall_timeout_s = stall_timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="podium-send")
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.active = 0  # sender threads writing an answer now
        self.sent = 0  # answers written whole
        self.cut = 0  # answers cut off (client gone or stalled, server stopping)

    def response(self, chunks: Sequence[Chunk], headers: Mapping[str, str], content_type: str) -> web.StreamResponse:
        """The HTTP answer of body ``chunks``: one plain response when small, else streamed."""
        total = sum(chunk_nbytes(c) for c in chunks)
        if total < STREAM_FROM or len(chunks) < 2:
            return web.Response(body=join(chunks), headers=headers, content_type=content_type)
        return StreamedAnswer(self, chunks, total, headers, content_type)

    def write(self, sock: socket.socket, chunks: Sequence[Chunk], stop: threading.Event) -> int:
        """On a sender thread: ``chunks`` written whole to ``sock`` (a duplicate of the connection's
        descriptor, closed here: the event loop may close its own meanwhile); the bytes written, or
        :class:`StreamStopped`."""
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        slices = max(1, int(self.stall_timeout_s * 1000 / _POLL_SLICE_MS))
        written = 0
        with self._lock:
            self.active += 1
        try:
            sock.setblocking(False)  # it is already (the event loop's); says so to this object
            for view in _views(chunks):
                while view.nbytes:
                    if stop.is_set() or self._stopping.is_set():
                        raise StreamStopped("stopped (the request was cancelled, or the server is stopping)")
                    try:
                        n = sock.send(view)
                    except (BlockingIOError, InterruptedError):
                        for _ in range(slices):
                            if poller.poll(_POLL_SLICE_MS) or stop.is_set() or self._stopping.is_set():
                                break
                        else:
                            raise StreamStopped(f"the client read nothing for {self.stall_timeout_s:g}s") from None
                        continue
                    except OSError as exc:  # reset, broken pipe: the client went away
                        raise StreamStopped(f"{type(exc).__name__}: {exc}") from None
                    view = view[n:]
                    written += n
            return written
        finally:
            sock.close()
            with self._lock:
                self.active -= 1

    async def stream(self, transport: asyncio.Transport, chunks: Sequence[Chunk]) -> int:
        """``chunks`` written to ``transport``'s socket by a sender thread, the guard counting the
        connection busy meanwhile; the connection aborted when it cannot be written whole."""
        stop = threading.Event()
        self.guard.request_started(transport)
        try:
            loop = asyncio.get_running_loop()
            give_up = loop.time() + self.stall_timeout_s
            while transport.get_write_buffer_size():  # the headers first, whole (a few hundred bytes)
                if transport.is_closing() or loop.time() > give_up:
                    break
                await asyncio.sleep(0.001)
            own = transport.get_extra_info("socket")
            if own is None or transport.is_closing() or transport.get_write_buffer_size():
                raise StreamStopped("the connection is closed, or its client reads nothing")
            # Duplicated here, while the transport holds it open: a descriptor number the event loop
            # closed could be another connection's by the time a thread looks at it.
            sock = socket.socket(fileno=os.dup(own.fileno()))
            # The thread closes it, even when it starts after a stop (the pool runs what was queued).
            try:
                pending = loop.run_in_executor(self._pool, self.write, sock, chunks, stop)
            except RuntimeError:  # the pool is shut down: the server is stopping
                sock.close()
                raise StreamStopped("the server is stopping") from None
            written = await pending
            with self._lock:
                self.sent += 1
            return written
        except BaseException as exc:  # cancelled too: the thread stops at its next send, the connection goes
            stop.set()
            with self._lock:
                self.cut += 1
            logger.info("an answer of %d bytes was cut off: %s", sum(chunk_nbytes(c) for c in chunks),
                        exc if not isinstance(exc, asyncio.CancelledError) else "the request was cancelled")
            transport.abort()
            if isinstance(exc, StreamStopped):
                raise
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise StreamStopped(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.guard.request_done(transport)

    def shutdown(self) -> None:
        """Answers being written stop at their next send; no new ones start."""
        self._stopping.set()
        self._pool.shutdown(wait=False)  # queued writes run, see the stop and close their socket


def _views(chunks: Sequence[Chunk]) -> Iterator[memoryview]:
    """The bytes of ``chunks`` in order; a cast block's a piece at a time, cast as it is reached."""
    for chunk in chunks:
        if isinstance(chunk, CastBlock):
            yield from chunk.pieces()
        else:
            yield memoryview(chunk).cast("B")


class StreamedAnswer(web.StreamResponse):
    """An answer whose body (a small JSON header, then tensor bytes) a sender thread writes."""

    def __init__(self, sender: AnswerSender, chunks: Sequence[Chunk], total: int, headers: Mapping[str, str],
                 content_type: str) -> None:
        super().__init__(headers=headers)
        self.content_type = content_type
        self.content_length = total
        self._sender = sender
        self._chunks = list(chunks)
        self._transport: asyncio.Transport | None = None

    async def prepare(self, request: web.BaseRequest) -> Any:
        transport = request.transport
        if isinstance(transport, asyncio.Transport):
            self._transport = transport
        return await super().prepare(request)

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof_sent:
            return
        head, rest = self._chunks[:1], self._chunks[1:]
        for view in _views(head):  # the JSON header, with the status line and headers, through aiohttp
            await self.write(view)
        if self._transport is None:
            for view in _views(rest):  # no socket to hand a thread (not a TCP transport): through aiohttp
                await self.write(view)
        else:
            written = await self._sender.stream(self._transport, rest)
            writer = self._payload_writer
            assert writer is not None
            writer.output_size += written  # what aiohttp reports as the body's length
            if writer.length is not None:
                writer.length -= written
        self._chunks = []
        await super().write_eof()
