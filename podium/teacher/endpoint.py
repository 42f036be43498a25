"""The teacher's HTTP endpoint: its worker group served over the Open Inference Protocol (KServe v2).

Owns the aiohttp server on the teacher's head node: routes, bearer-token auth, request validation
(every bad request is a 4xx JSON ``{"error": ...}`` and the server keeps serving; the batch rule
itself is ``podium.protocol.batch``), reading a body (a binary request's declared tensor sizes are
checked against ``Content-Length`` before room for them is allocated), the bounded queue in front
of the group (``max_queue`` requests at once, beyond it 503 + ``Retry-After``; the requests of all
callers batched into group calls by ``podium.teacher.scheduler``, one call at a time, on an
executor thread so health probes answer while the group computes; a request whose client went
away leaves the queue and never reaches the group), metrics (``podium.teacher.metrics``), readiness (set by the owner of the
teacher's lifecycle, ``podium.launcher.lifecycle``, with a reason when it is false), what a group
failure is answered with (:meth:`EndpointServer.failure`), draining (503 + ``Retry-After``), and
binding a free port of a range. It serves and reports; it publishes nothing: the lifecycle owns the
endpoint record. The wire codec is ``podium.protocol.oip``.

=====  ==========================================  =====  ========================================
verb   route                                       auth   answer
=====  ==========================================  =====  ========================================
GET    /v2/health/live                             no     200 while the process serves HTTP
GET    /metrics                                    no     Prometheus text (``podium.teacher.metrics``)
GET    /v2/health/ready                            yes    200 once the owner says ready, 503 when
                                                          not ready (with the reason) or draining
GET    /v2                                         yes    server metadata (extensions)
GET    /v2/models/<name>[/versions/<v>]            yes    model metadata + podium's fields
GET    /v2/models/<name>[/versions/<v>]/ready      yes    like /v2/health/ready, for that model
POST   /v2/models/<name>[/versions/<v>]/infer      yes    logprobs (+ top-k) for input_ids and
                                                          input_lengths
=====  ==========================================  =====  ========================================

``<name>`` may be the teacher's served name (its first alias), any of its aliases, or its key.
Every response carries ``X-Request-ID`` (the request's header or JSON ``id``, else a new one) and
``X-Podium-Generation`` (errors too: a client tells which generation answered).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

import numpy as np
from aiohttp import web

from podium.net import http_url, listen_on_free_port
from podium.protocol import oip
from podium.protocol.batch import Batch, BatchError, Options, validate_batch, validate_options
from podium.protocol.names import (
    AUTHORIZATION,
    CALLER_HEADER,
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    INDEX_DATATYPES,
    INDEX_OUTPUTS,
    INDICES_DATATYPE,
    INPUTS,
    TEMPERATURE,
    TOPK_LOGIT_INDICES,
    TOPK_LOGITS,
    TOPK_OUTPUTS,
    VALUE_DATATYPES,
    VALUE_OUTPUTS,
    VALUES_DATATYPE,
    GENERATION_HEADER,
    GENERATION_PARAMETER,
    HEALTH_LIVE,
    HEALTH_READY,
    ID_DATATYPES,
    INPUT_IDS,
    INPUT_LENGTHS,
    LOGPROBS,
    METRICS,
    MICRO_BATCH_SIZE,
    OUTPUTS,
    REQUEST_ID_HEADER,
    RETRY_AFTER,
    SERVER_METADATA,
    SERVER_NAME,
    SERVER_VERSION,
    TEACHER_HEADER,
    TOP_K,
    TOPK_INDICES,
    TOPK_LOGPROBS,
)
from podium.rendezvous.records import Generation, ModelInfo
from podium.rendezvous.token import tokens_equal
from podium.teacher.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from podium.teacher.metrics import EndpointMetrics
from podium.teacher.scheduler import CALL_MICROBATCHES, Job, Scheduler, Segment

logger = logging.getLogger(__name__)

DEFAULT_PORT_RANGE = (23000, 23999)
DEFAULT_MAX_BODY_BYTES = 512 * 1024 * 1024
DEFAULT_RETRY_AFTER_S = 5
DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_QUEUE_DELAY_MS = 5.0
DEFAULT_CALL_TOKENS = 16384  # for a group that does not say its token budget
# Per-request storage key for the request id (typed key where aiohttp has them).
_REQUEST_ID: Any = web.RequestKey("podium_request_id", str) if hasattr(web, "RequestKey") else "podium_request_id"


class LogprobGroup(Protocol):
    """What the endpoint serves: ``podium.teacher.group.TeacherWorkerGroup``, or any stand-in.

    ``get_logprobs`` receives a validated :class:`~podium.protocol.batch.Batch` and returns the
    requested ``outputs`` ``[B, width, ...]`` (names of :mod:`podium.protocol.names`). A group may
    also have ``broken``: ``None``, or why it can serve no more (a worker died); the endpoint then
    answers not ready, and a failed call 503 (see :meth:`EndpointServer.failure`)."""

    vocab_size: int
    max_sequence_length: Optional[int]
    sequence_length_multiple: int

    def get_logprobs(self, data: Batch, micro_batch_size: Optional[int] = None, top_k: Optional[int] = None, *,
                     temperature: Optional[float] = None, outputs: Optional[tuple[str, ...]] = None) -> Mapping[str, Any]: ...


class RequestError(Exception):
    """A request the endpoint refuses: HTTP ``status`` and a message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str, headers: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class EndpointConfig:
    """How one endpoint serves: names, token, address, limits. ``token`` is never logged."""

    served_name: str
    token: str = field(repr=False)
    teacher_key: str = ""
    aliases: tuple[str, ...] = ()
    generation: Optional[Generation] = None
    host: str = "127.0.0.1"
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    advertise_host: Optional[str] = None  # host in the published URL (default: host, or the FQDN for 0.0.0.0)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    retry_after_s: int = DEFAULT_RETRY_AFTER_S
    max_queue: int = DEFAULT_MAX_QUEUE  # requests admitted at once (reading, queued, computing)
    max_queue_delay_ms: float = DEFAULT_MAX_QUEUE_DELAY_MS  # an idle group waits this long for company
    batch_requests: bool = True  # False: one request per group call, in arrival order
    call_tokens: Optional[int] = None  # tokens of one group call; default: the group's budget × DP × 2
    max_top_k: Optional[int] = None  # default: the vocabulary size
    model_name: Optional[str] = None
    tokenizer_fingerprint: Optional[str] = None
    tokenizer_vocab_size: Optional[int] = None
    model_version: str = "1"

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("endpoint: an auth token is required")
        lo, hi = self.port_range
        if not (0 <= lo <= hi <= 65535):
            raise ValueError(f"endpoint: bad port range {lo}-{hi}")
        if self.max_queue < 1:
            raise ValueError(f"endpoint: max_queue must be >= 1, got {self.max_queue}")


def _buffer(size: int) -> bytearray:
    """Room for ``size`` bytes of a request body (one place, so a test can watch what is allocated)."""
    return bytearray(size)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop is closed: the server is gone, nothing left to count
        pass


def _json_error(status: int, message: str, headers: Optional[Mapping[str, str]] = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps({"error": message}).encode("utf-8"),
        content_type=oip.JSON_CONTENT_TYPE,
        headers=dict(headers or {}),
    )


class EndpointServer:
    """The aiohttp application around one group (asyncio API: ``await start()``, ``await stop()``)."""

    def __init__(self, group: LogprobGroup, config: EndpointConfig) -> None:
        self.group = group
        self.config = config
        self.vocab_size = int(group.vocab_size)
        self.max_sequence_length: Optional[int] = getattr(group, "max_sequence_length", None)
        self.sequence_length_multiple = int(getattr(group, "sequence_length_multiple", 1) or 1)
        self._names = {config.served_name, *config.aliases} | ({config.teacher_key} if config.teacher_key else set())
        self._ready = False  # until the lifecycle says so (set_ready), once the endpoint is published
        self._not_ready_reason = "starting"
        self._draining = False
        self._admitted = 0  # requests holding a queue slot: reading their body, queued or computing
        self._served = 0
        self.abandoned = 0  # requests whose client went away before its answer
        self._idle: Optional[asyncio.Event] = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="podium-infer")
        self._scheduler: Optional[Scheduler] = None
        self.metrics = EndpointMetrics(config.teacher_key or config.served_name, lambda: self.queue_depth,
                                       lambda: self._scheduler.queued_rows if self._scheduler else 0)
        if config.generation is not None:
            self.metrics.set_generation(str(config.generation.job_id), config.generation.restart)
        self._runner: Optional[web.AppRunner] = None
        self._sock: Optional[socket.socket] = None
        self.port: Optional[int] = None
        self.url: Optional[str] = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def broken(self) -> Optional[str]:
        """Why the group can serve no more, when it says so (its ``broken``), else None."""
        broken = getattr(self.group, "broken", None)
        return str(broken) if broken else None

    def _why_not_ready(self) -> Optional[str]:
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
        """Requests queued or in the group's call (one whose client went away while the group computes
        it too: the group is busy with it); requests still reading their body not included."""
        return self._scheduler.depth if self._scheduler is not None else 0

    @property
    def served(self) -> int:
        """Requests answered 200."""
        return self._served

    def _update_idle(self) -> None:
        if self._idle is not None:
            if self._admitted == 0 and self.queue_depth == 0:
                self._idle.set()
            else:
                self._idle.clear()

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Readiness as the teacher's lifecycle sees it; ``reason`` says why it is not ready."""
        self._ready = ready
        self._not_ready_reason = "" if ready else (reason or "not ready")

    def model_info(self) -> ModelInfo:
        spec = getattr(self.group, "spec", None)
        return ModelInfo(
            served_name=self.config.served_name,
            model_name=self.config.model_name,
            checkpoint_path=str(getattr(self.group, "checkpoint_path", None) or "") or None,
            vocab_size=self.vocab_size,
            max_sequence_length=self.max_sequence_length,
            sequence_length_multiple=self.sequence_length_multiple,
            data_parallel_size=int(getattr(self.group, "data_parallel_size", 1) or 1),
            temperature=float(getattr(spec, "temperature", 1.0)),
            parallel_sizes=spec.parallel_sizes() if hasattr(spec, "parallel_sizes") else {},
            tokenizer_fingerprint=self.config.tokenizer_fingerprint,
            tokenizer_vocab_size=self.config.tokenizer_vocab_size,
        )

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[self._error_middleware, self._auth_middleware],
        )
        app.router.add_get(HEALTH_LIVE, self._live)
        app.router.add_get(METRICS, self._metrics)
        app.router.add_get(HEALTH_READY, self._ready_route)
        app.router.add_get(SERVER_METADATA, self._server_metadata)
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            app.router.add_get(prefix, self._model_metadata)
            app.router.add_get(prefix + "/ready", self._model_ready)
            app.router.add_post(prefix + "/infer", self._infer)
        return app

    @property
    def call_tokens(self) -> int:
        """Tokens of one group call: the setting, else the group's micro-batch budget for each DP
        replica, :data:`~podium.teacher.scheduler.CALL_MICROBATCHES` times."""
        if self.config.call_tokens:
            return int(self.config.call_tokens)
        budget = getattr(self.group, "max_tokens_per_microbatch", None)
        if not budget:
            return DEFAULT_CALL_TOKENS
        return int(budget) * int(getattr(self.group, "data_parallel_size", 1) or 1) * CALL_MICROBATCHES

    async def start(self) -> str:
        """Bind, start serving, return the URL."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._scheduler = Scheduler(self._call_group, call_tokens=self.call_tokens,
                                    max_delay_s=self.config.max_queue_delay_ms / 1000.0,
                                    batch_requests=self.config.batch_requests, on_call=self._observe_call,
                                    on_change=self._update_idle)
        self._scheduler.start()
        self._sock = listen_on_free_port(self.config.host, self.config.port_range)
        self.port = self._sock.getsockname()[1]
        # handler_cancellation: a request whose client went away is cancelled (aiohttp >= 3.9 does
        # not by default), so a queued one leaves the queue instead of computing for nobody.
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0,
                                     handler_cancellation=True)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()
        host = self.config.advertise_host or self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        self.url = http_url(host, self.port)
        logger.info("teacher %r serving at %s (generation %s)", self.config.served_name, self.url, self.config.generation)
        return self.url

    def drain(self) -> None:
        """From now on: ready is 503, new infer requests are 503 + Retry-After; queued ones finish."""
        if not self._draining:
            logger.info("teacher %r draining (%d requests queued)", self.config.served_name, self.queue_depth)
        self._draining = True

    async def wait_idle(self, timeout: Optional[float] = None) -> bool:
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
            logger.warning("teacher %r: %d requests still queued after %.0fs; closing", self.config.served_name, self.queue_depth, grace_s)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._scheduler is not None:
            await self._scheduler.stop()
        self._executor.shutdown(wait=False, cancel_futures=False)
        logger.info("teacher %r stopped serving at %s after %d requests", self.config.served_name, self.url, self._served)

    # ------------------------------------------------------------------ middlewares

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        request[_REQUEST_ID] = request_id
        try:
            response = await handler(request)
        except RequestError as exc:
            response = _json_error(exc.status, exc.message, exc.headers)
        except oip.OIPError as exc:
            response = _json_error(exc.status, exc.message)
        except web.HTTPRequestEntityTooLarge as exc:
            response = _json_error(413, f"request body is larger than the limit of {self.config.max_body_bytes} bytes ({exc.text})")
        except web.HTTPException as exc:
            if exc.status >= 400:
                detail = exc.reason
                if exc.status == 404:
                    detail = f"no route {request.method} {request.path}"
                elif exc.status == 405:
                    detail = f"method {request.method} not allowed on {request.path}"
                response = _json_error(exc.status, detail)
            else:
                raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never let one request take the server down
            logger.exception("request %s %s failed", request.method, request.path)
            response = _json_error(500, f"internal error: {type(exc).__name__}: {exc}")
        if request.method == "POST" and request.path.endswith("/infer"):
            self.metrics.answered(response.status)
        response.headers[REQUEST_ID_HEADER] = request[_REQUEST_ID]
        if self.config.generation is not None and GENERATION_HEADER not in response.headers:
            response.headers[GENERATION_HEADER] = str(self.config.generation)  # errors too: who answered
        return response

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if request.path not in (HEALTH_LIVE, METRICS):
            header = request.headers.get(AUTHORIZATION, "")
            scheme, _, given = header.partition(" ")
            if not header:
                raise RequestError(401, "missing Authorization: Bearer <token> header", {"WWW-Authenticate": "Bearer"})
            if scheme.lower() != "bearer" or not tokens_equal(given.strip(), self.config.token):
                raise RequestError(401, "invalid bearer token", {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return await handler(request)

    # ------------------------------------------------------------------ routes

    def _check_model(self, request: web.Request) -> None:
        name = request.match_info["name"]
        if name not in self._names:
            raise RequestError(404, f"unknown model {name!r}; this endpoint serves {self.config.served_name!r} "
                               f"(aliases: {', '.join(sorted(self._names))})")
        version = request.match_info.get("version")
        if version is not None and version != self.config.model_version:
            raise RequestError(404, f"model {name!r} has no version {version!r} (versions: {self.config.model_version})")

    def _retry_after(self) -> dict[str, str]:
        return {RETRY_AFTER: str(self.config.retry_after_s)}

    def _not_ready(self) -> RequestError:
        why = self._why_not_ready()
        what = "draining" if why == "draining" else f"not ready ({why})"
        return RequestError(503, f"teacher {self.config.served_name!r} is {what}", self._retry_after())

    def failure(self, exc: Exception) -> RequestError:
        """What a group call that raised ``exc`` is answered with.

        - ``ValueError``: 400, the group refuses what it cannot serve (a layout's limit, say);
        - any other error while the teacher is no longer ready (the lifecycle said so with
          :meth:`set_ready`, it is draining, or the group says it is ``broken``): 503 +
          ``Retry-After``, "teacher ... is unavailable: <cause>". The group broke under the request
          (a worker died, a node was lost); the same request succeeds on the next generation, and
          the client retries it there;
        - any other error while the teacher is still ready: 500. The group still works, so this
          request itself failed it (a bug): retrying it would fail the same way.

        Readiness is read when the failure is answered, so a lifecycle that marks the teacher not
        ready while the call is failing (or a group that marks itself broken as it raises, as
        ``TeacherWorkerGroup`` does) turns the answer into a 503.
        """
        name = self.config.served_name
        cause = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, ValueError):
            return RequestError(400, f"rejected by the teacher: {exc}")
        why = self._why_not_ready()
        if why is not None:
            return RequestError(503, f"teacher {name!r} is unavailable ({why}): {cause}", self._retry_after())
        return RequestError(500, f"teacher {name!r} failed: {cause}")

    async def _live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _ready_route(self, request: web.Request) -> web.Response:
        if not self.ready:
            raise self._not_ready()
        return web.json_response({"ready": True, "generation": str(self.config.generation) if self.config.generation else None})

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]})

    def metadata(self) -> dict[str, Any]:
        gen = self.config.generation
        info = self.model_info().model_dump(mode="json")
        return {
            "name": self.config.served_name,
            "versions": [self.config.model_version],
            "platform": "podium",
            "inputs": [
                {"name": INPUT_IDS, "datatype": "INT64", "shape": [-1, -1]},
                {"name": INPUT_LENGTHS, "datatype": "INT64", "shape": [-1]},
                {"name": CANDIDATE_IDS, "datatype": "INT64", "shape": [-1, -1, -1], "optional": True},
            ],
            "outputs": [
                {"name": LOGPROBS, "datatype": "FP32", "shape": [-1, -1]},
                {"name": TOPK_LOGPROBS, "datatype": "FP32", "shape": [-1, -1, -1]},
                {"name": TOPK_INDICES, "datatype": "INT64", "shape": [-1, -1, -1]},
                {"name": TOPK_LOGITS, "datatype": "FP32", "shape": [-1, -1, -1]},
                {"name": TOPK_LOGIT_INDICES, "datatype": "INT64", "shape": [-1, -1, -1]},
                {"name": CANDIDATE_LOGPROBS, "datatype": "FP32", "shape": [-1, -1, -1]},
            ],
            "podium": {
                **info,
                "teacher_key": self.config.teacher_key,
                "aliases": list(self.config.aliases),
                "generation": None if gen is None else {"job_id": gen.job_id, "restart": gen.restart},
                "accepted_input_datatypes": list(ID_DATATYPES),
                "parameters": {TOP_K: f"1..{self.config.max_top_k or self.vocab_size}", MICRO_BATCH_SIZE: ">= 1",
                               TEMPERATURE: "> 0", VALUES_DATATYPE: list(VALUE_DATATYPES),
                               INDICES_DATATYPE: list(INDEX_DATATYPES)},
                "ready": self.ready,
                "draining": self._draining,
                "queue_depth": self.queue_depth,
                "admitted": self._admitted,
                "max_queue": self.config.max_queue,
                "abandoned": self.abandoned,
                "served": self._served,
            },
        }

    async def _model_metadata(self, request: web.Request) -> web.Response:
        self._check_model(request)
        return web.json_response(self.metadata())

    async def _model_ready(self, request: web.Request) -> web.Response:
        self._check_model(request)
        return await self._ready_route(request)

    async def _read_into(self, request: web.Request, size: int, length: int, got: int) -> bytearray:
        """The next ``size`` bytes of a body of ``length`` (``got`` read before), in a new buffer."""
        buf = _buffer(size)
        view = memoryview(buf)
        filled = 0
        while filled < size:
            chunk = await request.content.read(size - filled)
            if not chunk:
                raise RequestError(400, f"body ended after {got + filled} of the {length} bytes its Content-Length "
                                   "announced")
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
        return buf

    async def _read_request(self, request: web.Request) -> oip.InferRequest:
        """Read and decode an infer request.

        With the binary extension, the JSON header (``Inference-Header-Content-Length`` bytes) is
        read and checked first; ``Content-Length`` must then be exactly the header plus the bytes
        its binary tensors declare, else 400 naming the tensor and the numbers, before room for
        those bytes is allocated. The binary part goes into one writable buffer: the tensors are
        numpy views of it and reach the group without a copy.
        """
        limit = self.config.max_body_bytes
        length = request.content_length
        header_value = request.headers.get(oip.HEADER_LENGTH)
        if length is not None and length > limit:
            raise RequestError(413, f"request body of {length} bytes is larger than the limit of {limit} bytes")
        if length is None:  # chunked: aiohttp enforces client_max_size while reading
            try:
                body = bytearray(await request.read())
            except web.HTTPRequestEntityTooLarge:
                raise RequestError(413, f"request body is larger than the limit of {limit} bytes") from None
            return oip.decode_request(body, oip.parse_header_length(header_value, len(body)))
        header_length = oip.parse_header_length(header_value, length)
        if header_length is None:
            return oip.decode_request(await self._read_into(request, length, length, 0))
        raw = await self._read_into(request, header_length, length, 0)
        head = oip.parse_request_head(raw, body_length=length, binary_follows=True)
        available = length - header_length
        try:
            head.check_binary_length(available)
        except oip.OIPError as exc:
            raise RequestError(400, f"{exc.message} (Content-Length {length} = {header_length} bytes of JSON header "
                               f"+ {available}; the binary tensors declare {head.binary_bytes})") from None
        binary = await self._read_into(request, available, length, header_length)
        return head.decode(binary)

    def _validate(self, req: oip.InferRequest) -> tuple[Batch, Options, list[str]]:
        """Check an infer request against the model; return (batch, options, outputs)."""
        unknown = sorted(set(req.inputs) - set(INPUTS))
        if unknown:
            raise RequestError(400, f"unknown input(s) {unknown}; this model takes {list(INPUTS)}")
        for name in INPUTS:
            if name not in req.inputs:
                if name == CANDIDATE_IDS:
                    continue
                raise RequestError(400, f"missing input {name!r}")
            tensor = req.inputs[name]
            if tensor.datatype not in ID_DATATYPES:
                raise RequestError(400, f"input {name!r}: datatype {tensor.datatype} not accepted; expected INT32 or INT64")
        cands = req.inputs.get(CANDIDATE_IDS)
        try:
            batch = validate_batch(req.inputs[INPUT_IDS].array, req.inputs[INPUT_LENGTHS].array,
                                   vocab_size=self.vocab_size, max_sequence_length=self.max_sequence_length,
                                   candidate_ids=cands.array if cands is not None else None)
            p = req.parameters
            opts = validate_options(top_k=p.get(TOP_K), micro_batch_size=p.get(MICRO_BATCH_SIZE),
                                    temperature=p.get(TEMPERATURE), values_datatype=p.get(VALUES_DATATYPE),
                                    indices_datatype=p.get(INDICES_DATATYPE),
                                    vocab_size=self.vocab_size, max_top_k=self.config.max_top_k)
        except BatchError as exc:
            raise RequestError(400, str(exc)) from None
        if req.outputs is None:
            outputs = [LOGPROBS] + ([TOPK_LOGPROBS, TOPK_INDICES] if opts.top_k else []) + (
                [CANDIDATE_LOGPROBS] if cands is not None else [])
        else:
            outputs = [o.name for o in req.outputs]
            unknown = sorted(set(outputs) - set(OUTPUTS))
            if unknown:
                raise RequestError(400, f"unknown output(s) {unknown}; this model has {list(OUTPUTS)}")
            needs_k = [o for o in outputs if o in TOPK_OUTPUTS]
            if not opts.top_k and needs_k:
                raise RequestError(400, f"outputs {'/'.join(needs_k)} need the request parameter 'top_k'")
            if CANDIDATE_LOGPROBS in outputs and cands is None:
                raise RequestError(400, f"output {CANDIDATE_LOGPROBS} needs the input {CANDIDATE_IDS!r}")
            if len(set(outputs)) != len(outputs):
                raise RequestError(400, f"an output is requested twice: {outputs}")
        if opts.values_datatype in oip.BINARY_ONLY:
            json_outputs = [o for o in outputs if o in VALUE_OUTPUTS and not req.wants_binary(o)]
            if json_outputs:
                raise RequestError(400, f"{VALUES_DATATYPE}={opts.values_datatype} travels only as binary data; "
                                   f"ask for {json_outputs} with binary_data")
        return batch, opts, outputs

    def _compute(self, batch: Batch, opts: Options, outputs: tuple[str, ...]) -> dict[str, np.ndarray]:
        """Runs on the executor thread: one group call (the scheduler's) at a time."""
        result = self.group.get_logprobs(batch, micro_batch_size=opts.micro_batch_size, top_k=opts.top_k,
                                         temperature=opts.temperature, outputs=outputs)
        out: dict[str, np.ndarray] = {}
        for name in OUTPUTS:
            if name in result and result[name] is not None:
                value = result[name]
                array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
                if array.shape[:2] != (batch.rows, batch.width):  # a broken group is a 500, never a wrong answer
                    raise RuntimeError(f"the group returned {name} of shape {list(array.shape)} for a batch of "
                                       f"{batch.rows} rows and width {batch.width}")
                out[name] = array
        return out

    async def _call_group(self, batch: Batch, job: Job) -> dict[str, np.ndarray]:
        """The scheduler's group call, on the executor thread (health probes answer meanwhile)."""
        outputs = tuple(o for o in OUTPUTS if o in job.outputs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._compute, batch, job.opts, outputs)

    def _observe_call(self, segments: "list[Segment]", seconds: float) -> None:
        stats = getattr(self.group, "last_call", None)
        tokens = sum(int(s.job.batch.input_lengths[s.start:s.end].sum()) for s in segments)
        waits = [s.job.started - s.job.enqueued for s in segments if s.start == 0 and s.job.started is not None]
        self.metrics.call(seconds=seconds, tokens=tokens, waits=waits,
                          computed_tokens=getattr(stats, "computed_tokens", None),
                          microbatches=getattr(stats, "microbatches", None))

    async def _infer(self, request: web.Request) -> web.Response:
        self._check_model(request)
        if not self.ready:
            raise self._not_ready()
        limit = self.config.max_queue
        if self._admitted >= limit:
            raise RequestError(503, f"teacher {self.config.served_name!r} queue is full: {self._admitted} requests "
                               f"queued or running (max_queue {limit}); retry later", self._retry_after())
        self._admitted += 1  # a slot from before the body is read: at most max_queue bodies in memory
        self._update_idle()
        try:
            return await self._admitted_infer(request)
        finally:
            self._admitted -= 1
            self._update_idle()

    async def _run(self, batch: Batch, opts: Options, outputs: list[str], request_id: str,
                   caller: str) -> dict[str, np.ndarray]:
        """The request through the scheduler (batched with other callers' rows). Cancelled (its
        client went away) before its first rows were sent, it leaves the queue and never reaches
        the group; mid-way, no more of its rows are sent and its answer is dropped. Either way it
        counts in :attr:`abandoned`."""
        assert self._scheduler is not None, "endpoint not started"
        loop = asyncio.get_running_loop()
        job = Job(request_id, caller, batch, opts, tuple(outputs), loop.create_future(),
                  seq_multiple=self.sequence_length_multiple)
        self._scheduler.submit(job)
        self._update_idle()
        try:
            result = await job.future
        except asyncio.CancelledError:
            self.abandoned += 1
            self.metrics.abandoned_request()
            if job.started is None:
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
        return {name: _wire(name, array, opts) for name, array in result.items()}

    async def _admitted_infer(self, request: web.Request) -> web.Response:
        req = await self._read_request(request)
        request_id = req.id or request[_REQUEST_ID]
        request[_REQUEST_ID] = request_id
        batch, opts, outputs = self._validate(req)
        started = time.perf_counter()
        caller = request.headers.get(CALLER_HEADER) or request.remote or "?"
        result = await self._run(batch, opts, outputs, request_id, caller)
        self._served += 1
        self.metrics.served(batch.rows, batch.tokens)
        logger.debug("request %s: %s in %.3fs", request_id, list(batch.input_ids.shape), time.perf_counter() - started)
        missing = [name for name in outputs if name not in result]
        if missing:
            raise RequestError(500, f"teacher {self.config.served_name!r} returned no {missing}")
        gen = str(self.config.generation) if self.config.generation is not None else ""
        chunks, header_len = oip.encode_response(
            self.config.served_name,
            [(name, result[name], req.wants_binary(name)) for name in outputs],
            model_version=self.config.model_version,
            request_id=req.id,
            parameters={GENERATION_PARAMETER: gen} if gen else None,
            datatypes={name: opts.values_datatype for name in outputs if name in VALUE_OUTPUTS},
        )
        headers = {REQUEST_ID_HEADER: request_id, GENERATION_HEADER: gen, TEACHER_HEADER: self.config.teacher_key}
        if header_len is not None:
            headers[oip.HEADER_LENGTH] = str(header_len)
            content_type = oip.BINARY_CONTENT_TYPE
        else:
            content_type = oip.JSON_CONTENT_TYPE
        return web.Response(body=oip.join(chunks), headers=headers, content_type=content_type)


def _wire(name: str, array: np.ndarray, opts: Options) -> np.ndarray:
    """An output as it travels: indices INT64 (top-k logit indices INT32 when asked), values
    float32 (top-k logits and candidate logprobs as BF16 bits when asked)."""
    if name in (TOPK_INDICES, *INDEX_OUTPUTS):
        return array.astype(np.int32 if name in INDEX_OUTPUTS and opts.indices_datatype == "INT32" else np.int64,
                            copy=False)
    values = array.astype(np.float32, copy=False)
    return oip.to_bf16(values) if name in VALUE_OUTPUTS and opts.values_datatype == "BF16" else values


class ServerThread:
    """An :class:`EndpointServer` on its own event loop in a background thread (tests, :func:`serve`)."""

    def __init__(self, group: LogprobGroup, config: EndpointConfig) -> None:
        self.server = EndpointServer(group, config)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        assert self.server.url is not None, "server not started"
        return self.server.url

    @property
    def port(self) -> int:
        assert self.server.port is not None, "server not started"
        return self.server.port

    def start(self, timeout: float = 30.0) -> str:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="podium-endpoint", daemon=True)
        self._thread.start()
        try:
            return asyncio.run_coroutine_threadsafe(self.server.start(), loop).result(timeout)
        except BaseException:
            self._close_loop()
            raise

    def set_ready(self, ready: bool, reason: str = "") -> None:
        self.server.set_ready(ready, reason)

    def drain(self) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.server.drain)

    def stop(self, grace_s: float = 30.0) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(grace_s), self._loop).result(grace_s + 30.0)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(30.0)
        loop.close()

    def __enter__(self) -> "ServerThread":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
