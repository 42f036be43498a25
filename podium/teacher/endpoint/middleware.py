"""What every request passes through: its request id, errors answered as JSON, bearer-token auth.

Every response carries ``X-Request-ID`` (the request's header, else a new one; an infer request's
JSON ``id`` replaces it) and ``X-Podium-Generation`` (errors too: a client tells which generation
answered). An exception a route raises becomes a JSON ``{"error": ...}`` answer (OpenAI's
``{"error": {"message", ...}}`` on the scoring fronts' routes; 500 for an unexpected one: one
request never takes the server down), its message's first words in the HTTP reason phrase, logged
(rate-limited, never the token), with ``X-Podium-Error-Kind``: ``refused``
for every 4xx, ``request-failed`` for a 500 (a 503 names its own kind where it is made). Each infer
answer's (and each scoring front's) status and body bytes are counted (:func:`body_bytes`). Every
route but liveness and metrics (metrics too with ``podium.server.metrics_need_token``) needs the
run's token (:func:`auth_middleware`: a bearer header; on the scoring fronts also HTTP Basic or a
token URL).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from podium.protocol import oip
from podium.protocol.names import (
    AUTHORIZATION,
    ERROR_KIND_HEADER,
    ERROR_REFUSED,
    ERROR_REQUEST_FAILED,
    GENERATION_HEADER,
    HEALTH_LIVE,
    METRICS,
    OPENAI_BASE,
    OPENAI_COMPLETIONS,
    OPENAI_MODELS,
    PLAIN_HEALTH,
    REQUEST_ID_HEADER,
    SGLANG_GENERATE,
    TOKEN_PATH,
    VLLM_TOKEN_GENERATE,
)
from podium.rendezvous.token import tokens_equal
from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.endpoint.metrics import EndpointMetrics
from podium.web.auth import check_authorization
from podium.web.errors import RequestError, json_error, openai_error

logger = logging.getLogger(__name__)

# the scoring fronts' computing routes, counted as infer
SCORING_ROUTES = (OPENAI_COMPLETIONS, SGLANG_GENERATE, VLLM_TOKEN_GENERATE)
# every route of the scoring fronts (each also under a token URL; Basic auth taken there)
FRONT_ROUTES = (*SCORING_ROUTES, OPENAI_MODELS, PLAIN_HEALTH)

TOKEN_MATCH = "token"  # the path segment of a token URL's routes (``TOKEN_PATH/{token}/...``)


def without_token(path: str) -> str:
    """The route ``path`` names: a token URL's ``/token/<token>`` prefix removed."""
    if path.startswith(TOKEN_PATH + "/"):
        return "/" + path[len(TOKEN_PATH) + 1:].partition("/")[2]
    return path


def shown_path(path: str) -> str:
    """``path`` as errors and logs show it: never the token a token URL carries."""
    return f"{TOKEN_PATH}/<token>{without_token(path)}" if path.startswith(TOKEN_PATH + "/") else path


# Per-request storage key for the request id (typed key where aiohttp has them).
REQUEST_ID: Any = web.RequestKey("podium_request_id", str) if hasattr(web, "RequestKey") else "podium_request_id"


def openai_shaped(path: str) -> bool:
    """Whether a refusal on ``path`` is written in OpenAI's error shape: the scoring fronts' routes,
    anything under ``/v1/`` or a token URL (what OpenAI, vLLM and SGLang clients call)."""
    route = without_token(path)
    return route in FRONT_ROUTES or route.startswith(OPENAI_BASE + "/") or path.startswith(TOKEN_PATH + "/")


class RefusalLog:
    """Each refused request logged by the teacher, at most :attr:`limit` lines per :attr:`window_s`
    (a client that loops on a bad request fills no disk), then one line counting those left out;
    never the token (a token URL's path is shown without it, and the token is cut from any text)."""

    def __init__(self, token: str, *, limit: int = 20, window_s: float = 60.0) -> None:
        self.token = token
        self.limit = limit
        self.window_s = window_s
        self._start = -math.inf
        self._logged = 0
        self._left_out = 0

    def refused(self, request: web.Request, status: int, message: str) -> None:
        now = time.monotonic()
        if now - self._start >= self.window_s:
            if self._left_out:
                logger.warning("%d more refused requests in the last %.0f s were not logged", self._left_out,
                               now - self._start)
            self._start, self._logged, self._left_out = now, 0, 0
        if self._logged >= self.limit:
            self._left_out += 1
            return
        self._logged += 1
        line = (f"refused {request.method} {shown_path(request.path)} from {request.remote or '?'} "
                f"(request {request.get(REQUEST_ID, '?')}): HTTP {status}: {message}")
        logger.warning("%s", line.replace(self.token, "<token>") if self.token else line)


def error_middleware(config: EndpointConfig, metrics: EndpointMetrics) -> Middleware:
    """Request id in, errors out as JSON (OpenAI's shape on the fronts' routes: :func:`openai_shaped`),
    each with its reason phrase and logged (:class:`RefusalLog`), infer answers counted in ``metrics``."""
    refusals = RefusalLog(config.token)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        request[REQUEST_ID] = request_id
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never let one request take the server down
            refusal = _refusal(exc, request, config)
            if refusal.status < 500 or refusal.status == 503:
                refusals.refused(request, refusal.status, refusal.message)
            if openai_shaped(request.path):
                response = openai_error(refusal.status, refusal.message, refusal.headers, param=refusal.param)
            else:
                response = json_error(refusal.status, refusal.message, refusal.headers)
        if response.status >= 400 and ERROR_KIND_HEADER not in response.headers and response.status != 503:
            # every refusal says so; an unexpected failure is this request's (a 503 names its own kind)
            response.headers[ERROR_KIND_HEADER] = ERROR_REFUSED if response.status < 500 else ERROR_REQUEST_FAILED
        route = without_token(request.path)
        if request.method == "POST" and (route.endswith("/infer") or route in SCORING_ROUTES):
            metrics.answered(response.status)
            metrics.sent(body_bytes(response))
        response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID]
        if config.generation is not None and GENERATION_HEADER not in response.headers:
            response.headers[GENERATION_HEADER] = str(config.generation)  # errors too: who answered
        return response

    return middleware


def _refusal(exc: Exception, request: web.Request, config: EndpointConfig) -> RequestError:
    """What ``exc``, raised by a route, is answered with (an unexpected error is a 500, logged with
    its traceback; an HTTP exception under 400 is raised again)."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, oip.OIPError):
        return RequestError(exc.status, exc.message)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return RequestError(413, f"request body is larger than the limit of {config.body_limit} bytes ({exc.text})")
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        if exc.status == 404:
            return RequestError(404, f"no route {request.method} {shown_path(request.path)}")
        if exc.status == 405:
            return RequestError(405, f"method {request.method} not allowed on {shown_path(request.path)}")
        return RequestError(exc.status, exc.reason)
    logger.error("request %s %s failed", request.method, shown_path(request.path), exc_info=exc)
    return RequestError(500, f"internal error: {type(exc).__name__}: {exc}")


def body_bytes(response: web.StreamResponse) -> int:
    """The body bytes ``response`` sends: its Content-Length (``content_length``: a
    ``web.Response``'s body, or a ``StreamResponse`` that declares it, written by its handler or,
    as podium's streamed answers are, after the middleware; aiohttp sends no byte past it, and a
    stream cut short when its client went away counts whole); a chunked stream its handler wrote,
    what its writer sent (``body_length``: headers and chunk framing included)."""
    length = response.content_length
    if length is not None:
        return length
    return response.body_length if response.prepared else 0


def auth_middleware(token: str, metrics_need_token: bool = False) -> Middleware:
    """401 for a request without the run's ``token``: as ``Authorization: Bearer <token>``; on the
    scoring fronts' routes (:data:`FRONT_ROUTES`) also as HTTP Basic with the token as the password
    (any user name: what a client makes of a base URL ``http://podium:<token>@host:port``), or in
    the path of a token URL (``TOKEN_PATH/<token>/...``). Liveness and the plain readiness probe
    need none (``/health`` under any token URL too: a readiness loop that retries a 401 forever
    must not meet one), nor metrics unless ``metrics_need_token``. Tokens are compared in constant
    time (:func:`~podium.rendezvous.token.tokens_equal`)."""
    open_paths = (HEALTH_LIVE, PLAIN_HEALTH) if metrics_need_token else (HEALTH_LIVE, PLAIN_HEALTH, METRICS)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        in_path = request.match_info.get(TOKEN_MATCH)
        route = request.path if in_path is None else without_token(request.path)
        if route in open_paths or (in_path is not None and route == PLAIN_HEALTH):
            return await handler(request)
        if in_path is not None:
            if not tokens_equal(in_path, token):
                raise RequestError(401, f"invalid token in the URL ({TOKEN_PATH}/<token>/...)")
            return await handler(request)
        check_authorization(request.headers.get(AUTHORIZATION, ""), token, basic=route in FRONT_ROUTES)
        return await handler(request)

    return middleware
