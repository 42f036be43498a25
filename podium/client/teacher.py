"""One remote teacher as a trainer sees it: find it, call it, follow it across restarts.

Owns :class:`TeacherClient`: it reads the teacher's endpoint record, confirms the endpoint with a
health probe (records can be stale), sends ``get_logprobs`` as an Open Inference Protocol request
with binary tensors over a keep-alive connection, and follows restarts: the teacher is
deterministic, so the same request sent again gives the same answer.

Each call has one deadline (``ClientOptions.call_timeout_s``, or the call's ``timeout_s``) that
every wait and every exchange of the call stays within (an exchange's socket timeouts are never
longer than what is left). Within it (:meth:`TeacherClient._call`):

- a connection error or a timeout of an exchange, and a 503, are retried: the record is re-read
  and the call waits (also at most ``ready_timeout_s`` at a time) for a ready endpoint;
- a 5xx other than 503 is retried only when the generation that answered it is gone since
  (:meth:`TeacherClient._answerer_gone`); else it is :class:`TeacherServerError`;
- a 4xx is never retried (:class:`TeacherRequestError`);
- a ``failed`` record ends the call only when that failure is final (:func:`failure_is_final`,
  :class:`TeacherFailedError`); otherwise the call waits for the next generation;
- when the deadline passes: :class:`TeacherUnavailableError` naming the teacher, the last
  generation seen, how long it waited and what it saw.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

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
from podium.protocol.batch import BatchError, as_int_array, batch_inputs, validate_options
from podium.protocol.names import (
    CALLER_HEADER,
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    GENERATION_HEADER,
    HEALTH_READY,
    INDICES_DATATYPE,
    INPUT_IDS,
    INPUT_LENGTHS,
    LOGPROBS,
    MICRO_BATCH_SIZE,
    REQUEST_ID_HEADER,
    RETRY_AFTER,
    TEMPERATURE,
    TOP_K,
    TOPK_INDICES,
    TOPK_LOGIT_INDICES,
    TOPK_LOGITS,
    TOPK_LOGPROBS,
    VALUE_OUTPUTS,
    VALUES_DATATYPE,
    infer_path,
    model_path,
)
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.records import EndpointRecord, Status, read_record

logger = logging.getLogger(__name__)


def _caller() -> str:
    """Who calls, for the endpoint's turns between callers: this process (read per call: a
    forked worker is another caller)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ClientOptions:
    """How patient and how fast the client is (all times in seconds)."""

    call_timeout_s: float = 1800.0  # one call, all retries and waits included (per-call override: timeout_s)
    ready_timeout_s: float = 3600.0  # one wait for a (re)started teacher to be ready (within the call's)
    connect_timeout_s: float = 10.0
    request_timeout_s: Optional[float] = 3600.0  # one exchange, queueing + compute included (within the call's)
    keepalive_idle_s: float = 30.0  # TCP keepalive: first probe after this much silence on a connection,
    keepalive_interval_s: float = 10.0  # then one every this often,
    keepalive_count: int = 3  # and the connection is dropped after this many unanswered
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


def failure_is_final(record: EndpointRecord) -> bool:
    """Whether a ``failed`` record means no generation of the teacher will come back.

    The record's ``extra["final"]`` says so when present (the launcher's verdict); without it, a
    failure is final unless ``extra["will_retry"]`` is true (the job will requeue). The one place
    that reads this from a record."""
    if record.status is not Status.FAILED:
        return False
    extra = record.extra or {}
    if "final" in extra:
        return bool(extra["final"])
    return not extra.get("will_retry")


@dataclass
class _Call:
    """One call's deadline and what it saw (for :class:`TeacherUnavailableError`)."""

    teacher: str
    limit_s: float
    ready_timeout_s: float
    started: float = field(default_factory=time.monotonic)
    seen: list[str] = field(default_factory=list)
    generation: Optional[str] = None
    waiting_since: Optional[float] = None  # when the teacher was found unusable (the ready timeout runs)

    @property
    def deadline(self) -> float:
        return self.started + self.limit_s

    def left(self) -> float:
        """Seconds left before the call's deadline (or the ready timeout, while waiting)."""
        end = self.deadline
        if self.waiting_since is not None:
            end = min(end, self.waiting_since + self.ready_timeout_s)
        return end - time.monotonic()

    def note(self, event: str) -> None:
        event = " ".join(event.split())  # one line
        if not self.seen or self.seen[-1] != event:
            self.seen.append(event)
            del self.seen[:-20]

    def unusable(self) -> None:
        """The teacher cannot answer now: from here the ready timeout runs too (until it can)."""
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()

    def usable(self) -> None:
        self.waiting_since = None

    def unavailable(self) -> TeacherUnavailableError:
        now = time.monotonic()
        if now >= self.deadline or self.waiting_since is None:
            limit = f"call deadline {self.limit_s:g}s"
        else:
            limit = f"not ready within ready_timeout_s {self.ready_timeout_s:g}s"
        return TeacherUnavailableError(self.teacher, self.generation, now - self.started, self.seen, limit)


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
        self.retries = 0  # requests sent again (to this or a later generation) since this client began
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

    def _probe(self, record: EndpointRecord, transport: HTTPTransport, call: _Call) -> Optional[str]:
        """None when the endpoint answers ready for the record's generation, else what was seen."""
        try:
            resp = transport.request("GET", HEALTH_READY, timeout_s=max(call.left(), 0.0))
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

    def _wait_ready(self, call: _Call) -> tuple[EndpointRecord, HTTPTransport]:
        interval = self.options.poll_interval_s
        while True:
            now = time.time()
            try:
                record = read_record(self.record_path)
            except FileReadError as exc:
                call.note(f"record {exc.kind}: {exc.detail}")
                record = None
            if record is not None:
                gen = str(record.generation)
                call.generation = gen
                stale = record.is_stale(self.options.stale_after_s, now)
                if record.status is Status.FAILED:
                    if failure_is_final(record):
                        raise TeacherFailedError(self.label, gen, record.reason)
                    call.note(f"generation {gen} failed ({record.reason or 'no reason given'}); "
                              "the teacher will retry")
                elif record.status is Status.READY and record.url:
                    transport = self._transport_for(record)
                    problem = self._probe(record, transport, call)
                    if problem is None:
                        if stale:
                            logger.warning("teacher %s: record is stale (no heartbeat for %.0fs) but the "
                                           "endpoint answers; using it", self.label, record.age(now))
                        self._check_tokenizer(record)
                        return record, transport
                    if transport is not self._transport:
                        transport.close()
                    call.note(f"generation {gen} ready at {record.url} but {problem}"
                              + (f" (stale: no heartbeat for {record.age(now):.0f}s)" if stale else ""))
                else:
                    call.note(f"generation {gen} {record.status.value}"
                              + (f" ({record.reason})" if record.reason else "")
                              + (f", stale: no heartbeat for {record.age(now):.0f}s" if stale else ""))
            call.unusable()
            left = call.left()
            if left <= 0:
                raise call.unavailable()
            time.sleep(min(interval, left))
            interval = min(interval * 2, self.options.max_poll_interval_s)

    def _transport_for(self, record: EndpointRecord) -> HTTPTransport:
        assert record.url is not None
        current = self._transport
        if current is not None and current.url == record.url:
            return current
        o = self.options
        return HTTPTransport(
            record.url,
            self._token,
            connect_timeout_s=o.connect_timeout_s,
            read_timeout_s=o.request_timeout_s,
            keepalive=(o.keepalive_idle_s, o.keepalive_interval_s, o.keepalive_count),
        )

    def _endpoint(self, call: _Call) -> tuple[EndpointRecord, HTTPTransport]:
        # another thread may hold the lock while it waits for the teacher: wait for it only as
        # long as this call may
        if not self._lock.acquire(timeout=max(call.left(), 0.0)):
            call.note("another call of this client was waiting for the teacher")
            raise call.unavailable()
        try:
            if self._record is not None and self._transport is not None:
                return self._record, self._transport
            record, transport = self._wait_ready(call)
            if self._transport is not None and self._transport is not transport:
                self._transport.close()
            self._record, self._transport = record, transport
            logger.info("teacher %s: using generation %s at %s", self.label, record.generation, record.url)
            return record, transport
        finally:
            self._lock.release()

    def _forget(self, record: EndpointRecord) -> None:
        """Drop the cached endpoint (if it is still ``record``): the next call re-reads the record."""
        with self._lock:
            if self._record is record:
                self._record = None

    def _new_call(self, timeout_s: Optional[float]) -> _Call:
        limit = self.options.call_timeout_s if timeout_s is None else float(timeout_s)
        return _Call(self.label, limit, self.options.ready_timeout_s)

    def wait_ready(self, timeout_s: Optional[float] = None) -> EndpointRecord:
        """Block until the teacher is ready (at most ``timeout_s``, default ``ready_timeout_s``);
        return its record."""
        limit = self.options.ready_timeout_s if timeout_s is None else float(timeout_s)
        return self._endpoint(_Call(self.label, limit, limit))[0]

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

    def _answerer_gone(self, answered: EndpointRecord, resp: HTTPResponse) -> Optional[str]:
        """After a 5xx: what says the generation that answered it is gone since (None: nothing).

        The record is re-read: it names another generation, or that generation is not ready any
        more (failed, draining, stopped). Then the error came from a teacher that broke under the
        request, and the next generation can answer it; else the error is the request's own."""
        gen = resp.header(GENERATION_HEADER) or str(answered.generation)
        try:
            now = read_record(self.record_path)
        except FileReadError:
            return None
        if str(now.generation) != gen:
            return f"the record now says generation {now.generation} ({now.status.value})"
        if now.status is not Status.READY:
            return f"its record now says {now.status.value}" + (f" ({now.reason})" if now.reason else "")
        return None

    def _retried(self) -> None:
        with self._lock:
            self.retries += 1

    def _call(self, method: str, path: str, body: Optional[list] = None, headers: Optional[dict] = None,
              timeout_s: Optional[float] = None) -> tuple[HTTPResponse, EndpointRecord]:
        """One request with restart following, within one deadline (see the module doc); returns
        a 2xx response."""
        call = self._new_call(timeout_s)
        while True:
            if call.left() <= 0:
                raise call.unavailable()
            record, transport = self._endpoint(call)
            call.usable()
            gen = str(record.generation)
            call.generation = gen
            try:
                resp = transport.request(method, path, body, headers, timeout_s=max(call.left(), 0.0))
            except TransportError as exc:
                call.note(f"generation {gen} at {record.url}: {exc}")
                logger.warning("teacher %s generation %s: %s; re-reading the record", self.label, gen, exc)
                self._forget(record)
                call.unusable()
                self._retried()
                continue
            if resp.status == 503:
                call.note(f"generation {gen} at {record.url}: HTTP 503 {_error_text(resp)}")
                logger.info("teacher %s generation %s answered 503; waiting for a ready endpoint", self.label, gen)
                self._forget(record)
                call.unusable()
                retry_after = _retry_after(resp)
                if retry_after:
                    time.sleep(min(retry_after, self.options.poll_interval_s, max(0.0, call.left())))
                self._retried()
                continue
            if 400 <= resp.status < 500:
                raise TeacherRequestError(self.label, gen, resp.status, _error_text(resp))
            if resp.status >= 500:
                gone = self._answerer_gone(record, resp)
                if gone is not None:
                    call.note(f"generation {gen} at {record.url}: HTTP {resp.status} {_error_text(resp)}; {gone}")
                    logger.warning("teacher %s generation %s answered HTTP %d and %s; retrying", self.label, gen,
                                   resp.status, gone)
                    self._forget(record)
                    call.unusable()
                    self._retried()
                    continue
            if resp.status >= 300:
                raise TeacherServerError(self.label, gen, resp.status, _error_text(resp))
            served = resp.header(GENERATION_HEADER)
            if served and served != gen:
                logger.info("teacher %s: answered by generation %s, record said %s; re-reading the record",
                            self.label, served, gen)
                self._forget(record)
            return resp, record

    def metadata(self, *, timeout_s: Optional[float] = None) -> dict[str, Any]:
        """``GET /v2/models/<name>``: the teacher's metadata (podium's fields under ``"podium"``)."""
        resp, _ = self._call("GET", model_path(self.name), timeout_s=timeout_s)
        return json.loads(bytes(resp.body))

    def get_logprobs(
        self,
        data: Mapping[str, Any],
        *,
        top_k: Optional[int] = None,
        micro_batch_size: Optional[int] = None,
        temperature: Optional[float] = None,
        request_id: Optional[str] = None,
        timeout_s: Optional[float] = None,
    ) -> dict[str, Any]:
        """``{"logprobs": float32 [B, S]}`` (+ ``topk_logprobs``, ``topk_indices`` with ``top_k``);
        ``temperature``: this call's (default: the teacher's); ``timeout_s``: this call's deadline
        (default ``call_timeout_s``). Keys of ``data`` other than the inputs are refused unless
        known not to change a logit (:data:`podium.protocol.batch.IGNORED_KEYS`)."""
        ids, lengths = batch_inputs(data)
        result = self.get_logprobs_arrays(ids, lengths, top_k=top_k, micro_batch_size=micro_batch_size,
                                          temperature=temperature, request_id=request_id, timeout_s=timeout_s)
        return convert_outputs(result, self.options.return_type)

    def get_topk_logits(
        self,
        data: Mapping[str, Any],
        k: int,
        *,
        micro_batch_size: Optional[int] = None,
        temperature: Optional[float] = None,
        values_datatype: str = "FP32",
        indices_datatype: str = "INT64",
        timeout_s: Optional[float] = None,
    ) -> dict[str, Any]:
        """NeMo RL's ``get_topk_logits``: ``{"topk_logits": float32 [B, S, k], "topk_indices": int64
        [B, S, k]}``, the temperature-scaled logits of the ``k`` likeliest next tokens at each
        position (position ``t``: the token after ``t``; zeros at and past ``length - 1``).
        ``values_datatype="BF16"`` / ``indices_datatype="INT32"`` halve the bytes on the wire; the
        result is float32 / int64 either way."""
        ids, lengths = batch_inputs(data)
        out = self.get_logprobs_arrays(ids, lengths, top_k=k, micro_batch_size=micro_batch_size,
                                       temperature=temperature, outputs=(TOPK_LOGITS, TOPK_LOGIT_INDICES),
                                       values_datatype=values_datatype, indices_datatype=indices_datatype,
                                       timeout_s=timeout_s)
        result = {"topk_logits": out[TOPK_LOGITS], "topk_indices": out[TOPK_LOGIT_INDICES].astype(np.int64, copy=False)}
        return convert_outputs(result, self.options.return_type)

    def get_candidate_logprobs(
        self,
        data: Mapping[str, Any],
        candidate_ids: Any = None,
        *,
        micro_batch_size: Optional[int] = None,
        temperature: Optional[float] = None,
        values_datatype: str = "FP32",
        timeout_s: Optional[float] = None,
    ) -> dict[str, Any]:
        """The teacher's logprobs of the caller's ids: ``{"candidate_logprobs": float32 [B, S, C]}``
        for ``candidate_ids [B, S, C]`` (or ``data["candidate_ids"]``), in the next-token alignment
        (position ``t``: ``log p(token after t = candidate_ids[b, t, c])``; zeros at and past
        ``length - 1``), e.g. the student's own top-k for student-top-k reverse KL."""
        ids, lengths = batch_inputs(data)
        cands = candidate_ids if candidate_ids is not None else data.get(CANDIDATE_IDS)
        if cands is None:
            raise BatchError(f"get_candidate_logprobs needs candidate ids [B, S, C] ({CANDIDATE_IDS!r})")
        out = self.get_logprobs_arrays(ids, lengths, micro_batch_size=micro_batch_size, temperature=temperature,
                                       outputs=(CANDIDATE_LOGPROBS,), candidate_ids=as_int_array(cands, CANDIDATE_IDS),
                                       values_datatype=values_datatype, timeout_s=timeout_s)
        return convert_outputs(out, self.options.return_type)

    def get_logprobs_arrays(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        *,
        top_k: Optional[int] = None,
        micro_batch_size: Optional[int] = None,
        temperature: Optional[float] = None,
        outputs: Optional[Sequence[str]] = None,
        candidate_ids: Optional[np.ndarray] = None,
        values_datatype: Optional[str] = None,
        indices_datatype: Optional[str] = None,
        request_id: Optional[str] = None,
        timeout_s: Optional[float] = None,
    ) -> dict[str, np.ndarray]:
        """One infer request on numpy arrays: the ``outputs`` named in :mod:`podium.protocol.names`
        (default: ``logprobs``, + top-k logprobs/indices with ``top_k``), as numpy arrays (values
        float32, BF16 decoded). The options are checked here, by the rule the teacher applies, so
        a bad one is a :class:`~podium.protocol.batch.BatchError` before anything is sent."""
        if outputs is None:
            outputs = [LOGPROBS] + ([TOPK_LOGPROBS, TOPK_INDICES] if top_k else [])
        outputs = list(outputs)
        # BatchError before sending; the vocabulary bound of top_k is the teacher's to check
        opts = validate_options(top_k=top_k, micro_batch_size=micro_batch_size, temperature=temperature,
                                values_datatype=values_datatype, indices_datatype=indices_datatype,
                                vocab_size=2**62)
        params: dict[str, Any] = {}
        if opts.top_k:
            params[TOP_K] = opts.top_k
        if opts.micro_batch_size:
            params[MICRO_BATCH_SIZE] = opts.micro_batch_size
        if opts.temperature is not None:
            params[TEMPERATURE] = opts.temperature
        if values_datatype is not None:
            params[VALUES_DATATYPE] = opts.values_datatype
        if indices_datatype is not None:
            params[INDICES_DATATYPE] = opts.indices_datatype
        request_id = request_id or uuid.uuid4().hex
        binary = self.options.binary or opts.values_datatype in oip.BINARY_ONLY
        inputs = [(INPUT_IDS, ids), (INPUT_LENGTHS, lengths)]
        if candidate_ids is not None:
            inputs.append((CANDIDATE_IDS, candidate_ids))
        chunks, header_len = oip.encode_request(
            inputs,
            outputs=outputs,
            binary_inputs=self.options.binary,
            binary_outputs=binary,
            parameters=params,
        )
        headers = {REQUEST_ID_HEADER: request_id, CALLER_HEADER: _caller(),
                   "Content-Type": oip.BINARY_CONTENT_TYPE if header_len is not None else oip.JSON_CONTENT_TYPE}
        if header_len is not None:
            headers[oip.HEADER_LENGTH] = str(header_len)
        resp, record = self._call("POST", infer_path(self.name), chunks, headers, timeout_s)
        try:
            decoded = oip.decode_response(
                resp.body, oip.parse_header_length(resp.header(oip.HEADER_LENGTH), len(resp.body))
            )
        except oip.OIPError as exc:
            raise TeacherServerError(self.label, str(record.generation), resp.status, f"unreadable response: {exc}") from None
        missing = [name for name in outputs if name not in decoded.outputs]
        if missing:
            raise TeacherServerError(self.label, str(record.generation), resp.status, f"response lacks outputs {missing}")
        return {name: decoded.as_float32(name) if name in VALUE_OUTPUTS else decoded.outputs[name] for name in outputs}

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
