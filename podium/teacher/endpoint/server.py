"""The endpoint's aiohttp server: its routes, readiness, admission and draining.

:class:`EndpointServer` serves one group (the route table is in :mod:`podium.teacher.endpoint`).
Its connections are bounded by :mod:`~podium.teacher.endpoint.connections` (deadlines, caps). An
infer request's body is read first (at most 2 × ``server.max_queue`` at once, each within its size and
time limits: :mod:`~podium.teacher.endpoint.body`), decoded and checked off the event loop, and
refused when it would cost too much (:mod:`~podium.teacher.endpoint.cost`); only then does it take
one of ``server.max_queue`` queue slots (queued or computing; beyond it 503 + ``Retry-After``), so
a stalled upload holds no slot. The requests of all callers are joined into batches by
:mod:`~podium.teacher.endpoint.batching` (computed by :mod:`~podium.teacher.endpoint.runner`); a
request whose client went away leaves the queue and never reaches the group. Every error answer names its kind
(``X-Podium-Error-Kind``, :meth:`EndpointServer.failure`). Readiness is set by the owner
of the teacher's lifecycle, with a reason when it is false; :meth:`EndpointServer.failure` says
what a group failure is answered with; draining answers 503 + ``Retry-After`` while queued
requests finish. It binds the first free port of ``server.port_range``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from podium.fds import connection_budget, raise_nofile_limit
from podium.net import http_url, listen_on_free_port
from podium.protocol import oip
from podium.protocol.batch import Batch
from podium.protocol.names import (
    CALLER_HEADER,
    ERROR_GROUP_BROKEN,
    ERROR_KIND_HEADER,
    ERROR_QUEUE_FULL,
    ERROR_UNAVAILABLE,
    HEALTH_LIVE,
    HEALTH_READY,
    METRICS,
    RETRY_AFTER,
    SERVER_METADATA,
)
from podium.protocol.query import Query
from podium.rendezvous.records import ModelInfo
from podium.teacher.endpoint import metadata, proof
from podium.teacher.endpoint.answer import infer_response, wire
from podium.teacher.endpoint.batching import QueuedRequest, RequestBatcher, RowBlocks
from podium.teacher.endpoint.body import BodyLimits, RawRequest, read_request
from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.endpoint.connections import ConnectionGuard, GuardedSite, guard_middleware
from podium.teacher.endpoint.cost import check_cost
from podium.teacher.endpoint.fronts import ScoringFronts
from podium.teacher.endpoint.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from podium.teacher.endpoint.metrics import EndpointMetrics
from podium.teacher.endpoint.middleware import REQUEST_ID, auth_middleware, error_middleware
from podium.teacher.endpoint.runner import GroupRunner, batch_tokens
from podium.teacher.endpoint.stream import AnswerSender
from podium.teacher.endpoint.validation import validate_request
from podium.teacher.seam import ServedGroup
from podium.web.errors import RequestError

logger = logging.getLogger(__name__)

READING_PER_SLOT = 2  # bodies being read at once per queue slot: slow uploads wait for no slot
LISTEN_BACKLOG = 1024  # handshakes the kernel completes before the endpoint accepts (a burst of connections)


class EndpointServer:
    """The aiohttp application around one group (asyncio API: ``await start()``, ``await stop()``)."""

    def __init__(self, group: ServedGroup, config: EndpointConfig) -> None:
        self.group = group
        self.config = config
        self.facts = group.facts  # stated once the group is up: fixed while it serves
        self.vocab_size = self.facts.vocab_size
        self._names = {config.served_name, *config.aliases} | ({config.teacher_key} if config.teacher_key else set())
        self._ready = False  # until the lifecycle says so (set_ready), once the endpoint is published
        self._not_ready_reason = "starting"
        self._draining = False
        self._admitted = 0  # requests holding a queue slot: queued or computing
        self._reading = 0  # requests reading their body (no queue slot yet)
        self._served = 0
        self.abandoned = 0  # requests whose client went away before its answer
        self._idle: asyncio.Event | None = None
        self._batcher: RequestBatcher | None = None
        self.metrics = EndpointMetrics(config.teacher_key or config.served_name, lambda: self.queue_depth,
                                       lambda: self._batcher.queued_rows if self._batcher else 0,
                                       liveness=lambda: self.group.liveness,
                                       oldest_request_s=lambda: self._batcher.oldest_age_s() if self._batcher else 0.0)
        if config.generation is not None:
            self.metrics.set_generation(str(config.generation.job_id), config.generation.restart)
        self._group_runner = GroupRunner(group, self.metrics)
        # decoding, checking and encoding bodies: CPU work that would stall health probes on the loop
        self._codec = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="podium-codec")
        settings = config.server
        self._body_limits = BodyLimits(config.body_limit, config.json_body_limit, settings.body_timeout_s)
        self.connections = ConnectionGuard(header_timeout_s=settings.header_timeout_s,
                                           idle_timeout_s=settings.idle_timeout_s,
                                           max_connections=settings.max_connections,
                                           max_connections_per_peer=settings.max_connections_per_peer)
        # large answers leave from the arrays' memory on threads of their own; a client that reads
        # nothing of one for body_timeout_s is cut off
        self.sender = AnswerSender(self.connections, stall_timeout_s=settings.body_timeout_s)
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self.port: int | None = None
        self.url: str | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def broken(self) -> str | None:
        """Why the group can serve no more, when it says so (its ``broken``), else None."""
        broken = self.group.broken
        return str(broken) if broken else None

    def _why_not_ready(self) -> str | None:
        """None when ready; else why not (the one place that decides readiness)."""
        if self._draining:
            return "draining"
        if not self._ready:
            return self._not_ready_reason
        broken = self.broken
        return f"group broken: {broken}" if broken else None

    @property
    def ready(self) -> bool:
        return self._why_not_ready() is None

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queue_depth(self) -> int:
        """Requests queued or in the group's batch (one whose client went away while the group computes
        it too: the group is busy with it); requests still reading their body not included."""
        return self._batcher.depth if self._batcher is not None else 0

    @property
    def codec(self) -> concurrent.futures.Executor:
        """The threads that decode, check and encode bodies off the event loop."""
        return self._codec

    @property
    def served(self) -> int:
        """Requests answered 200."""
        return self._served

    def _update_idle(self) -> None:
        if self._idle is not None:
            if self._admitted == 0 and self._reading == 0 and self.queue_depth == 0:
                self._idle.set()
            else:
                self._idle.clear()

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Readiness as the teacher's lifecycle sees it; ``reason`` says why it is not ready."""
        self._ready = ready
        self._not_ready_reason = "" if ready else (reason or "not ready")

    def model_info(self) -> ModelInfo:
        return metadata.model_info(self.facts, self.config)

    def metadata(self) -> dict[str, Any]:
        """The model metadata answer, with this server's state."""
        return metadata.model_metadata(self.config, self.model_info(), {
            "ready": self.ready,
            "draining": self._draining,
            "queue_depth": self.queue_depth,
            "admitted": self._admitted,
            "reading": self._reading,
            "max_queue": self.config.server.max_queue,
            "abandoned": self.abandoned,
            "served": self._served,
        }, self.facts)

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.body_limit,
            middlewares=[guard_middleware(self.connections), error_middleware(self.config, self.metrics),
                         auth_middleware(self.config.token, self.config.server.metrics_need_token)],
        )
        app.router.add_get(HEALTH_LIVE, self._live)
        app.router.add_get(METRICS, self._metrics)
        app.router.add_get(HEALTH_READY, self._ready_route)
        app.router.add_get(SERVER_METADATA, self._server_metadata)
        proof.install(app, self.config)  # GET /v2/podium/proof: who this is, before any token
        ScoringFronts(self).install(app)  # vLLM's /v1/completions and /v1/models, SGLang's /generate
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            app.router.add_get(prefix, self._model_metadata)
            app.router.add_get(prefix + "/ready", self._model_ready)
            app.router.add_post(prefix + "/infer", self._infer)
        return app

    async def start(self) -> str:
        """Bind, start serving, return the URL."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._batcher = RequestBatcher(self._group_runner.compute,
                                       batch_tokens=batch_tokens(self.facts, self.config.batch_tokens),
                                       max_delay_s=self.config.server.max_queue_delay_ms / 1000.0,
                                       batch_requests=self.config.server.batch_requests,
                                       on_batch=self._group_runner.observe, on_change=self._update_idle,
                                       broken=lambda: self.broken is not None)
        self._batcher.start()
        raise_nofile_limit()
        budget = connection_budget()
        if budget is not None and budget < self.connections.max_connections:
            logger.warning("teacher %r: at most %d connections (the open-files limit allows no more than "
                           "podium.server.max_connections %d)", self.config.served_name, budget,
                           self.connections.max_connections)
            self.connections.max_connections = budget
            self.connections.max_connections_per_peer = min(self.connections.max_connections_per_peer, budget)
        self.connections.start()
        self._sock = listen_on_free_port(self.config.host, self.config.server.port_range, backlog=LISTEN_BACKLOG)
        self.port = self._sock.getsockname()[1]
        # handler_cancellation: a request whose client went away is cancelled (aiohttp >= 3.9 does
        # not by default), so a queued one leaves the queue instead of computing for nobody.
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0,
                                     handler_cancellation=True)
        await self._runner.setup()
        await GuardedSite(self._runner, self._sock, self.connections, backlog=LISTEN_BACKLOG).start()
        host = self.config.advertise_host or self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        self.url = http_url(host, self.port)
        logger.info("teacher %r serving at %s (generation %s)",
                    self.config.served_name, self.url, self.config.generation)
        return self.url

    def drain(self) -> None:
        """From now on: ready is 503, new infer requests are 503 + Retry-After; queued ones finish."""
        if not self._draining:
            logger.info("teacher %r draining (%d requests queued)", self.config.served_name, self.queue_depth)
        self._draining = True

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no request is queued or running; False on timeout."""
        assert self._idle is not None
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def stop(self, grace_s: float = 30.0) -> None:
        """Drain, wait up to ``grace_s`` for queued requests, then close the listener."""
        self.drain()
        if self._idle is not None and not await self.wait_idle(grace_s):
            logger.warning("teacher %r: %d requests still queued after %.0fs; closing",
                           self.config.served_name, self.queue_depth, grace_s)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._batcher is not None:
            await self._batcher.stop()
        await self.connections.stop()
        self._group_runner.shutdown()
        self.sender.shutdown()
        self._codec.shutdown(wait=False, cancel_futures=True)
        logger.info("teacher %r stopped serving at %s after %d requests",
                    self.config.served_name, self.url, self._served)

    # ------------------------------------------------------------------ routes

    def _check_model(self, request: web.Request) -> None:
        name = request.match_info["name"]
        if name not in self._names:
            raise RequestError(404, f"unknown model {name!r}; this endpoint serves {self.config.served_name!r} "
                               f"(aliases: {', '.join(sorted(self._names))})")
        version = request.match_info.get("version")
        if version is not None and version != self.config.model_version:
            raise RequestError(404, f"model {name!r} has no version {version!r} "
                                    f"(versions: {self.config.model_version})")

    def _retry_after(self) -> dict[str, str]:
        return {RETRY_AFTER: str(self.config.retry_after_s)}

    def not_ready(self) -> RequestError:
        """The 503 a route that needs a serving teacher answers while it does not serve."""
        why = self._why_not_ready()
        what = "draining" if why == "draining" else f"not ready ({why})"
        # Never computed: the client goes elsewhere and counts no crash against this request.
        headers = {**self._retry_after(), ERROR_KIND_HEADER: ERROR_UNAVAILABLE}
        return RequestError(503, f"teacher {self.config.served_name!r} is {what}", headers)

    def _queue_full(self, what: str) -> RequestError:
        return RequestError(503, f"teacher {self.config.served_name!r} queue is full: {what}; retry later",
                            {**self._retry_after(), ERROR_KIND_HEADER: ERROR_QUEUE_FULL})

    def failure(self, exc: Exception) -> RequestError:
        """What a batch that raised ``exc`` is answered with (the batcher has computed a
        failed batch's requests again one at a time, so ``exc`` is this request's own unless the
        group broke).

        - any error while the teacher is no longer ready (the lifecycle said so with
          :meth:`set_ready`, it is draining, or the group says it is ``broken``): 503 +
          ``Retry-After``, kind ``group-broken`` when the group is broken, "teacher ... is
          unavailable: <cause>". The group broke under the request (a worker died, a node was
          lost); the same request succeeds on the next generation, and the client retries it there;
        - ``ValueError`` while ready: 400 (kind ``refused``), the group refuses what it cannot serve
          (a layout's limit, say);
        - any other error while ready: 500, kind ``request-failed``. The group still works, so this
          request itself failed it (an out-of-memory, a bug): retrying it would fail the same way.

        Readiness is read when the failure is answered, so a lifecycle that marks the teacher not
        ready while the call is failing (or a group that marks itself broken as it raises, as
        ``TeacherWorkerGroup`` does) turns the answer into a 503.
        """
        name = self.config.served_name
        cause = f"{type(exc).__name__}: {exc}"
        why = self._why_not_ready()
        if why is not None:
            headers = self._retry_after()
            if self.broken is not None:
                headers[ERROR_KIND_HEADER] = ERROR_GROUP_BROKEN
            return RequestError(503, f"teacher {name!r} is unavailable ({why}): {cause}", headers)
        if isinstance(exc, ValueError):
            return RequestError(400, f"rejected by the teacher: {exc}")
        return RequestError(500, f"teacher {name!r} failed: {cause}")

    async def _live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _ready_route(self, request: web.Request) -> web.Response:
        if not self.ready:
            raise self.not_ready()
        generation = str(self.config.generation) if self.config.generation else None
        return web.json_response({"ready": True, "generation": generation})

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(metadata.server_metadata())

    async def _model_metadata(self, request: web.Request) -> web.Response:
        self._check_model(request)
        return web.json_response(self.metadata())

    async def _model_ready(self, request: web.Request) -> web.Response:
        self._check_model(request)
        return await self._ready_route(request)

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        self._check_model(request)
        return await self.admit(request, self._admitted_infer)

    async def admit(self, request: web.Request,
                    handle: Callable[[web.Request, RawRequest], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """A request through admission (every route that computes: OIP's infer, the scoring fronts):
        ready, its body read within bounds, then a queue slot while ``handle`` answers it."""
        if not self.ready:
            raise self.not_ready()
        limit = self.config.server.max_queue
        if self._reading >= READING_PER_SLOT * limit:  # bodies being read at once (each bounded in time)
            raise self._queue_full(f"{self._reading} request bodies being read ({READING_PER_SLOT} × max_queue "
                                   f"{limit})")
        self._reading += 1
        self._update_idle()
        try:
            raw = await read_request(request, self._body_limits)
        finally:
            self._reading -= 1
            self._update_idle()
        if self._admitted >= limit:
            raise self._queue_full(f"{self._admitted} requests queued or running (max_queue {limit})")
        self._admitted += 1  # a slot once the body is here: a stalled upload holds none
        self._update_idle()
        try:
            return await handle(request, raw)
        finally:
            self._admitted -= 1
            self._update_idle()

    async def _run(self, batch: Batch, query: Query, request_id: str, caller: str) -> dict[str, RowBlocks]:
        """The request through the batcher (joined with other callers' rows). Cancelled (its
        client went away) before its first rows were sent, it leaves the queue and never reaches
        the group; mid-way, no more of its rows are sent and its answer is dropped. Either way it
        counts in :attr:`abandoned`."""
        assert self._batcher is not None, "endpoint not started"
        loop = asyncio.get_running_loop()
        queued = QueuedRequest(request_id, caller, batch, query, loop.create_future(),
                               seq_multiple=self.facts.sequence_length_multiple)
        self._batcher.submit(queued)
        self._update_idle()
        try:
            result = await queued.future
        except asyncio.CancelledError:
            self.abandoned += 1
            self.metrics.abandoned_request()
            if queued.started is None:
                logger.info("request %s: the client went away while it was queued; dropped before the group",
                            request_id)
            else:
                logger.info("request %s: the client went away while the group computes it; the answer will "
                            "not be sent", request_id)
            raise
        except Exception as exc:
            answer = self.failure(exc)
            self.metrics.failed("rejected" if answer.status < 500 else "group")
            if answer.status >= 500:
                logger.error("teacher %r: get_logprobs failed (request %s): HTTP %d: %s: %s", self.config.served_name,
                             request_id, answer.status, type(exc).__name__, exc, exc_info=exc)
            raise answer from None
        finally:
            self._update_idle()
        return result

    async def score(self, batch: Batch, query: Query, request: web.Request) -> dict[str, RowBlocks]:
        """A checked request computed as ``/infer`` computes it (batched with other callers' rows),
        counted as served."""
        caller = request.headers.get(CALLER_HEADER) or request.remote or "?"
        result = await self._run(batch, query, request[REQUEST_ID], caller)
        self._served += 1
        self.metrics.served(batch.rows, batch.tokens)
        return result

    def _check(self, req: oip.InferRequest) -> tuple[Batch, Query]:
        """The request checked against the model and its cost (on a codec thread)."""
        batch, query = validate_request(req, vocab_size=self.vocab_size,
                                        max_sequence_length=self.facts.max_sequence_length, max_top_k=None,
                                        hidden_states_refusal=self.facts.hidden_states_refusal)
        check_cost(self.config, batch, query, {name: req.wants_binary(name) for name in query.outputs},
                   self.vocab_size, hidden_size=self.facts.hidden_size)
        return batch, query

    async def _admitted_infer(self, request: web.Request, raw: RawRequest) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        req = await loop.run_in_executor(self._codec, raw.decode)
        request_id = req.id or request[REQUEST_ID]
        request[REQUEST_ID] = request_id
        batch, query = await loop.run_in_executor(self._codec, self._check, req)
        started = time.perf_counter()
        caller = request.headers.get(CALLER_HEADER) or request.remote or "?"
        result = await self._run(batch, query, request_id, caller)
        self._served += 1
        self.metrics.served(batch.rows, batch.tokens)
        logger.debug("request %s: %s in %.3fs", request_id, list(batch.input_ids.shape), time.perf_counter() - started)
        missing = [name for name in query.outputs if name not in result]
        if missing:
            raise RequestError(500, f"teacher {self.config.served_name!r} returned no {missing}")
        return await loop.run_in_executor(self._codec, self._encode, req, result, query, request_id)

    def _encode(self, req: oip.InferRequest, result: dict[str, RowBlocks], query: Query,
                request_id: str) -> web.StreamResponse:
        """The answer, each output in its wire dtype (on a codec thread)."""
        wired = {name: wire(name, array, query, self.vocab_size) for name, array in result.items()}
        return infer_response(self.config, req, wired, query, request_id, self.sender)
