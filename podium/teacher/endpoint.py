"""The teacher's HTTP endpoint: its worker group served over the Open Inference Protocol (KServe v2).

Owns the aiohttp server on the teacher's head node: routes, bearer-token auth, request validation
(every bad request is a 4xx JSON ``{"error": ...}`` and the server keeps serving), the in-order
queue in front of the group (one call at a time, on an executor thread so health probes answer
while the group computes), draining (503 + ``Retry-After``), port choice (bind test over a range,
next port on collision), and :func:`serve`, the blocking entry the launcher's driver calls with a
ready group and the record writer of its endpoint record. The wire codec is ``podium.teacher.oip``.

=====  ==========================================  =====  ========================================
verb   route                                       auth   answer
=====  ==========================================  =====  ========================================
GET    /v2/health/live                             no     200 while the process serves HTTP
GET    /v2/health/ready                            yes    200 once the group is loaded, 503 when
                                                          draining
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
import errno
import json
import logging
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

import numpy as np
from aiohttp import web

from podium.rendezvous.records import Generation, Heartbeat, ModelInfo, RecordWriter, StaleGenerationError, Status
from podium.rendezvous.token import tokens_equal
from podium.teacher import oip

logger = logging.getLogger(__name__)

DEFAULT_PORT_RANGE = (23000, 23999)
DEFAULT_MAX_BODY_BYTES = 512 * 1024 * 1024
DEFAULT_RETRY_AFTER_S = 5
INPUT_IDS = "input_ids"
INPUT_LENGTHS = "input_lengths"
LOGPROBS = "logprobs"
TOPK_LOGPROBS = "topk_logprobs"
TOPK_INDICES = "topk_indices"
OUTPUTS = (LOGPROBS, TOPK_LOGPROBS, TOPK_INDICES)
ID_DATATYPES = ("INT32", "INT64")
REQUEST_ID_HEADER = "X-Request-ID"
GENERATION_HEADER = "X-Podium-Generation"
TEACHER_HEADER = "X-Podium-Teacher"
SERVER_NAME = "podium"
SERVER_VERSION = "0.1.0"
# Per-request storage key for the request id (typed key where aiohttp has them).
_REQUEST_ID: Any = web.RequestKey("podium_request_id", str) if hasattr(web, "RequestKey") else "podium_request_id"


class LogprobGroup(Protocol):
    """What the endpoint serves: ``podium.teacher.group.TeacherWorkerGroup``, or any stand-in."""

    vocab_size: int
    max_sequence_length: Optional[int]
    sequence_length_multiple: int

    def get_logprobs(self, data: Any, micro_batch_size: Optional[int] = None, top_k: Optional[int] = None) -> Mapping[str, Any]: ...

    def validate(self, data: Any) -> None: ...


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


def bind_socket(host: str, port_range: tuple[int, int], backlog: int = 128) -> socket.socket:
    """A listening socket on the first free port of ``port_range`` (``(0, 0)``: any free port).

    The bind itself is the test, so no other process can take the port between test and use.
    """
    lo, hi = port_range
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    tried: list[str] = []
    for port in range(lo, hi + 1):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # Lets a restarted server reuse a port whose old connections sit in TIME_WAIT; a port
            # with a live listener still fails with EADDRINUSE on Linux.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(backlog)
            sock.setblocking(False)
            if tried:
                logger.info("ports %s on %s busy, bound %d", ",".join(tried[:5]), host, sock.getsockname()[1])
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                tried.append(str(port))
                continue
            raise
    raise OSError(errno.EADDRINUSE, f"no free port on {host} in {lo}-{hi} ({len(tried)} tried)")


def _json_error(status: int, message: str, headers: Optional[Mapping[str, str]] = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps({"error": message}).encode("utf-8"),
        content_type=oip.JSON_CONTENT_TYPE,
        headers=dict(headers or {}),
    )


def _int_param(params: Mapping[str, Any], name: str, lo: int, hi: Optional[int]) -> Optional[int]:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"parameter {name!r} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise RequestError(400, f"parameter {name!r} = {value} is out of range ({bound})")
    return value


class EndpointServer:
    """The aiohttp application around one group (asyncio API: ``await start()``, ``await stop()``)."""

    def __init__(self, group: LogprobGroup, config: EndpointConfig) -> None:
        self.group = group
        self.config = config
        self.vocab_size = int(group.vocab_size)
        self.max_sequence_length: Optional[int] = getattr(group, "max_sequence_length", None)
        self.sequence_length_multiple = int(getattr(group, "sequence_length_multiple", 1) or 1)
        self._names = {config.served_name, *config.aliases} | ({config.teacher_key} if config.teacher_key else set())
        self._ready = True
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

    def set_ready(self, ready: bool) -> None:
        self._ready = ready

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
        app.router.add_get("/v2/health/live", self._live)
        app.router.add_get("/v2/health/ready", self._ready_route)
        app.router.add_get("/v2", self._server_metadata)
        for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            app.router.add_get(prefix, self._model_metadata)
            app.router.add_get(prefix + "/ready", self._model_ready)
            app.router.add_post(prefix + "/infer", self._infer)
        return app

    async def start(self) -> str:
        """Bind, start serving, return the URL."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._sock = bind_socket(self.config.host, self.config.port_range)
        self.port = self._sock.getsockname()[1]
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()
        host = self.config.advertise_host or self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        self.url = f"http://{host}:{self.port}"
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
        if request.path != "/v2/health/live":
            header = request.headers.get("Authorization", "")
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
        what = "draining" if self._draining else "not ready"
        return RequestError(503, f"teacher {self.config.served_name!r} is {what}",
                            {"Retry-After": str(self.config.retry_after_s)})

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
                "parameters": {"top_k": f"1..{self.config.max_top_k or self.vocab_size}", "micro_batch_size": ">= 1"},
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

    def _validate(self, req: oip.InferRequest) -> tuple[dict[str, np.ndarray], Optional[int], Optional[int], list[str]]:
        """Check an infer request against the model; return (data, top_k, micro_batch_size, outputs)."""
        unknown = sorted(set(req.inputs) - {INPUT_IDS, INPUT_LENGTHS})
        if unknown:
            raise RequestError(400, f"unknown input(s) {unknown}; expected {INPUT_IDS} and {INPUT_LENGTHS}")
        for name in (INPUT_IDS, INPUT_LENGTHS):
            if name not in req.inputs:
                raise RequestError(400, f"missing input {name!r}")
            tensor = req.inputs[name]
            if tensor.datatype not in ID_DATATYPES:
                raise RequestError(400, f"input {name!r}: datatype {tensor.datatype} not accepted; expected INT32 or INT64")
        ids = req.inputs[INPUT_IDS].array
        lengths = req.inputs[INPUT_LENGTHS].array
        if ids.ndim != 2:
            raise RequestError(400, f"input {INPUT_IDS!r}: shape {list(ids.shape)} must be [B, S]")
        if lengths.ndim != 1:
            raise RequestError(400, f"input {INPUT_LENGTHS!r}: shape {list(lengths.shape)} must be [B]")
        batch, seq = ids.shape
        if lengths.shape[0] != batch:
            raise RequestError(400, f"shape mismatch: {INPUT_IDS} has B={batch} rows but {INPUT_LENGTHS} has {lengths.shape[0]}")
        if batch == 0 or seq == 0:
            raise RequestError(400, f"empty batch: {INPUT_IDS} has shape {list(ids.shape)}")
        lengths = lengths.astype(np.int64, copy=False)
        bad = np.flatnonzero((lengths < 1) | (lengths > seq))
        if bad.size:
            b = int(bad[0])
            raise RequestError(400, f"input_lengths out of range: input_lengths[{b}] = {int(lengths[b])} not in 1..{seq} "
                               f"(S = {seq}); {bad.size} bad row(s)")
        longest = int(lengths.max())
        limit = self.max_sequence_length
        if limit is not None and longest > limit:
            b = int(np.argmax(lengths))
            raise RequestError(400, f"input_lengths[{b}] = {longest} exceeds the teacher's max_sequence_length {limit}")
        padded = bool((lengths < seq).any())
        valid = np.arange(seq)[None, :] < lengths[:, None] if padded else None
        if ids.size:
            lo, hi = int(ids.min()), int(ids.max())  # whole array first: cheap, and usually decides
            if lo < 0 or hi >= self.vocab_size:
                bad_ids = (ids < 0) | (ids >= self.vocab_size)
                if valid is not None:
                    bad_ids &= valid
                if bad_ids.any():
                    rows, cols = np.nonzero(bad_ids)
                    b, s = int(rows[0]), int(cols[0])
                    raise RequestError(400, f"input_ids outside the vocabulary: input_ids[{b}, {s}] = {int(ids[b, s])} "
                                       f"not in 0..{self.vocab_size - 1} ({rows.size} such token(s))")
        # Positions past a row's length do not affect its logprobs (causal) and come back as 0:
        # whatever padding the client used, give the group zeros there, and cut columns past the
        # teacher's limit.
        width = seq if limit is None or seq <= limit else max(longest, 1)
        if padded or width != seq or ids.dtype != np.int64 or not ids.flags.writeable:
            clean = ids[:, :width].astype(np.int64, copy=True)
            if valid is not None:
                clean[~valid[:, :width]] = 0
        else:
            clean = ids  # a writable int64 view of the request body: no copy
        top_k = _int_param(req.parameters, "top_k", 1, self.config.max_top_k or self.vocab_size)
        micro = _int_param(req.parameters, "micro_batch_size", 1, None)
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
        return {INPUT_IDS: clean, INPUT_LENGTHS: lengths.copy()}, top_k, micro, outputs

    def _compute(self, data: dict[str, np.ndarray], top_k: Optional[int], micro: Optional[int], seq: int) -> dict[str, np.ndarray]:
        """Runs on the executor thread: one group call at a time, in arrival order."""
        import torch

        batch = {k: torch.from_numpy(v) for k, v in data.items()}
        try:
            self.group.validate(batch)
        except ValueError as exc:
            raise RequestError(400, f"rejected by the teacher: {exc}") from None
        result = self.group.get_logprobs(batch, micro_batch_size=micro, top_k=top_k)
        out: dict[str, np.ndarray] = {}
        for name in OUTPUTS:
            if name in result and result[name] is not None:
                value = result[name]
                array = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
                array = array.astype(np.float32 if name != TOPK_INDICES else np.int64, copy=False)
                width = array.shape[1]
                if width < seq:  # columns cut past the limit come back as zeros
                    pad = [(0, 0), (0, seq - width)] + [(0, 0)] * (array.ndim - 2)
                    array = np.pad(array, pad)
                out[name] = array
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
        data, top_k, micro, outputs = self._validate(req)
        seq = req.inputs[INPUT_IDS].array.shape[1]
        assert self._idle is not None
        loop = asyncio.get_running_loop()
        self._pending += 1
        self._idle.clear()
        started = time.perf_counter()
        try:
            result = await loop.run_in_executor(self._executor, self._compute, data, top_k, micro, seq)
        except RequestError:
            raise
        except ValueError as exc:
            raise RequestError(400, f"rejected by the teacher: {exc}") from None
        except Exception as exc:
            logger.exception("teacher %r: get_logprobs failed (request %s)", self.config.served_name, request_id)
            raise RequestError(500, f"teacher {self.config.served_name!r} failed: {type(exc).__name__}: {exc}") from None
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()
        self._served += 1
        logger.debug("request %s: %s in %.3fs", request_id, list(data[INPUT_IDS].shape), time.perf_counter() - started)
        missing = [name for name in outputs if name not in result]
        if missing:
            raise RequestError(500, f"teacher {self.config.served_name!r} returned no {missing}")
        gen = str(self.config.generation) if self.config.generation is not None else ""
        chunks, header_len = oip.encode_response(
            self.config.served_name,
            [(name, result[name], req.wants_binary(name)) for name in outputs],
            model_version=self.config.model_version,
            request_id=req.id,
            parameters={"podium_generation": gen} if gen else None,
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


def _default_fingerprint(group: LogprobGroup) -> tuple[Optional[str], Optional[int]]:
    path = getattr(group, "checkpoint_path", None)
    if not path:
        return None, None
    try:
        from podium.client.tokenizer import fingerprint_from_pretrained

        return fingerprint_from_pretrained(str(path))
    except Exception as exc:  # no tokenizer next to the checkpoint: the field stays empty
        logger.info("no tokenizer fingerprint for %s: %s", path, exc)
        return None, None


def serve(
    group: LogprobGroup,
    *,
    token: str,
    host: str = "127.0.0.1",
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE,
    record_writer: Optional[RecordWriter] = None,
    served_name: Optional[str] = None,
    teacher_key: Optional[str] = None,
    aliases: Sequence[str] = (),
    generation: Optional[Generation] = None,
    heartbeat_interval_s: float = 5.0,
    stop_event: Optional[threading.Event] = None,
    drain_timeout_s: float = 60.0,
    handle_signals: bool = True,
    on_ready: Optional[Callable[[str], None]] = None,
    **config_kwargs: Any,
) -> None:
    """Serve ``group`` until ``stop_event`` is set (or SIGTERM/SIGUSR2 arrives); blocks.

    With a ``record_writer``: publishes ``ready`` with the URL and model metadata once bound, keeps
    the heartbeat, publishes ``draining`` when asked to stop and ``stopped`` once the queue is empty
    (or ``drain_timeout_s`` passed). Names and generation default to the writer's record. If a newer
    generation fences the writer, the server drains and returns. The group is not shut down here:
    its owner does that.
    """
    stop = stop_event or threading.Event()
    record = record_writer.record if record_writer is not None else None
    if "tokenizer_fingerprint" not in config_kwargs:
        config_kwargs["tokenizer_fingerprint"], tok_vocab = _default_fingerprint(group)
        config_kwargs.setdefault("tokenizer_vocab_size", tok_vocab)
    config = EndpointConfig(
        served_name=served_name or (record.teacher_name if record else "teacher"),
        token=token,
        teacher_key=teacher_key or (record.teacher_key if record else ""),
        aliases=tuple(aliases) or (record.aliases if record else ()),
        generation=generation or (record.generation if record else None),
        host=host,
        port_range=port_range,
        **config_kwargs,
    )
    server = ServerThread(group, config)
    previous: dict[int, Any] = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    heartbeat: Optional[Heartbeat] = None

    def publish(status: Status, **kw: Any) -> None:
        if record_writer is None or record_writer.fenced:
            return
        try:
            record_writer.publish(status, **kw)
        except StaleGenerationError as exc:
            logger.error("%s", exc)
            stop.set()

    try:
        url = server.start()
        publish(Status.READY, url=url, model=server.server.model_info())
        if record_writer is not None:
            heartbeat = Heartbeat(record_writer, heartbeat_interval_s, on_fenced=lambda exc: stop.set()).start()
        if on_ready is not None:
            on_ready(url)
        while not stop.wait(1.0):
            pass
        publish(Status.DRAINING)
        server.stop(grace_s=drain_timeout_s)
        publish(Status.STOPPED)
    except BaseException as exc:
        publish(Status.FAILED, reason=f"endpoint: {type(exc).__name__}: {exc}")
        server.stop(grace_s=0)
        raise
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
