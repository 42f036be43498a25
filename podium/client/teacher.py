"""One remote teacher as a trainer sees it: find it, call it, follow it across restarts.

Owns :class:`TeacherClient`: it sends ``get_logprobs`` as an Open Inference Protocol request with
binary tensors over a keep-alive connection to one of the teacher's replicas (most teachers have
one), chosen by :class:`~podium.client.replicas.ReplicaSet` from their endpoint records (confirmed
with a health probe: records can be stale), and follows restarts and failovers: the teacher is
deterministic, so the same request sent again, to the next generation or another replica, gives
the same answer.

Each call has one deadline (``ClientOptions.call_timeout_s``, or the call's ``timeout_s``) that
every wait and every exchange of the call stays within (an exchange's socket timeouts are never
longer than what is left). Within it (:meth:`TeacherClient._call`), by the answer's
``X-Podium-Error-Kind`` where it has one (:mod:`podium.protocol.names`):

- ``request-failed`` (500: this request's own computation failed, the group survived) is not
  retried (:class:`TeacherRequestFailedError` with the server's cause) unless the generation that
  answered it is gone since (below);
- ``queue-full`` (503 + ``Retry-After``): that replica gets no call for a jittered backoff that
  starts at ``Retry-After`` and doubles on each full answer of the call (up to ``max_backoff_s``);
  the call goes to another replica meanwhile, or waits for the first one due;
- a connection error or a timeout of an exchange, and any other 503 (``group-broken``, draining,
  not ready), are retried: on another replica that answers, else the records are re-read and the
  call waits (also at most ``ready_timeout_s`` at a time) for a ready endpoint;
- a 5xx other than 503 is retried only when the generation that answered it is gone since
  (:meth:`TeacherClient._answerer_gone`); else it is :class:`TeacherServerError`;
- a 4xx (``refused``) is never retried (:class:`TeacherRequestError`);
- a request whose generation died under it (the connection dropped after it was sent, a
  ``group-broken`` answer, a 5xx from a generation gone since) is sent again at most
  ``max_retries_after_crash`` times; the next such death ends the call
  (:class:`TeacherRequestFailedError`): a request that kills every generation must not crash-loop
  the teacher for as long as the trainer keeps the call alive;
- a ``failed`` record ends the call only when that failure is final
  (:meth:`~podium.rendezvous.records.EndpointRecord.failure_is_final`, :class:`TeacherFailedError`) for every
  replica; otherwise the call waits for the next generation;
- when the deadline passes: :class:`TeacherUnavailableError` naming the teacher, the last
  generation seen, how long it waited and what it saw.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from podium.client.answers import Pipeline, answer_mb, caller_arrays, request_parameters
from podium.client.errors import (
    TeacherRequestError,
    TeacherRequestFailedError,
    TeacherServerError,
    TokenizerMismatchError,
    TransportError,
)
from podium.client.options import ClientOptions, convert_outputs
from podium.client.receive import EagerConversion
from podium.client.replicas import CallDeadline, ReplicaConnection, ReplicaSet, error_text
from podium.client.transport import BodyWatch, HTTPResponse
from podium.protocol import oip
from podium.protocol.batch import BatchError, Options, as_int_array, batch_inputs, validate_options
from podium.protocol.names import (
    CALLER_HEADER,
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    ERROR_GROUP_BROKEN,
    ERROR_KIND_HEADER,
    ERROR_QUEUE_FULL,
    ERROR_REQUEST_FAILED,
    GENERATION_HEADER,
    INDICES_DATATYPE,
    INPUT_IDS,
    INPUT_LENGTHS,
    LOGPROBS,
    REQUEST_ID_HEADER,
    RETRY_AFTER,
    TOPK_INDICES,
    TOPK_LOGIT_INDICES,
    TOPK_LOGITS,
    TOPK_LOGPROBS,
    infer_path,
    model_path,
)
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.records import EndpointRecord, Status, read_record

logger = logging.getLogger(__name__)

# Why a request is not sent again: it may be what kills the generations (docs/troubleshooting.md quotes it).
CRASHED = "{n} generations died under this request ({seen}); ClientOptions.max_retries_after_crash is {limit}"


def _caller() -> str:
    """Who calls, for the endpoint's turns between callers: this process (read per call: a
    forked worker is another caller)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class TeacherClient:
    """Calls one teacher, through whichever of its replicas can answer (:mod:`podium.client.replicas`),
    and follows their restarts; thread-safe."""

    def __init__(
        self,
        *,
        key: str,
        name: str,
        record_paths: Sequence[str | Path],
        token: str | None,
        options: ClientOptions = ClientOptions(),
        expected_fingerprint: str | None = None,
        expected_tokenizer_size: int | None = None,
    ) -> None:
        self.key = key
        self.name = name
        self.options = options
        self.expected_fingerprint = expected_fingerprint
        self.expected_tokenizer_size = expected_tokenizer_size
        self._lock = threading.Lock()
        self.retries = 0  # requests sent again (to this or another replica, or a later generation)
        self._checked_generations: set[str] = set()
        self._pipeline = Pipeline(options.pipeline_mb if options.binary else None)  # large calls in row chunks
        self.replicas = ReplicaSet(self.label, record_paths, token=token, options=options,
                                   check_tokenizer=self._check_tokenizer)

    def __repr__(self) -> str:
        return f"TeacherClient({self.label}, {', '.join(map(str, self.replicas.paths))})"

    @property
    def label(self) -> str:
        return f"{self.name!r} ({self.key})"

    @property
    def record_path(self) -> Path:
        """The first replica's endpoint record (a one-replica teacher's only one)."""
        return self.replicas.paths[0]

    @property
    def record(self) -> EndpointRecord | None:
        """The record of the endpoint the last call went to (None before the first call)."""
        last = self.replicas.last
        return last.record if last is not None else None

    def set_replicas(self, record_paths: Sequence[str | Path]) -> None:
        """Call the replicas whose endpoint records are ``record_paths`` from now on."""
        self.replicas.set_paths(record_paths)

    def _new_deadline(self, timeout_s: float | None) -> CallDeadline:
        limit = self.options.call_timeout_s if timeout_s is None else float(timeout_s)
        return CallDeadline(self.label, limit, self.options.ready_timeout_s)

    def wait_ready(self, timeout_s: float | None = None) -> EndpointRecord:
        """Block until a replica of the teacher is ready (at most ``timeout_s``, default
        ``ready_timeout_s``); return its record."""
        limit = self.options.ready_timeout_s if timeout_s is None else float(timeout_s)
        connection = self.replicas.acquire(CallDeadline(self.label, limit, limit))
        self.replicas.release(connection)
        return connection.record

    # ------------------------------------------------------------------ tokenizer safety

    def _check_tokenizer(self, where: str, record: EndpointRecord) -> None:
        if self.expected_fingerprint is None and self.expected_tokenizer_size is None:
            return
        gen = str(record.generation)
        if gen in self._checked_generations:
            return
        check_tokenizer_against(where, gen, record.model.model_dump() if record.model else {},
                                self.expected_fingerprint, self.expected_tokenizer_size)
        self._checked_generations.add(gen)

    # ------------------------------------------------------------------ calls

    def _answerer_gone(self, answered: ReplicaConnection, resp: HTTPResponse) -> str | None:
        """After a 5xx: what says the generation that answered it is gone since (None: nothing).

        The replica's record is re-read: it names another generation, or that generation is not
        ready any more (failed, draining, stopped). Then the error came from a teacher that broke
        under the request, and another generation or replica can answer it; else the error is the
        request's own."""
        gen = resp.header(GENERATION_HEADER) or str(answered.record.generation)
        try:
            now = read_record(answered.replica.path)
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

    def _call(self, method: str, path: str, body: list | None = None, headers: dict | None = None,
              timeout_s: float | None = None, watch: BodyWatch | None = None) -> tuple[HTTPResponse, EndpointRecord]:
        """One request, to a replica that can answer, within one deadline (see the module doc);
        returns a 2xx response and the record of the generation that gave it."""
        deadline = self._new_deadline(timeout_s)
        crashes: list[str] = []  # the generations that died under this request, and how
        full_answers = 0  # queue-full answers this call got: its backoff doubles with each
        while True:
            if deadline.left() <= 0:
                raise deadline.unavailable()
            connection = self.replicas.acquire(deadline)
            record = connection.record
            gen, where = str(record.generation), self.replicas.where(record)
            deadline.generation = gen
            replica = f"replica {record.replica} " if self.replicas.multiple else ""
            at = f"{replica}generation {gen} at {record.url}"
            try:
                resp = connection.transport.request(method, path, body, headers,
                                                    timeout_s=max(deadline.left(), 0.0), watch=watch)
            except TransportError as exc:
                deadline.note(f"{at}: {exc}")
                if exc.dropped:
                    self._crashed(crashes, where, gen, f"{at}: connection lost with the request sent")
                logger.warning("teacher %s generation %s: %s; re-reading the records", where, gen, exc)
                self._failed_over(connection, deadline)
                continue
            finally:
                self.replicas.release(connection)
            kind = resp.header(ERROR_KIND_HEADER)
            if kind == ERROR_QUEUE_FULL:
                full_answers += 1
                wait = self._backoff(_retry_after(resp), full_answers)
                deadline.note(f"{at}: HTTP {resp.status} {error_text(resp.body)}")
                logger.info("teacher %s generation %s: queue full; none sent there for %.1fs", where, gen, wait)
                self.replicas.full(connection, wait)
                self._retried()
                continue
            if kind == ERROR_GROUP_BROKEN:
                self._crashed(crashes, where, gen, f"{at}: HTTP {resp.status} {error_text(resp.body)}")
            if resp.status == 503 or kind == ERROR_GROUP_BROKEN:
                deadline.note(f"{at}: HTTP {resp.status} {error_text(resp.body)}")
                logger.info("teacher %s generation %s answered 503; another replica or a ready endpoint", where, gen)
                self._failed_over(connection, deadline)
                retry_after = _retry_after(resp)
                if retry_after and not self.replicas.any_usable():
                    time.sleep(min(retry_after, self.options.poll_interval_s, max(0.0, deadline.left())))
                continue
            if 400 <= resp.status < 500:
                raise TeacherRequestError(where, gen, resp.status, error_text(resp.body))
            if resp.status >= 500:
                gone = self._answerer_gone(connection, resp)
                if gone is not None:
                    deadline.note(f"{at}: HTTP {resp.status} {error_text(resp.body)}; {gone}")
                    if kind != ERROR_GROUP_BROKEN:  # counted above
                        self._crashed(crashes, where, gen, f"{at}: HTTP {resp.status}; {gone}")
                    logger.warning("teacher %s generation %s answered HTTP %d and %s; retrying", where, gen,
                                   resp.status, gone)
                    self._failed_over(connection, deadline)
                    continue
                if kind == ERROR_REQUEST_FAILED:
                    raise TeacherRequestFailedError(where, gen, resp.status, error_text(resp.body))
            if resp.status >= 300:
                raise TeacherServerError(where, gen, resp.status, error_text(resp.body))
            served = resp.header(GENERATION_HEADER)
            if served and served != gen:
                logger.info("teacher %s: answered by generation %s, record said %s; re-reading the record",
                            where, served, gen)
                self.replicas.forget(connection)
            return resp, record

    def _crashed(self, crashes: list[str], where: str, gen: str, how: str) -> None:
        """A generation died under this request (``how``): it may be sent again, at most
        ``max_retries_after_crash`` times in a call; the next death is :class:`TeacherRequestFailedError`."""
        crashes.append(how)
        limit = self.options.max_retries_after_crash
        if len(crashes) > limit:
            why = CRASHED.format(n=len(crashes), seen="; ".join(crashes), limit=limit)
            raise TeacherRequestFailedError(where, gen, None, why)
        logger.warning("teacher %s: generation %s died under this request (%s); sending it again (%d of at most %d)",
                       where, gen, how, len(crashes), limit)

    def _backoff(self, retry_after: float, full_answers: int) -> float:
        """How long a replica that said its queue is full gets no call: ``Retry-After`` (at least
        ``poll_interval_s``) doubling with each full answer of the call, jittered up to +50% so
        callers turned away together do not come back together, at most ``max_backoff_s``."""
        base = max(retry_after, self.options.poll_interval_s) * 2 ** min(full_answers - 1, 16)
        return min(base * random.uniform(1.0, 1.5), max(self.options.max_backoff_s, retry_after))

    def _failed_over(self, connection: ReplicaConnection, deadline: CallDeadline) -> None:
        """The replica did not answer the request: none goes there until its record says it is
        ready again; the request is sent again (to another replica when one answers)."""
        self.replicas.forget(connection)
        deadline.unusable()
        self._retried()

    def metadata(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``GET /v2/models/<name>``: the teacher's metadata (podium's fields under ``"podium"``)."""
        resp, _ = self._call("GET", model_path(self.name), timeout_s=timeout_s)
        return json.loads(bytes(resp.body))

    def get_logprobs(
        self,
        data: Mapping[str, Any],
        *,
        top_k: int | None = None,
        micro_batch_size: int | None = None,
        temperature: float | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
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
        micro_batch_size: int | None = None,
        temperature: float | None = None,
        values_datatype: str = "FP32",
        indices_datatype: str = "INT32",
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """NeMo RL's ``get_topk_logits``: ``{"topk_logits": float32 [B, S, k], "topk_indices": int64
        [B, S, k]}``, the temperature-scaled logits of the ``k`` likeliest next tokens at each
        position (position ``t``: the token after ``t``; zeros at and past ``length - 1``).
        ``values_datatype="BF16"`` halves the values' bytes on the wire; ids travel INT32 (as
        ``indices_datatype`` says; ``"INT64"`` for a teacher that must send them wide); the result is
        float32 / int64 either way."""
        ids, lengths = batch_inputs(data)
        out = self.get_logprobs_arrays(ids, lengths, top_k=k, micro_batch_size=micro_batch_size,
                                       temperature=temperature, outputs=(TOPK_LOGITS, TOPK_LOGIT_INDICES),
                                       values_datatype=values_datatype, indices_datatype=indices_datatype,
                                       timeout_s=timeout_s)
        result = {"topk_logits": out[TOPK_LOGITS], "topk_indices": out[TOPK_LOGIT_INDICES]}
        return convert_outputs(result, self.options.return_type)

    def get_candidate_logprobs(
        self,
        data: Mapping[str, Any],
        candidate_ids: Any = None,
        *,
        micro_batch_size: int | None = None,
        temperature: float | None = None,
        values_datatype: str = "FP32",
        timeout_s: float | None = None,
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
        top_k: int | None = None,
        micro_batch_size: int | None = None,
        temperature: float | None = None,
        outputs: Sequence[str] | None = None,
        candidate_ids: np.ndarray | None = None,
        values_datatype: str | None = None,
        indices_datatype: str | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray]:
        """One infer request on numpy arrays: the ``outputs`` named in :mod:`podium.protocol.names`
        (default: ``logprobs``, + top-k logprobs/indices with ``top_k``), as numpy arrays (values
        float32, BF16 decoded; indices int64, whatever they travelled as: INT32 unless
        ``indices_datatype`` says otherwise). The options are checked here, by the rule the teacher
        applies, so a bad one is a :class:`~podium.protocol.batch.BatchError` before anything is sent."""
        if outputs is None:
            outputs = [LOGPROBS] + ([TOPK_LOGPROBS, TOPK_INDICES] if top_k else [])
        outputs = list(outputs)
        # BatchError before sending; the vocabulary bound of top_k is the teacher's to check
        opts = validate_options(top_k=top_k, micro_batch_size=micro_batch_size, temperature=temperature,
                                values_datatype=values_datatype, indices_datatype=indices_datatype,
                                vocab_size=2**62)
        params = request_parameters(opts, values_named=values_datatype is not None,
                                    indices_named=indices_datatype is not None)
        request_id = request_id or uuid.uuid4().hex
        rows = int(ids.shape[0])
        size = answer_mb(rows, int(ids.shape[-1]), outputs, top_k=opts.top_k, values_datatype=opts.values_datatype,
                         candidates=None if candidate_ids is None else int(candidate_ids.shape[-1]),
                         indices_datatype=str(params[INDICES_DATATYPE]))

        def whole() -> dict[str, np.ndarray]:
            return self._request(ids, lengths, candidate_ids, outputs, opts, params, request_id, timeout_s)

        def chunk(index: int, start: int, end: int, left: float | None) -> dict[str, np.ndarray]:
            cands = None if candidate_ids is None else candidate_ids[start:end]
            return self._request(ids[start:end], lengths[start:end], cands, outputs, opts, params,
                                 f"{request_id}.{index}", left, widen=False, observed=index == 0)

        return self._pipeline.call(rows, size, whole, chunk,
                                   timeout_s if timeout_s is not None else self.options.call_timeout_s)

    def _request(self, ids: np.ndarray, lengths: np.ndarray, candidate_ids: np.ndarray | None, outputs: list[str],
                 opts: Options, params: dict[str, object], request_id: str, timeout_s: float | None,
                 widen: bool = True, observed: bool = True) -> dict[str, np.ndarray]:
        """One infer request; the ``outputs`` of its answer in the caller's dtypes (ids as they
        travelled unless ``widen``: a pipelined call widens them as it puts them in place); its
        timing told to the pipeline when ``observed`` (a later chunk waits behind the others)."""
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
        eager = EagerConversion(outputs, widen_ids=widen)
        resp, record = self._call("POST", infer_path(self.name), chunks, headers, timeout_s, watch=eager.received)
        if observed:
            self._pipeline.observe(resp.waited_s, resp.received_s)
        try:
            decoded = oip.decode_response(
                resp.body, oip.parse_header_length(resp.header(oip.HEADER_LENGTH), len(resp.body))
            )
        except oip.OIPError as exc:
            raise TeacherServerError(self.label, str(record.generation), resp.status,
                                     f"unreadable response: {exc}") from None
        missing = [name for name in outputs if name not in decoded.outputs]
        if missing:
            raise TeacherServerError(self.label, str(record.generation), resp.status,
                                     f"response lacks outputs {missing}")
        return caller_arrays(decoded, outputs, widen=widen, converted=eager.take(resp.body, decoded))

    def close(self) -> None:
        self.replicas.close()
        self._pipeline.close()


def check_tokenizer_against(
    teacher: str,
    generation: str,
    model: Mapping[str, Any],
    fingerprint: str | None,
    tokenizer_size: int | None,
    vocab_size: int | None = None,
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
            f"{where}: trainer's tokenizer has {tokenizer_size} tokens "
            f"but the teacher's vocabulary has only {teacher_vocab}"
        )
    if fingerprint is not None:
        if teacher_fp is None:
            logger.warning("%s publishes no tokenizer fingerprint; only the vocab size was checked", where)
        elif teacher_fp != fingerprint:
            raise TokenizerMismatchError(
                f"{where}: tokenizer fingerprint {teacher_fp} != trainer's {fingerprint} (different vocabularies)"
            )


def _retry_after(resp: HTTPResponse) -> float:
    try:
        return float(resp.header(RETRY_AFTER) or 0)
    except ValueError:
        return 0.0
