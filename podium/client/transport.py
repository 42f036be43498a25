"""HTTP/1.1 keep-alive transport from a trainer to one teacher URL (stdlib ``http.client``).

Owns connections: one persistent connection per thread (so concurrent callers never interleave on a
socket), the bearer token on every request, body chunks sent without joining them (tensor bytes go
to the socket straight from numpy's memory), and the response read into one writable buffer that
numpy views without copying. A failed exchange closes its connection and raises
:class:`TransportError` (``dropped`` when the connection died with the whole request sent: the
server died with it in hand); a kept-alive connection the server has closed is not reused, and a
request whose sending failed on a reused one is sent once more on a fresh one. An answer is received
straight into uninitialised memory (zero-filling 100 MB costs more than a loopback moves it in), one
buffer per answer: a large one into the memory of an earlier answer its caller has let go of
(:mod:`~podium.client.buffers`: fresh memory costs its page faults), so arrays a caller still holds
are never overwritten. An exchange given
``timeout_s`` never waits longer than that in all (connect, proof, send, each read), and sockets
have TCP keepalive on, so a head node that vanished without closing its connections is noticed
while a long call computes.

Given the :class:`ServerIdentity` the record names, a transport sends the token on a new
connection only after the server there proved, on that connection, that it holds the token and is
that generation of that teacher (``GET /v2/podium/proof``, :func:`podium.rendezvous.token.server_proof`);
otherwise :class:`ServerProofError`, and nothing it said is used.
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from urllib.parse import urlsplit

from podium.client.buffers import RECEIVE_BUFFERS
from podium.client.errors import ServerProofError, TransportError
from podium.protocol.names import PROOF, PROOF_NONCE
from podium.protocol.pieces import Buffer
from podium.rendezvous.token import new_nonce, server_proof

logger = logging.getLogger(__name__)

BodyWatch = Callable[[memoryview, int, Message], None]  # (body, bytes arrived, the response's headers)

_JOIN_BELOW = 64 * 1024  # small bodies go out in one send
_READ_CHUNK = 4 * 1024 * 1024  # the time left is re-applied to the socket between chunks
_PROOF_MAX_BYTES = 4096  # a proof answer is ~150 bytes: a server sending more is not podium's


def enable_keepalive(sock: socket.socket, idle_s: float, interval_s: float, count: int) -> None:
    """TCP keepalive on ``sock``: first probe after ``idle_s`` of silence, then every ``interval_s``,
    dropped after ``count`` unanswered (the options this platform has)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle_option = getattr(socket, "TCP_KEEPIDLE", None) or getattr(socket, "TCP_KEEPALIVE", None)  # Linux, macOS
    for option, value in ((idle_option, idle_s), (getattr(socket, "TCP_KEEPINTVL", None), interval_s),
                          (getattr(socket, "TCP_KEEPCNT", None), count)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, max(1, int(value)))


def closed_by_peer(sock: socket.socket | None) -> bool:
    """An idle kept-alive connection that is readable has been closed by the server (or sent what
    no request asked for): either way it must not carry a request."""
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


@dataclass(frozen=True)
class ServerIdentity:
    """Who the server at a URL must prove to be before it gets the token: the record's generation
    (``J:R``) and teacher key."""

    generation: str
    teacher_key: str


class AnswerCutOff(http.client.IncompleteRead):
    """An answer's body ended (or its connection was reset) before its ``Content-Length``: never
    handed over in part (the teacher went away, or cut the answer off, mid-answer)."""

    def __init__(self, got: int, size: int, cause: BaseException | None = None) -> None:
        super().__init__(b"", size - got)
        self.got, self.size = got, size
        self.cause = f" ({type(cause).__name__}: {cause})" if cause is not None else ""

    def __str__(self) -> str:
        return (f"the answer ended after {self.got} of its {self.size} bytes{self.cause}: the teacher cut it off "
                f"or went away while it was being sent")

    __repr__ = __str__


def _read_body(resp: http.client.HTTPResponse, size: int, bound: Callable[[], None],
               watch: BodyWatch | None) -> memoryview:
    """The ``size`` bytes of ``resp``'s body, read straight into memory of their own
    (:data:`~podium.client.buffers.RECEIVE_BUFFERS`); :class:`AnswerCutOff` when it stops short."""
    view = RECEIVE_BUFFERS.take(size)  # not zero-filled: every byte is read into it
    got = 0
    while got < size:
        bound()
        try:
            n = resp.readinto(view[got:got + _READ_CHUNK])
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise AnswerCutOff(got, size, exc) from exc
        if not n:
            raise AnswerCutOff(got, size)
        got += n
        if watch is not None:
            watch(view, got, resp.headers)
    resp.read()  # lets http.client mark the response complete (keeps the connection)
    return view


class Cancel:
    """Lets another thread end one exchange (the copy of a hedged request that lost): its socket is
    shut down, so a read blocked on it ends at once, the exchange raises :class:`TransportError`
    and its connection is closed, never left half-read for the next request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.cancelled = False

    def attach(self, sock: socket.socket | None) -> None:
        """The exchange runs on ``sock`` from now (shut down at once if cancelled already)."""
        with self._lock:
            self._sock = sock
            if self.cancelled:
                self._shut()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already


@dataclass
class HTTPResponse:
    status: int
    headers: http.client.HTTPMessage
    body: memoryview  # writable bytes (numpy views of it are writable arrays)
    waited_s: float = 0.0  # from the request sent to the answer's headers (the server's queue and compute)
    received_s: float = 0.0  # reading the answer's body (the wire)

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
        identity: ServerIdentity | None = None,  # prove it before the token goes (None: no proof asked)
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"teacher URL {url!r} must be http://host:port")
        self.url = url
        self.host = parts.hostname
        self.port = parts.port
        self._token = token
        self._auth = f"Bearer {token}" if token else None
        self.identity = identity
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
            if not closed_by_peer(conn.sock):
                return conn, True
            logger.debug("%s: kept-alive connection closed by the server; reconnecting", self.url)
            self._drop()
        try:
            timeout = self._bounded(self.connect_timeout_s, deadline)
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            conn.connect()
        except OSError as exc:
            raise TransportError(f"cannot connect to {self.url}: {type(exc).__name__}: {exc}") from exc
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_keepalive(conn.sock, *self.keepalive)
        if self.identity is not None and self._token:
            try:
                self._challenge(conn, self.identity, self._token, deadline)
            except ServerProofError as exc:
                conn.close()
                logger.warning("%s; no token sent, its answers are not used", exc)
                raise
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise TransportError(f"GET {self.url}{PROOF}: {type(exc).__name__}: {exc}") from exc
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn, False

    def _challenge(self, conn: http.client.HTTPConnection, identity: ServerIdentity, token: str,
                   deadline: float | None) -> None:
        """The server proves, on ``conn``, that it holds ``token`` and is ``identity``; else
        :class:`ServerProofError` (one round trip, no token sent)."""
        timeout = self._bounded(self.connect_timeout_s, deadline)
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        nonce = new_nonce()
        conn.request("GET", f"{PROOF}?{PROOF_NONCE}={nonce}")
        resp = conn.getresponse()
        body = resp.read(_PROOF_MAX_BYTES + 1)
        what = f"server at {self.url} did not prove it is generation {identity.generation} of teacher " \
               f"{identity.teacher_key}"
        if resp.status != 200:
            raise ServerProofError(f"{what}: {PROOF} answered HTTP {resp.status}")
        if len(body) > _PROOF_MAX_BYTES or not resp.isclosed():
            raise ServerProofError(f"{what}: {PROOF} answered more than a proof")
        try:
            answer = json.loads(body)
            generation, key, proof = answer["generation"], answer["teacher_key"], answer["proof"]
        except (ValueError, KeyError, TypeError):
            raise ServerProofError(f"{what}: {PROOF} answered no proof") from None
        if generation != identity.generation or key != identity.teacher_key:
            raise ServerProofError(f"{what}: it says generation {generation} of teacher {key}")
        expected = server_proof(token, nonce, identity.generation, identity.teacher_key)
        if not isinstance(proof, str) or not hmac.compare_digest(proof.encode(), expected.encode()):
            raise ServerProofError(f"{what}: its proof is wrong (it does not hold the run's token)")
        if resp.will_close:
            raise ServerProofError(f"{what}: it closed the connection it proved itself on")

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
        watch: BodyWatch | None = None,
        cancel: Cancel | None = None,
    ) -> HTTPResponse:
        """One exchange, within ``timeout_s`` in all when given; :class:`TransportError` when the
        connection fails or times out, or ``cancel`` is cancelled. ``watch(body, got, headers)`` is
        told after each read of a body how much of it has arrived."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for attempt in (0, 1):
            conn, reused = self._connection(deadline)
            sent: list[bool] = []  # set once the whole request is sent: then a lost connection is a drop
            try:
                if cancel is not None:
                    cancel.attach(conn.sock)
                return self._exchange(conn, method, path, body, headers, deadline, sent, watch)
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                if cancel is not None and cancel.cancelled:
                    raise TransportError(f"{method} {self.url}{path}: cancelled (another copy answered)") from exc
                lost = isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError))
                if lost and reused and not sent and attempt == 0:
                    logger.debug("%s: kept-alive connection closed by the server (%s); reconnecting", self.url, exc)
                    continue
                dropped = bool(sent) and not isinstance(exc, TimeoutError)
                raise TransportError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}"
                                     + (" (the connection was lost with the request sent)" if dropped else ""),
                                     dropped=dropped) from exc
            finally:
                if cancel is not None:
                    cancel.attach(None)
        raise AssertionError("unreachable")

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        method: str,
        path: str,
        body: Sequence[Buffer] | None,
        headers: Mapping[str, str] | None,
        deadline: float | None,
        sent: list[bool],
        watch: BodyWatch | None = None,
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
        sent.append(True)
        bound()
        started = time.monotonic()
        resp = conn.getresponse()
        headers_at = time.monotonic()
        length = resp.getheader("Content-Length")
        if length is not None:
            view = _read_body(resp, int(length), bound, watch)
        else:
            view = memoryview(bytearray(resp.read()))
        if resp.will_close:
            self._drop()
        return HTTPResponse(resp.status, resp.headers, view, headers_at - started, time.monotonic() - headers_at)

    def close(self) -> None:
        """Close every connection this transport opened (all threads)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
