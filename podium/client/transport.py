"""HTTP/1.1 keep-alive transport from a trainer to one teacher URL (stdlib ``http.client``).

Owns connections: one persistent connection per thread (so concurrent callers never interleave on a
socket), the bearer token on every request, body chunks sent without joining them (tensor bytes go
to the socket straight from numpy's memory), and the response read into one writable buffer that
numpy views without copying. A failed exchange closes its connection and raises
:class:`TransportError`; a request that failed on a connection the server had silently closed
(idle keep-alive) is sent once more on a fresh one. An exchange given ``timeout_s`` never waits
longer than that in all (connect, send, each read), and sockets have TCP keepalive on, so a head
node that vanished without closing its connections is noticed while a long call computes.
"""

from __future__ import annotations

import http.client
import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from podium.client.errors import TransportError

logger = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
_JOIN_BELOW = 64 * 1024  # small bodies go out in one send
_READ_CHUNK = 4 * 1024 * 1024  # the time left is re-applied to the socket between chunks


def enable_keepalive(sock: socket.socket, idle_s: float, interval_s: float, count: int) -> None:
    """TCP keepalive on ``sock``: first probe after ``idle_s`` of silence, then every ``interval_s``,
    dropped after ``count`` unanswered (the options this platform has)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle_option = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)  # Linux, macOS
    for option, value in ((idle_option, idle_s), (getattr(socket, "TCP_KEEPINTVL", None), interval_s),
                          (getattr(socket, "TCP_KEEPCNT", None), count)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, max(1, int(value)))


@dataclass
class HTTPResponse:
    status: int
    headers: http.client.HTTPMessage
    body: bytearray

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)


class HTTPTransport:
    """Keep-alive requests to one base URL (``http://host:port``)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float | None = 3600.0,
        keepalive: tuple[float, float, int] = (30.0, 10.0, 3),  # idle_s, interval_s, count
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"teacher URL {url!r} must be http://host:port")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port
        self._auth = f"Bearer {token}" if token else None
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive = keepalive
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    @staticmethod
    def _bounded(timeout_s: float | None, deadline: float | None) -> float | None:
        """``timeout_s``, never past ``deadline`` (monotonic); TimeoutError once it has passed."""
        if deadline is None:
            return timeout_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out (the call's deadline passed)")
        return left if timeout_s is None else min(timeout_s, left)

    def _connection(self, deadline: float | None) -> tuple[http.client.HTTPConnection, bool]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn, True
        try:
            timeout = self._bounded(self.connect_timeout_s, deadline)
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            conn.connect()
        except OSError as exc:
            raise TransportError(f"cannot connect to {self.url}: {type(exc).__name__}: {exc}") from exc
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_keepalive(conn.sock, *self.keepalive)
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
            with self._lock:
                if conn in self._all:
                    self._all.remove(conn)

    def request(
        self,
        method: str,
        path: str,
        body: Sequence[Buffer] | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> HTTPResponse:
        """One exchange, within ``timeout_s`` in all when given; :class:`TransportError` when the
        connection fails or times out."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for attempt in (0, 1):
            conn, reused = self._connection(deadline)
            try:
                return self._exchange(conn, method, path, body, headers, deadline)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                self._drop()
                if reused and attempt == 0:
                    logger.debug("%s: kept-alive connection closed by the server (%s); reconnecting", self.url, exc)
                    continue
                raise TransportError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise TransportError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        body: Sequence[Buffer] | None,
        headers: Mapping[str, str] | None,
        deadline: float | None,
    ) -> HTTPResponse:
        def bound() -> None:  # each socket operation waits at most what is left
            timeout = self._bounded(self.read_timeout_s, deadline)
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)

        all_headers = dict(headers or {})
        if self._auth:
            all_headers["Authorization"] = self._auth
        payload: bytes | list[Buffer] | None = None
        if body is not None:
            total = sum(memoryview(c).nbytes for c in body)
            all_headers["Content-Length"] = str(total)
            payload = b"".join(body) if total < _JOIN_BELOW or len(body) == 1 else list(body)
        bound()
        conn.request(method, path, body=payload, headers=all_headers)
        bound()
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length is not None:
            buf = bytearray(int(length))
            view = memoryview(buf)
            got = 0
            while got < len(buf):
                bound()
                n = resp.readinto(view[got:got + _READ_CHUNK])
                if not n:
                    raise http.client.IncompleteRead(bytes(view[:got]), len(buf) - got)
                got += n
            resp.read()  # lets http.client mark the response complete (keeps the connection)
        else:
            buf = bytearray(resp.read())
        if resp.will_close:
            self._drop()
        return HTTPResponse(resp.status, resp.headers, buf)

    def close(self) -> None:
        """Close every connection this transport opened (all threads)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
