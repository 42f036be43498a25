"""The front's HTTP side: one aiohttp application that serves every alias of a run under its prefix.

Owns :class:`FrontApp`: each request's path is read (:func:`~podium.front.paths.parse_path`), its
token checked as the teachers check it (bearer, HTTP Basic's password, or a token URL:
:func:`~podium.web.auth.check_authorization`; ``/health`` is open), and it is relayed to the alias's
teacher through podium's client (:mod:`podium.front.relay`); what the client's rule ends a call with
becomes the caller's answer (:func:`refusal`): a teacher stopped for good is a 410 naming it and
when it stopped, one with no ready replica within the call's deadline a 503 with ``Retry-After``, a
teacher's own refusal (4xx) its answer as the teacher wrote it. The front itself answers
``/health`` (per alias and for the run) and ``/v1/models`` (the alias as the one model; the run's
aliases at the root), and routes ``/v1/completions`` at the root by its ``model`` field.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from podium.client.client import PodiumClient
from podium.client.errors import (
    PodiumClientError,
    TeacherRequestError,
    TeacherServerError,
    TeacherStoppedError,
    TeacherUnavailableError,
)
from podium.front.paths import Target, parse_path, shown
from podium.front.relay import CutOff, Relay, Workers, passed
from podium.protocol import oip
from podium.protocol.names import (
    AUTHORIZATION,
    CALLER_HEADER,
    ERROR_KIND_HEADER,
    ERROR_UNAVAILABLE,
    HEALTH_READY,
    OPENAI_BASE,
    OPENAI_COMPLETIONS,
    OPENAI_MODELS,
    PLAIN_HEALTH,
    REQUEST_ID_HEADER,
    RETRY_AFTER,
    SGLANG_GENERATE,
    VLLM_TOKEN_GENERATE,
)
from podium.rendezvous.token import tokens_equal
from podium.web.auth import check_authorization
from podium.web.errors import RequestError, json_error, openai_error

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # what a 503 of the front asks its caller to wait
HEALTH_WAIT_S = 2.0  # a health probe of an alias looks this long for a replica that answers
FORWARDED = ("Content-Type", oip.HEADER_LENGTH, REQUEST_ID_HEADER, "Accept")  # request headers passed on


def openai_route(route: str) -> bool:
    """Whether a refusal on ``route`` is written in OpenAI's shape (what vLLM's and SGLang's callers read)."""
    return route.startswith(OPENAI_BASE + "/") or route in (SGLANG_GENERATE, VLLM_TOKEN_GENERATE)


def refusal(exc: PodiumClientError, last: tuple[Any, memoryview] | None) -> RequestError | web.Response:
    """What a call the client's rule ended with ``exc`` is answered with; ``last``: the teacher's
    last whole answer (its own refusal goes back as it wrote it)."""
    if isinstance(exc, TeacherStoppedError):
        return RequestError(410, str(exc))
    if isinstance(exc, (TeacherRequestError, TeacherServerError)) and exc.status is not None and last is not None:
        headers, body = last
        return web.Response(status=exc.status, body=bytes(body), headers=passed(headers))
    if isinstance(exc, TeacherUnavailableError):
        return RequestError(503, str(exc), {RETRY_AFTER: str(RETRY_AFTER_S), ERROR_KIND_HEADER: ERROR_UNAVAILABLE})
    if isinstance(exc, (TeacherRequestError, TeacherServerError)) and exc.status is not None:
        return RequestError(exc.status, str(exc))
    return RequestError(502, str(exc))  # failed for good (TeacherFailedError), or died under it too often


class FrontApp:
    """Every alias of one run behind one listener (see the module doc)."""

    def __init__(self, client: PodiumClient, token: str, *, auth: bool = True, call_timeout_s: float | None = None,
                 workers: int = 64) -> None:
        self.client = client
        self.token = token
        self.auth = auth
        self.call_timeout_s = call_timeout_s
        self.workers = Workers(workers)
        self.stopped_at: float | None = None

    def application(self, max_body_bytes: int) -> web.Application:
        app = web.Application(client_max_size=max_body_bytes, middlewares=[self._errors])
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def close(self) -> None:
        self.workers.shutdown(wait=False)
        self.client.close()

    # ------------------------------------------------------------------ every request

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = parse_path(request.path).route
        try:
            return await handler(request)
        except asyncio.CancelledError:
            raise
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            too_large = f"request body too large ({exc.text})"
            error = RequestError(exc.status, too_large if exc.status == 413 else exc.reason)
        except RequestError as exc:
            error = exc
        except Exception as exc:  # one request never takes the front down
            logger.error("front: %s %s failed", request.method, shown(request.path), exc_info=exc)
            error = RequestError(500, f"podium front: internal error: {type(exc).__name__}: {exc}")
        if error.status < 500 or error.status == 503:
            logger.info("front: %s %s: HTTP %d: %s", request.method, shown(request.path), error.status,
                        error.message.replace(self.token, "<token>"))
        if openai_route(route):
            return openai_error(error.status, error.message, error.headers, param=error.param)
        return json_error(error.status, error.message, error.headers)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        target = parse_path(request.path)
        if target.route == PLAIN_HEALTH and request.method in ("GET", "HEAD"):
            return await self.health(target.alias)
        self._authorize(request, target)
        if target.alias is None:
            return await self._root(request, target)
        alias = self.known(target.alias)
        if target.route == OPENAI_MODELS and request.method == "GET":
            return await self.models(request, alias)
        return await self.forward(request, alias, target.route)

    def _authorize(self, request: web.Request, target: Target) -> None:
        if not self.auth:
            return
        if target.token is not None:
            if not tokens_equal(target.token, self.token):
                raise RequestError(401, "invalid token in the URL (.../token/<token>/...)")
            return
        check_authorization(request.headers.get(AUTHORIZATION, ""), self.token, basic=True)

    def known(self, alias: str) -> str:
        aliases = self.client.aliases()
        if alias not in aliases:
            raise RequestError(404, f"run {self.client.run_name!r} has no alias {alias!r}; its aliases: {aliases} "
                                    f"(base URLs http://<front>/<alias>)")
        return alias

    async def _root(self, request: web.Request, target: Target) -> web.StreamResponse:
        if target.route == OPENAI_MODELS and request.method == "GET":
            now = int(time.time())
            data = [{"id": a, "object": "model", "created": now, "owned_by": "podium"} for a in self.client.aliases()]
            return web.json_response({"object": "list", "data": data})
        if target.route == OPENAI_COMPLETIONS and request.method == "POST":
            body = await request.read()
            try:
                model = json.loads(body).get("model")
            except (ValueError, AttributeError):
                model = None
            if not isinstance(model, str):
                raise RequestError(400, f"field 'model' must name an alias of the run: {self.client.aliases()}",
                                   param="model")
            return await self.forward(request, self.known(model), target.route, body)
        raise RequestError(404, f"no route {request.method} {shown(request.path)} at the front's root; each alias "
                                f"is served under http://<front>/<alias> ({self.client.aliases()})")

    # ------------------------------------------------------------------ what the front answers itself

    async def health(self, alias: str | None) -> web.Response:
        """200 while the alias (the root: every alias) has a ready replica, else 503 + Retry-After."""
        aliases = [self.known(alias)] if alias is not None else self.client.aliases()
        loop = asyncio.get_running_loop()
        why = await asyncio.gather(*(loop.run_in_executor(None, self._not_ready, a) for a in aliases))
        states = {a: w or "ready" for a, w in zip(aliases, why, strict=True)}
        if not any(why):
            return web.json_response({"status": "ready", "aliases": states})
        return web.json_response({"status": "not ready", "aliases": states}, status=503,
                                 headers={RETRY_AFTER: str(RETRY_AFTER_S)})

    def _not_ready(self, alias: str) -> str | None:
        """None when a replica of the alias answers its readiness probe, sent as any call is (so a
        replica that went away is found out, and one that came back is found), within
        :data:`HEALTH_WAIT_S`; else why not."""
        try:
            self.client.teacher(alias).send("GET", HEALTH_READY, timeout_s=HEALTH_WAIT_S)
        except PodiumClientError as exc:
            return str(exc)
        return None

    async def models(self, request: web.Request, alias: str) -> web.StreamResponse:
        """The teacher's ``/v1/models``, the alias as its one model."""
        answer = await self.forward(request, alias, OPENAI_MODELS)
        if answer.status != 200 or not isinstance(answer, web.Response) or not isinstance(answer.body, bytes):
            return answer
        listed = json.loads(answer.body).get("data") or [{"object": "model", "owned_by": "podium"}]
        first = next((m for m in listed if m.get("id") == alias), listed[0])
        return web.json_response({"object": "list", "data": [{**first, "id": alias}]})

    # ------------------------------------------------------------------ relayed

    async def forward(self, request: web.Request, alias: str, route: str,
                      body: bytes | None = None) -> web.StreamResponse:
        """``route`` of the alias's teacher, with the request's body and headers (the run's token added
        by the client); its answer, streamed when binary."""
        if body is None and request.can_read_body:
            body = await request.read()
        headers = {name: request.headers[name] for name in FORWARDED if name in request.headers}
        headers.setdefault(REQUEST_ID_HEADER, uuid.uuid4().hex)
        headers[CALLER_HEADER] = request.headers.get(CALLER_HEADER) or f"front:{request.remote or '?'}"
        path = f"{route}?{request.query_string}" if request.query_string else route
        loop = asyncio.get_running_loop()
        teacher = self.client.teacher(alias)
        relay = Relay(request, loop)
        try:
            resp, _ = await loop.run_in_executor(self.workers, relay.send, teacher, request.method, path, body,
                                                 headers, self.call_timeout_s)
        except (PodiumClientError, CutOff) as exc:
            if relay.stream is not None:  # part of an answer went out: the caller must not take it as whole
                logger.warning("front: %s %s: %s; the caller's connection is ended", request.method,
                               shown(request.path), exc)
                if request.transport is not None:
                    request.transport.close()
                return relay.stream
            if isinstance(exc, CutOff):
                raise
            answer = refusal(exc, relay.last)
            if isinstance(answer, RequestError):
                raise answer from None
            return answer
        if relay.stream is not None:
            await relay.stream.write_eof()
            return relay.stream
        return web.Response(status=resp.status, body=bytes(resp.body), headers=passed(resp.headers))
