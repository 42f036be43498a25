"""How the endpoint refuses a request: :class:`RequestError`, answered in one of two JSON shapes.

Every bad request is a 4xx (a failed or unavailable group a 5xx) and the server keeps serving;
:mod:`~podium.teacher.endpoint.middleware` turns the exception into the answer: podium's own
routes answer ``{"error": message}`` (:func:`json_error`), the scoring fronts OpenAI's
``{"error": {"message", "type", "param", "code"}}`` (:func:`openai_error`: what the ``openai``
client, and SGLang's and vLLM's callers, read). Either way the HTTP reason phrase carries the
message's first words (:func:`reason_phrase`), so a client that shows only the status line
(aiohttp's ``ClientResponseError``: ``400, message='...'``) still says why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

from podium.protocol import oip

REASON_CHARS = 160  # the longest reason phrase: a status line, not the whole message


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


ASCII_FOR = str.maketrans({"×": "x", "…": "...", "≥": ">=", "≤": "<=", "–": "-", "—": "-", "‘": "'", "’": "'"})


def reason_phrase(message: str) -> str:
    """``message`` as an HTTP reason phrase: one line of printable ASCII (latin-1 safe whichever
    way a client decodes the status line; aiohttp writes it as UTF-8), cut to :data:`REASON_CHARS`
    with an ellipsis."""
    line = " ".join(message.translate(ASCII_FOR).split())
    line = "".join(c if " " <= c <= "~" else "?" for c in line)
    return line if len(line) <= REASON_CHARS else line[:REASON_CHARS - 3] + "..."


def json_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """The answer ``{"error": message}`` with ``status``."""
    return _answer(status, {"error": message}, message, headers)


def openai_error(status: int, message: str, headers: Mapping[str, str] | None = None, *,
                 param: str | None = None) -> web.Response:
    """A refusal as OpenAI-compatible servers write it (``{"error": {"message", "type", "param",
    "code"}}``: what the ``openai`` client reads into its exception's message; ``param``: the field
    at fault, where one is), with ``headers`` (``Retry-After`` of a 503)."""
    kind = ("AuthenticationError" if status == 401 else "NotFoundError" if status == 404
            else "BadRequestError" if status < 500 else "ServiceUnavailableError" if status == 503
            else "InternalError")
    return _answer(status, {"error": {"message": message, "type": kind, "param": param, "code": status}}, message,
                   headers)


def _answer(status: int, body: object, message: str, headers: Mapping[str, str] | None) -> web.Response:
    return web.Response(status=status, reason=reason_phrase(message), body=json.dumps(body).encode("utf-8"),
                        content_type=oip.JSON_CONTENT_TYPE, headers=dict(headers or {}))
