"""How the endpoint refuses a request: :class:`RequestError`, answered as a JSON ``{"error": ...}``.

Every bad request is a 4xx (a failed or unavailable group a 5xx) with that body, and the server
keeps serving; :mod:`~podium.teacher.endpoint.middleware` turns the exception into the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

from podium.protocol import oip


class RequestError(Exception):
    """A request the endpoint refuses: HTTP ``status`` and a message for ``{"error": ...}``;
    ``param``: the request parameter a bound blames, where one does (a front names its own field)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None, *,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
        self.param = param


def json_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """The answer ``{"error": message}`` with ``status``."""
    return web.Response(
        status=status,
        body=json.dumps({"error": message}).encode("utf-8"),
        content_type=oip.JSON_CONTENT_TYPE,
        headers=dict(headers or {}),
    )
