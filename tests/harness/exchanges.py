"""What a client's infer exchanges were, for tests that count them: :func:`record_infer_exchanges`."""

from __future__ import annotations

from typing import Any

import pytest

from podium.client.transport import HTTPTransport


def record_infer_exchanges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, Any]]:
    """From now on (for the test): (url, bytes of the body sent, status or the exception's name) of
    every infer exchange any client of this process makes, in order."""
    seen: list[tuple[str, int, Any]] = []
    request = HTTPTransport.request

    def recording(self: HTTPTransport, method: str, path: str, body: Any = None, *args: Any, **kw: Any) -> Any:
        size = sum(memoryview(c).nbytes for c in body) if body is not None else 0
        try:
            resp = request(self, method, path, body, *args, **kw)
        except Exception as exc:
            if path.endswith("/infer"):
                seen.append((self.url, size, type(exc).__name__))
            raise
        if path.endswith("/infer"):
            seen.append((self.url, size, resp.status))
        return resp

    monkeypatch.setattr(HTTPTransport, "request", recording)
    return seen
