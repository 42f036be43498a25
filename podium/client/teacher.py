"""One remote teacher as a trainer sees it: find it, call it, follow it across restarts.

Owns :class:`TeacherClient`: it reads the teacher's endpoint record, confirms the endpoint with a
health probe (records can be stale), sends ``get_logprobs`` as an Open Inference Protocol request
with binary tensors over a keep-alive connection, and when the call meets a connection error, a 503
or a new generation, re-reads the record, waits (up to ``ready_timeout_s``) for a ready endpoint and
sends the same request again; the teacher is deterministic, so a retry gives the same answer.
Refusals (4xx) are raised at once; errors name the teacher, its generation and what was seen.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from podium.client.errors import (
    TeacherFailedError,
    TeacherRequestError,
    TeacherServerError,
    TeacherUnavailableError,
    TokenizerMismatchError,
    TransportError,
)
from podium.client.transport import HTTPResponse, HTTPTransport
from podium.protocol import oip
from podium.protocol.batch import batch_inputs
from podium.protocol.names import (
    GENERATION_HEADER,
    HEALTH_READY,
    INPUT_IDS,
    INPUT_LENGTHS,
    LOGPROBS,
    MICRO_BATCH_SIZE,
    REQUEST_ID_HEADER,
    RETRY_AFTER,
    TOP_K,
    TOPK_INDICES,
    TOPK_LOGPROBS,
    infer_path,
    model_path,
)
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.records import EndpointRecord, Status, read_record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientOptions:
    """How patient and how fast the client is (all times in seconds)."""

    ready_timeout_s: float = 3600.0  # waiting for a (re)started teacher to be ready
    connect_timeout_s: float = 10.0
    request_timeout_s: Optional[float] = 3600.0  # one exchange, queueing + compute included
    poll_interval_s: float = 0.2  # first record re-read interval, doubling up to max_poll_interval_s
    max_poll_interval_s: float = 2.0
    stale_after_s: Optional[float] = None  # default: what the teacher's record says (server.stale_after_s)
    binary: bool = True  # binary tensor extension (False: JSON tensors)
    return_type: str = "torch"  # "torch" or "numpy"


def convert_outputs(outputs: Mapping[str, np.ndarray], return_type: str) -> dict[str, Any]:
    if return_type == "numpy":
        return dict(outputs)
    import torch

    return {name: torch.from_numpy(array) for name, array in outputs.items()}


class TeacherClient:
    """Calls one teacher (by its endpoint record) and follows its restarts; thread-safe."""

    def __init__(
        self,
        *,
        key: str,
        name: str,
        record_path: str | Path,
        token: Optional[str],
        options: ClientOptions = ClientOptions(),
        expected_fingerprint: Optional[str] = None,
        expected_tokenizer_size: Optional[int] = None,
    ) -> None:
        self.key = key
        self.name = name
        self.record_path = Path(record_path)
        self.options = options
        self.expected_fingerprint = expected_fingerprint
        self.expected_tokenizer_size = expected_tokenizer_size
        self._token = token
        self._lock = threading.Lock()
        self._record: Optional[EndpointRecord] = None
        self._transport: Optional[HTTPTransport] = None
        self._checked_generations: set[str] = set()

    def __repr__(self) -> str:
        return f"TeacherClient({self.label}, {self.record_path})"

    @property
    def label(self) -> str:
        return f"{self.name!r} ({self.key})"

    @property
    def record(self) -> Optional[EndpointRecord]:
        """The record of the endpoint in use (None before the first call)."""
        return self._record

    # ------------------------------------------------------------------ finding the endpoint

    def _probe(self, record: EndpointRecord, transport: HTTPTransport) -> Optional[str]:
        """None when the endpoint answers ready for the record's generation, else what was seen."""
        try:
            resp = transport.request("GET", HEALTH_READY)
        except TransportError as exc:
            return f"probe failed: {exc}"
        if resp.status != 200:
            return f"probe answered HTTP {resp.status}: {_error_text(resp)}"
        try:
            served = json.loads(bytes(resp.body)).get("generation")
        except (ValueError, AttributeError):
            served = None
        if served is not None and served != str(record.generation):
            return f"probe found generation {served} at {record.url}, record says {record.generation}"
        return None

    def _wait_ready(self, deadline: float, seen: list[str]) -> tuple[EndpointRecord, HTTPTransport]:
        interval = self.options.poll_interval_s
        while True:
            now = time.time()
            try:
                record = read_record(self.record_path)
            except FileReadError as exc:
                _note(seen, f"record {exc.kind}: {exc.detail}")
                record = None
            if record is not None:
                gen = str(record.generation)
                if record.status is Status.FAILED:
                    raise TeacherFailedError(self.label, gen, record.reason)
                stale = record.is_stale(self.options.stale_after_s, now)
                if record.status is Status.READY and record.url:
                    transport = self._transport_for(record)
                    problem = self._probe(record, transport)
                    if problem is None:
                        if stale:
                            logger.warning("teacher %s: record is stale (no heartbeat for %.0fs) but the "
                                           "endpoint answers; using it", self.label, record.age(now))
                        self._check_tokenizer(record)
                        return record, transport
                    if transport is not self._transport:
                        transport.close()
                    _note(seen, f"generation {gen} ready at {record.url} but {problem}"
                          + (f" (stale: no heartbeat for {record.age(now):.0f}s)" if stale else ""))
                else:
                    _note(seen, f"generation {gen} {record.status.value}"
                          + (f" ({record.reason})" if record.reason else "")
                          + (f", stale: no heartbeat for {record.age(now):.0f}s" if stale else ""))
            if time.time() >= deadline:
                raise TeacherUnavailableError(self.label, self.options.ready_timeout_s, seen)
            time.sleep(min(interval, max(0.0, deadline - time.time())))
            interval = min(interval * 2, self.options.max_poll_interval_s)

    def _transport_for(self, record: EndpointRecord) -> HTTPTransport:
        assert record.url is not None
        current = self._transport
        if current is not None and current.url == record.url:
            return current
        return HTTPTransport(
            record.url,
            self._token,
            connect_timeout_s=self.options.connect_timeout_s,
            read_timeout_s=self.options.request_timeout_s,
        )

    def _endpoint(self, deadline: Optional[float], seen: list[str]) -> tuple[EndpointRecord, HTTPTransport]:
        with self._lock:
            if self._record is not None and self._transport is not None:
                return self._record, self._transport
            record, transport = self._wait_ready(deadline or time.time() + self.options.ready_timeout_s, seen)
            if self._transport is not None and self._transport is not transport:
                self._transport.close()
            self._record, self._transport = record, transport
            logger.info("teacher %s: using generation %s at %s", self.label, record.generation, record.url)
            return record, transport

    def _forget(self, record: EndpointRecord) -> None:
        """Drop the cached endpoint (if it is still ``record``): the next call re-reads the record."""
        with self._lock:
            if self._record is record:
                self._record = None

    def wait_ready(self, timeout_s: Optional[float] = None) -> EndpointRecord:
        """Block until the teacher is ready; return its record."""
        seen: list[str] = []
        deadline = time.time() + (self.options.ready_timeout_s if timeout_s is None else timeout_s)
        return self._endpoint(deadline, seen)[0]

    # ------------------------------------------------------------------ tokenizer safety

    def _check_tokenizer(self, record: EndpointRecord) -> None:
        if self.expected_fingerprint is None and self.expected_tokenizer_size is None:
            return
        gen = str(record.generation)
        if gen in self._checked_generations:
            return
        check_tokenizer_against(self.label, gen, record.model.model_dump() if record.model else {},
                                self.expected_fingerprint, self.expected_tokenizer_size)
        self._checked_generations.add(gen)

    # ------------------------------------------------------------------ calls

    def _call(self, method: str, path: str, body: Optional[list] = None, headers: Optional[dict] = None) -> tuple[HTTPResponse, EndpointRecord]:
        """One request with restart following; returns a 2xx response."""
        seen: list[str] = []
        deadline: Optional[float] = None
        while True:
            record, transport = self._endpoint(deadline, seen)
            gen = str(record.generation)
            try:
                resp = transport.request(method, path, body, headers)
            except TransportError as exc:
                _note(seen, f"generation {gen} at {record.url}: {exc}")
                logger.warning("teacher %s generation %s: %s; re-reading the record", self.label, gen, exc)
                self._forget(record)
                deadline = deadline or time.time() + self.options.ready_timeout_s
                continue
            if resp.status == 503:
                _note(seen, f"generation {gen} at {record.url}: HTTP 503 {_error_text(resp)}")
                logger.info("teacher %s generation %s answered 503; waiting for a ready endpoint", self.label, gen)
                self._forget(record)
                deadline = deadline or time.time() + self.options.ready_timeout_s
                retry_after = _retry_after(resp)
                if retry_after:
                    time.sleep(min(retry_after, self.options.poll_interval_s, max(0.0, deadline - time.time())))
                continue
            if 400 <= resp.status < 500:
                raise TeacherRequestError(self.label, gen, resp.status, _error_text(resp))
            if resp.status >= 300:
                raise TeacherServerError(self.label, gen, resp.status, _error_text(resp))
            served = resp.header(GENERATION_HEADER)
            if served and served != gen:
                logger.info("teacher %s: answered by generation %s, record said %s; re-reading the record",
                            self.label, served, gen)
                self._forget(record)
            return resp, record

    def metadata(self) -> dict[str, Any]:
        """``GET /v2/models/<name>``: the teacher's metadata (podium's fields under ``"podium"``)."""
        resp, _ = self._call("GET", model_path(self.name))
        return json.loads(bytes(resp.body))

    def get_logprobs(
        self,
        data: Mapping[str, Any],
        *,
        top_k: Optional[int] = None,
        micro_batch_size: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> dict[str, Any]:
        """``{"logprobs": float32 [B, S]}`` (+ ``topk_logprobs``, ``topk_indices`` with ``top_k``)."""
        ids, lengths = batch_inputs(data)
        result = self.get_logprobs_arrays(ids, lengths, top_k=top_k, micro_batch_size=micro_batch_size, request_id=request_id)
        return convert_outputs(result, self.options.return_type)

    def get_logprobs_arrays(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        *,
        top_k: Optional[int] = None,
        micro_batch_size: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> dict[str, np.ndarray]:
        """:meth:`get_logprobs` on numpy arrays, returning numpy arrays (views of the response buffer)."""
        outputs = [LOGPROBS] + ([TOPK_LOGPROBS, TOPK_INDICES] if top_k else [])
        params: dict[str, Any] = {}
        if top_k:
            params[TOP_K] = int(top_k)
        if micro_batch_size:
            params[MICRO_BATCH_SIZE] = int(micro_batch_size)
        request_id = request_id or uuid.uuid4().hex
        binary = self.options.binary
        chunks, header_len = oip.encode_request(
            [(INPUT_IDS, ids), (INPUT_LENGTHS, lengths)],
            outputs=outputs,
            binary_inputs=binary,
            binary_outputs=binary,
            parameters=params,
        )
        headers = {REQUEST_ID_HEADER: request_id,
                   "Content-Type": oip.BINARY_CONTENT_TYPE if header_len is not None else oip.JSON_CONTENT_TYPE}
        if header_len is not None:
            headers[oip.HEADER_LENGTH] = str(header_len)
        resp, record = self._call("POST", infer_path(self.name), chunks, headers)
        try:
            decoded = oip.decode_response(
                resp.body, oip.parse_header_length(resp.header(oip.HEADER_LENGTH), len(resp.body))
            )
        except oip.OIPError as exc:
            raise TeacherServerError(self.label, str(record.generation), resp.status, f"unreadable response: {exc}") from None
        missing = [name for name in outputs if name not in decoded.outputs]
        if missing:
            raise TeacherServerError(self.label, str(record.generation), resp.status, f"response lacks outputs {missing}")
        return {name: decoded.outputs[name] for name in outputs}

    def close(self) -> None:
        with self._lock:
            if self._transport is not None:
                self._transport.close()
            self._transport = None
            self._record = None


def check_tokenizer_against(
    teacher: str,
    generation: str,
    model: Mapping[str, Any],
    fingerprint: Optional[str],
    tokenizer_size: Optional[int],
    vocab_size: Optional[int] = None,
) -> None:
    """Raise :class:`TokenizerMismatchError` when the trainer's tokenizer cannot be the teacher's.

    ``model`` is the teacher's model metadata (``vocab_size``, ``tokenizer_fingerprint``); the
    trainer gives its tokenizer's fingerprint and size, and optionally its model's vocab size.
    """
    teacher_vocab = model.get("vocab_size")
    teacher_fp = model.get("tokenizer_fingerprint")
    where = f"teacher {teacher} generation {generation}"
    if vocab_size is not None and teacher_vocab is not None and int(vocab_size) != int(teacher_vocab):
        raise TokenizerMismatchError(f"{where}: vocab size {teacher_vocab} != trainer's vocab size {vocab_size}")
    if tokenizer_size is not None and teacher_vocab is not None and int(tokenizer_size) > int(teacher_vocab):
        raise TokenizerMismatchError(
            f"{where}: trainer's tokenizer has {tokenizer_size} tokens but the teacher's vocabulary has only {teacher_vocab}"
        )
    if fingerprint is not None:
        if teacher_fp is None:
            logger.warning("%s publishes no tokenizer fingerprint; only the vocab size was checked", where)
        elif teacher_fp != fingerprint:
            raise TokenizerMismatchError(
                f"{where}: tokenizer fingerprint {teacher_fp} != trainer's {fingerprint} (different vocabularies)"
            )


def _note(seen: list[str], event: str) -> None:
    if not seen or seen[-1] != event:
        seen.append(event)
        del seen[:-20]


def _error_text(resp: HTTPResponse) -> str:
    try:
        return str(json.loads(bytes(resp.body))["error"])
    except (ValueError, KeyError, TypeError):
        return bytes(resp.body[:200]).decode("utf-8", errors="replace")


def _retry_after(resp: HTTPResponse) -> float:
    try:
        return float(resp.header(RETRY_AFTER) or 0)
    except ValueError:
        return 0.0
