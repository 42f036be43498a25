"""The teacher's HTTP endpoint: its worker group served over the Open Inference Protocol (KServe v2).

Owns the aiohttp server on the teacher's head node: routes, bearer-token auth, request validation
(every bad request is a 4xx JSON ``{"error": ...}`` and the server keeps serving; the batch rule
itself is ``podium.protocol.batch``), the in-order queue in front of the group (one call at a time,
on an executor thread so health probes answer while the group computes), readiness (set by the
owner of the teacher's lifecycle, ``podium.launcher.lifecycle``, with a reason when it is false),
draining (503 + ``Retry-After``), and binding a free port of a range. It serves and reports; it
publishes nothing: the lifecycle owns the endpoint record. The wire codec is ``podium.protocol.oip``.

=====  ==========================================  =====  ========================================
verb   route                                       auth   answer
=====  ==========================================  =====  ========================================
GET    /v2/health/live                             no     200 while the process serves HTTP
GET    /v2/health/ready                            yes    200 once the owner says ready, 503 when
                                                          not ready (with the reason) or draining
GET    /v2                                         yes    server metadata (extensions)
GET    /v2/models/<name>[/versions/<v>]            yes    model metadata + podium's fields
GET    /v2/models/<name>[/versions/<v>]/ready      yes    like /v2/health/ready, for that model
POST   /v2/models/<name>[/versions/<v>]/infer      yes    logprobs (+ top-k) for input_ids and
                                                          input_lengths
=====  ==========================================  =====  ========================================

``<name>`` may be the teacher's served name (its first alias), any of its aliases, or its key.
Every response carries ``X-Request-ID`` (the request's header or JSON ``id``, else a new one) and,
from an infer, ``X-Podium-Generation``.
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
from podium.protocol.batch import Batch, BatchError, validate_batch, validate_options
from podium.protocol.names import (
    AUTHORIZATION,
    GENERATION_HEADER,
    GENERATION_PARAMETER,
    HEALTH_LIVE,
    HEALTH_READY,
    ID_DATATYPES,
    INPUT_IDS,
    INPUT_LENGTHS,
    LOGPROBS,
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

logger = logging.getLogger(__name__)

DEFAULT_PORT_RANGE = (23000, 23999)
DEFAULT_MAX_BODY_BYTES = 512 * 1024 * 1024
DEFAULT_RETRY_AFTER_S = 5
# Per-request storage key for the request id (typed key where aiohttp has them).
_REQUEST_ID: Any = web.RequestKey("podium_request_id", str) if hasattr(web, "RequestKey") else "podium_request_id"


class LogprobGroup(Protocol):
    """What the endpoint serves: ``podium.teacher.group.TeacherWorkerGroup``, or any stand-in.

    ``get_logprobs`` receives a validated :class:`~podium.protocol.batch.Batch` and returns
    ``logprobs`` ``[B, width]`` (+ ``topk_logprobs``/``topk_indices`` with ``top_k``)."""

    vocab_size: int
    max_sequence_length: Optional[int]
    sequence_length_multiple: int

    def get_logprobs(self, data: Batch, micro_batch_size: Optional[int] = None, top_k: Optional[int] = None) -> Mapping[str, Any]: ...


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
        self._pending = 0
        self._served = 0
        self._idle: Optional[asyncio.Event] = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="podium-infer")
        self._runner: Optional[web.AppRunner] = None
        self._sock: Optional[socket.socket] = None
        self.port: Optional[int] = None
        self.url: Optional[str] = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        return self._ready and not self._draining

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def queue_depth(self) -> int:
        return self._pending

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Readiness as the teacher's lifecycle sees it; ``reason`` says why it is not ready."""
        self._ready = ready
        self._not_ready_reason = "" if ready else (reason or "not ready")

    def model_info(self) -> ModelInfo:
        return ModelInfo(
            served_name=self.config.served_name,
            model_name=self.config.model_name,
            checkpoint_path=str(getattr(self.group, "checkpoint_path", None) or "") or None,
            vocab_size=self.vocab_size,
            max_sequence_length=self.max_sequence_length,
            sequence_length_multiple=self.sequence_length_multiple,
            tokenizer_fingerprint=self.config.tokenizer_fingerprint,
            tokenizer_vocab_size=self.config.tokenizer_vocab_size,
        )

    def build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[self._error_middleware, self._auth_middleware],
        )
        app.router.add_get(HEALTH_LIVE, self._live)
        app.router.add_get(HEALTH_READY, self._ready_route)
        app.router.add_get(SERVER_METADATA, self._server_metadata)
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            app.router.add_get(prefix, self._model_metadata)
            app.router.add_get(prefix + "/ready", self._model_ready)
            app.router.add_post(prefix + "/infer", self._infer)
        return app

    async def start(self) -> str:
        """Bind, start serving, return the URL."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._sock = listen_on_free_port(self.config.host, self.config.port_range)
        self.port = self._sock.getsockname()[1]
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
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
            logger.info("teacher %r draining (%d requests queued)", self.config.served_name, self._pending)
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
            logger.warning("teacher %r: %d requests still queued after %.0fs; closing", self.config.served_name, self._pending, grace_s)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
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
        response.headers[REQUEST_ID_HEADER] = request[_REQUEST_ID]
        return response

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if request.path != HEALTH_LIVE:
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

    def _not_ready(self) -> RequestError:
        what = "draining" if self._draining else f"not ready ({self._not_ready_reason})"
        return RequestError(503, f"teacher {self.config.served_name!r} is {what}",
                            {RETRY_AFTER: str(self.config.retry_after_s)})

    async def _live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

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
            ],
            "outputs": [
                {"name": LOGPROBS, "datatype": "FP32", "shape": [-1, -1]},
                {"name": TOPK_LOGPROBS, "datatype": "FP32", "shape": [-1, -1, -1]},
                {"name": TOPK_INDICES, "datatype": "INT64", "shape": [-1, -1, -1]},
            ],
            "podium": {
                **info,
                "teacher_key": self.config.teacher_key,
                "aliases": list(self.config.aliases),
                "generation": None if gen is None else {"job_id": gen.job_id, "restart": gen.restart},
                "accepted_input_datatypes": list(ID_DATATYPES),
                "parameters": {TOP_K: f"1..{self.config.max_top_k or self.vocab_size}", MICRO_BATCH_SIZE: ">= 1"},
                "ready": self.ready,
                "draining": self._draining,
                "queue_depth": self._pending,
            },
        }

    async def _model_metadata(self, request: web.Request) -> web.Response:
        self._check_model(request)
        return web.json_response(self.metadata())

    async def _model_ready(self, request: web.Request) -> web.Response:
        self._check_model(request)
        return await self._ready_route(request)

    async def _read_body(self, request: web.Request) -> bytearray:
        """The whole body, in one writable buffer (numpy views of it need no copy for the group)."""
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise RequestError(413, f"request body of {length} bytes is larger than the limit of {limit} bytes")
        if length is None:  # chunked: aiohttp enforces client_max_size while reading
            try:
                return bytearray(await request.read())
            except web.HTTPRequestEntityTooLarge:
                raise RequestError(413, f"request body is larger than the limit of {limit} bytes") from None
        body = bytearray(length)
        view = memoryview(body)
        got = 0
        while got < length:
            chunk = await request.content.readany()
            if not chunk:
                break
            take = min(len(chunk), length - got)
            view[got:got + take] = chunk[:take]
            got += take
        if got != length:
            raise RequestError(400, f"body ended after {got} of the {length} bytes its Content-Length announced")
        return body

    def _validate(self, req: oip.InferRequest) -> tuple[Batch, Optional[int], Optional[int], list[str]]:
        """Check an infer request against the model; return (batch, top_k, micro_batch_size, outputs)."""
        unknown = sorted(set(req.inputs) - {INPUT_IDS, INPUT_LENGTHS})
        if unknown:
            raise RequestError(400, f"unknown input(s) {unknown}; expected {INPUT_IDS} and {INPUT_LENGTHS}")
        for name in (INPUT_IDS, INPUT_LENGTHS):
            if name not in req.inputs:
                raise RequestError(400, f"missing input {name!r}")
            tensor = req.inputs[name]
            if tensor.datatype not in ID_DATATYPES:
                raise RequestError(400, f"input {name!r}: datatype {tensor.datatype} not accepted; expected INT32 or INT64")
        try:
            batch = validate_batch(req.inputs[INPUT_IDS].array, req.inputs[INPUT_LENGTHS].array,
                                   vocab_size=self.vocab_size, max_sequence_length=self.max_sequence_length)
            top_k, micro = validate_options(top_k=req.parameters.get(TOP_K),
                                            micro_batch_size=req.parameters.get(MICRO_BATCH_SIZE),
                                            vocab_size=self.vocab_size, max_top_k=self.config.max_top_k)
        except BatchError as exc:
            raise RequestError(400, str(exc)) from None
        if req.outputs is None:
            outputs = [LOGPROBS] + ([TOPK_LOGPROBS, TOPK_INDICES] if top_k else [])
        else:
            outputs = [o.name for o in req.outputs]
            unknown = sorted(set(outputs) - set(OUTPUTS))
            if unknown:
                raise RequestError(400, f"unknown output(s) {unknown}; this model has {list(OUTPUTS)}")
            if not top_k and (TOPK_LOGPROBS in outputs or TOPK_INDICES in outputs):
                raise RequestError(400, f"outputs {TOPK_LOGPROBS}/{TOPK_INDICES} need the request parameter 'top_k'")
            if len(set(outputs)) != len(outputs):
                raise RequestError(400, f"an output is requested twice: {outputs}")
        return batch, top_k, micro, outputs

    def _compute(self, batch: Batch, top_k: Optional[int], micro: Optional[int]) -> dict[str, np.ndarray]:
        """Runs on the executor thread: one group call at a time, in arrival order."""
        result = self.group.get_logprobs(batch, micro_batch_size=micro, top_k=top_k)
        out: dict[str, np.ndarray] = {}
        for name in OUTPUTS:
            if name in result and result[name] is not None:
                value = result[name]
                array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
                if array.shape[:2] != (batch.rows, batch.width):  # a broken group is a 500, never a wrong answer
                    raise RuntimeError(f"the group returned {name} of shape {list(array.shape)} for a batch of "
                                       f"{batch.rows} rows and width {batch.width}")
                out[name] = array.astype(np.float32 if name != TOPK_INDICES else np.int64, copy=False)
        return out

    async def _infer(self, request: web.Request) -> web.Response:
        self._check_model(request)
        if not self.ready:
            raise self._not_ready()
        body = await self._read_body(request)
        header_length = oip.parse_header_length(request.headers.get(oip.HEADER_LENGTH), len(body))
        req = oip.decode_request(body, header_length)
        request_id = req.id or request[_REQUEST_ID]
        request[_REQUEST_ID] = request_id
        batch, top_k, micro, outputs = self._validate(req)
        assert self._idle is not None
        loop = asyncio.get_running_loop()
        self._pending += 1
        self._idle.clear()
        started = time.perf_counter()
        try:
            result = await loop.run_in_executor(self._executor, self._compute, batch, top_k, micro)
        except ValueError as exc:  # the group refuses what it cannot serve (a layout's limit, say)
            raise RequestError(400, f"rejected by the teacher: {exc}") from None
        except Exception as exc:
            logger.exception("teacher %r: get_logprobs failed (request %s)", self.config.served_name, request_id)
            raise RequestError(500, f"teacher {self.config.served_name!r} failed: {type(exc).__name__}: {exc}") from None
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()
        self._served += 1
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
        )
        headers = {REQUEST_ID_HEADER: request_id, GENERATION_HEADER: gen, TEACHER_HEADER: self.config.teacher_key}
        if header_len is not None:
            headers[oip.HEADER_LENGTH] = str(header_len)
            content_type = oip.BINARY_CONTENT_TYPE
        else:
            content_type = oip.JSON_CONTENT_TYPE
        return web.Response(body=oip.join(chunks), headers=headers, content_type=content_type)


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
