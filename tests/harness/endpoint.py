"""An endpoint in front of a stand-in group, and the calls the endpoint tests make to it.

- :func:`start_server`: a started, ready :class:`~podium.teacher.endpoint.ServerThread` serving
  model ``m`` with token :data:`TOKEN` (:data:`AUTH` is its header);
- :func:`post`, :func:`post_in_thread`, :func:`raw_infer`: an infer request sent with
  ``requests``, from a thread, or on a raw connection the test closes when it wants;
- :func:`tagged_body`, :func:`rows_body`: request bodies whose first tokens say, in the group's
  record (``FakeGroup.calls``, ``first_tokens``), whose rows a call held;
- :func:`in_thread`, :func:`wait_until`, :func:`health_s`, :func:`closed_within`: a call run
  aside, a wait for the endpoint's state, a timed liveness probe, a connection the server closes.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import requests

from harness.infer_requests import GOOD_IDS, GOOD_LENS, infer_body
from harness.poll import wait_for
from podium.config.launcher import ServerSettings
from podium.teacher.endpoint import EndpointConfig, ServerThread

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PORTS = (23000, 23999)

# the endpoint's state (queue depth, abandoned requests) reached within milliseconds, asked often
wait_until = functools.partial(wait_for, timeout_s=120.0, interval_s=0.005)


def start_server(group: Any, settings: dict[str, Any] | None = None, *, token: str = TOKEN,
                 **kw: Any) -> ServerThread:
    """A started, ready server (``settings``: ``podium.server`` settings; ``kw``: more EndpointConfig fields)."""
    server_settings = ServerSettings(**{"port_range": PORTS, **(settings or {})})
    server = ServerThread(group, EndpointConfig(served_name="m", token=token, server=server_settings, **kw))
    server.start()
    server.set_ready(True)
    return server


def post(server: ServerThread, body: bytes, headers: dict[str, str] | None = None,
         timeout: float = 60) -> requests.Response:
    return requests.post(f"{server.url}/v2/models/m/infer", data=body, headers={**AUTH, **(headers or {})},
                         timeout=timeout)


def in_thread(fn: Callable[[], Any], outcome: dict[Any, Any], key: Any) -> threading.Thread:
    """``fn`` run in a started thread; what it returns (or raises) becomes ``outcome[key]``."""
    def run() -> None:
        try:
            outcome[key] = fn()
        except Exception as exc:  # reported by the test
            outcome[key] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def post_in_thread(server: ServerThread, body: bytes, outcome: dict[Any, Any], key: Any) -> threading.Thread:
    """An infer request from a started thread; ``outcome[key]`` becomes (status, text), or (None,
    the exception) where no answer came."""
    def call() -> tuple[int | None, str]:
        try:
            resp = post(server, body, timeout=120)
            return resp.status_code, resp.text
        except Exception as exc:  # reported by the test
            return None, repr(exc)

    return in_thread(call, outcome, key)


def raw_infer(server: ServerThread, body: bytes) -> socket.socket:
    """An infer request sent whole on a raw connection the test closes when it wants (no answer read)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    head = (f"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body)
    return sock


def tagged_body(tag: int) -> bytes:
    """A good JSON infer body whose ``input_ids[0, 0]`` is ``tag`` (what ``FakeGroup.calls`` records)."""
    ids = GOOD_IDS.copy()
    ids[0, 0] = tag
    return infer_body(ids, GOOD_LENS)


def rows_body(tag: int, rows: int, length: int = 8) -> bytes:
    """``rows`` rows of ``length`` tokens, every row's first token ``tag`` (what ``first_tokens`` shows)."""
    ids = np.tile(np.arange(length) + 1, (rows, 1))
    ids[:, 0] = tag
    return infer_body(ids, np.full(rows, length))


def health_s(url: str, timeout_s: float = 10.0) -> float:
    """Seconds ``/v2/health/live`` took to answer 200."""
    started = time.perf_counter()
    assert requests.get(f"{url}/v2/health/live", timeout=timeout_s).status_code == 200
    return time.perf_counter() - started


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes ``sock`` within ``seconds`` (no answer expected)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
