"""One remote teacher as a trainer sees it: find it, call it, follow it across restarts.

Owns :class:`TeacherClient`: it sends ``get_logprobs`` as an Open Inference Protocol request with
binary tensors over a keep-alive connection to one of the teacher's replicas (most teachers have
one), chosen by :class:`~podium.client.replicas.ReplicaSet` from their endpoint records (confirmed
with a health probe: records can be stale), and follows restarts and failovers: the teacher is
deterministic, so the same request sent again, to the next generation or another replica, gives
the same answer.

What follows each exchange of a call, within the call's one deadline (an answer, an error, the
request sent again: to which replica, after what wait), is :mod:`podium.client.retry`'s rule; a
request whose answer is late goes once more to another replica meanwhile (hedging:
:mod:`podium.client.routing` says when, :mod:`podium.client.hedge` how), the first answer winning.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from podium.client.deadline import CallDeadline
from podium.client.errors import TeacherServerError, TokenizerMismatchError, TransportError
from podium.client.hedge import Hedger, Race
from podium.client.options import ClientOptions, convert_outputs
from podium.client.pipeline import Pipeline
from podium.client.receive import EagerConversion, caller_arrays
from podium.client.replicas import ReplicaConnection, ReplicaSet
from podium.client.retry import (
    Answer,
    BackOff,
    Exchange,
    Fail,
    Tally,
    asks_answerer,
    decide,
    gone_since,
    retry_after_s,
)
from podium.client.routing import SlowReplica
from podium.client.transport import BodyWatch, HTTPResponse
from podium.protocol import oip
from podium.protocol.batch import BatchError, as_int_array, batch_inputs
from podium.protocol.names import (
    CALLER_HEADER,
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    ERROR_KIND_HEADER,
    GENERATION_HEADER,
    INPUT_IDS,
    INPUT_LENGTHS,
    REQUEST_ID_HEADER,
    RETRY_AFTER,
    TOPK_LOGIT_INDICES,
    TOPK_LOGITS,
    infer_path,
    model_path,
)
from podium.protocol.query import Query, ask
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.records import EndpointRecord, read_record

logger = logging.getLogger(__name__)

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
        self.hedges = 0  # requests sent a second time, to another replica, because their answer was late
        self._hedger = Hedger(name)
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

    @property
    def slow_replicas(self) -> list[SlowReplica]:
        """The replicas drained of new calls for their slowness (``slow_factor``), each with its
        latency as this client measured it and the other replicas' median."""
        return self.replicas.slow()

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
        """What the replica's record, re-read, says of the generation that gave ``resp`` (a 5xx
        :func:`~podium.client.retry.asks_answerer` names): :func:`~podium.client.retry.gone_since`
        (None: nothing says it is gone, or the record cannot be read)."""
        try:
            now = read_record(answered.replica.path)
        except FileReadError:
            return None
        return gone_since(resp.header(GENERATION_HEADER) or str(answered.record.generation), now)

    def _retried(self) -> None:
        with self._lock:
            self.retries += 1

    def send(self, method: str, path: str, body: list | None = None, headers: dict | None = None,
              timeout_s: float | None = None, watch: BodyWatch | None = None) -> tuple[HTTPResponse, EndpointRecord]:
        """One request, to a replica that can answer, within one deadline, sent again as
        :func:`podium.client.retry.decide` says after each exchange; returns a 2xx response and the
        record of the generation that gave it. Public for ``podium front``, which relays other
        clients' requests through it (``watch`` sees each answer's bytes as they arrive)."""
        deadline = self._new_deadline(timeout_s)
        tally = Tally()
        while True:
            if deadline.left() <= 0:
                raise deadline.unavailable()
            connection = self.replicas.acquire(deadline)
            deadline.generation = str(connection.record.generation)
            resp, exchange, connection = self._exchange(connection, method, path, body, headers, deadline, watch)
            decision = decide(exchange, tally, self.options)
            if isinstance(decision, Fail):
                raise decision.error
            for level, text in decision.logs:
                logger.log(level, text)
            if isinstance(decision, Answer):
                if decision.forget:
                    self.replicas.forget(connection)
                assert resp is not None  # an answer is a response
                return resp, connection.record
            deadline.note(decision.note)
            tally = decision.tally
            self._retried()
            if isinstance(decision, BackOff):
                self.replicas.full(connection, decision.seconds)
                continue
            self.replicas.forget(connection)
            deadline.unusable()
            if decision.pause_s and not self.replicas.any_usable():
                time.sleep(decision.pause(deadline.left()))

    def _exchange(self, connection: ReplicaConnection, method: str, path: str, body: list | None,
                  headers: dict | None, deadline: CallDeadline,
                  watch: BodyWatch | None) -> tuple[HTTPResponse | None, Exchange, ReplicaConnection]:
        """Send the request through ``connection`` (released after), and once more to another
        replica if its answer is late (:meth:`_hedge`); the response (None when the exchange
        failed), what it produced for the retry rule, and the connection that gave it."""
        race: Race[tuple[HTTPResponse, ReplicaConnection]] = Race()
        delay = self.replicas.hedge_after(connection)
        if delay is not None and delay < deadline.left():
            self._hedger.schedule(delay, lambda: self._hedge(race, connection, method, path, body, headers, deadline))
        started = time.monotonic()
        try:
            resp = connection.transport.request(method, path, body, headers, timeout_s=max(deadline.left(), 0.0),
                                                watch=race.watching(watch), cancel=race.first)
        except TransportError as exc:
            cancelled = race.first.cancelled  # the hedge answered first
            self.replicas.release(connection, cancelled_s=time.monotonic() - started if cancelled else None)
            won = race.first_failed(deadline.left())
            if won is None:
                return None, replace(self._sent(connection), error=str(exc), dropped=exc.dropped), connection
            if not cancelled:  # its replica failed, the hedge answered: no new request goes there for now
                logger.info("teacher %s: %s; the same request sent to another replica answered", self.label, exc)
                self.replicas.forget(connection)
            return won[0], self._produced(won[1], won[0]), won[1]
        race.first_answering()
        self.replicas.release(connection, answered_s=time.monotonic() - started if resp.status < 300 else None)
        return resp, self._produced(connection, resp), connection

    def _hedge(self, race: Race[tuple[HTTPResponse, ReplicaConnection]], first: ReplicaConnection, method: str,
               path: str, body: list | None, headers: dict | None, deadline: CallDeadline) -> None:
        """The request sent through ``first``, still unanswered, sent to another replica (on a
        sender thread), if the budget and the replicas allow (:meth:`ReplicaSet.acquire_hedge`)."""
        if not race.start_second():
            return
        second = self.replicas.acquire_hedge(first)
        if second is None:
            race.second_failed()
            return
        with self._lock:
            self.hedges += 1
        logger.debug("teacher %s: no answer yet from %s; the request is sent to %s too", self.label,
                     self.replicas.where(first.record), self.replicas.where(second.record))
        started = time.monotonic()
        try:
            resp = second.transport.request(method, path, body, headers, timeout_s=max(deadline.left(), 0.0),
                                            cancel=race.second)
        except TransportError:
            took = time.monotonic() - started
            self.replicas.release(second, cancelled_s=took if race.second.cancelled else None)
            race.second_failed()
            return
        if resp.status >= 300:  # only an answer wins; the first copy's own outcome says the rest
            self.replicas.release(second)
            race.second_failed()
            return
        self.replicas.release(second, answered_s=time.monotonic() - started)
        race.second_answered((resp, second))

    def _sent(self, connection: ReplicaConnection) -> Exchange:
        """An exchange through ``connection``, as the retry rule names it, before its outcome."""
        record = connection.record
        gen = str(record.generation)
        replica = f"replica {record.replica} " if self.replicas.multiple else ""
        return Exchange(self.replicas.where(record), gen, f"{replica}generation {gen} at {record.url}")

    def _produced(self, connection: ReplicaConnection, resp: HTTPResponse) -> Exchange:
        """What the exchange through ``connection`` that gave ``resp`` produced, for the retry rule."""
        kind = resp.header(ERROR_KIND_HEADER)
        gone = self._answerer_gone(connection, resp) if asks_answerer(resp.status, kind) else None
        return replace(self._sent(connection), status=resp.status, kind=kind, body=resp.body, gone=gone,
                       retry_after_s=retry_after_s(resp.header(RETRY_AFTER)),
                       served=resp.header(GENERATION_HEADER))

    def metadata(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``GET /v2/models/<name>``: the teacher's metadata (podium's fields under ``"podium"``)."""
        resp, _ = self.send("GET", model_path(self.name), timeout_s=timeout_s)
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
        """One call on numpy arrays: the ``outputs`` named in :mod:`podium.protocol.names` (default:
        ``logprobs``, + top-k logprobs/indices with ``top_k``, + ``candidate_logprobs`` with
        ``candidate_ids``), as numpy arrays (values float32, BF16 decoded; indices int64, whatever
        they travelled as: INT32 unless ``indices_datatype`` says otherwise). The options are
        checked here, by the rule the teacher applies (:func:`podium.protocol.query.ask`), so a bad
        one is a :class:`~podium.protocol.batch.BatchError` before anything is sent (the vocabulary
        bound of ``top_k`` is the teacher's to check)."""
        query = ask(outputs=outputs, top_k=top_k, micro_batch_size=micro_batch_size, temperature=temperature,
                    values_datatype=values_datatype, indices_datatype=indices_datatype or "INT32",
                    candidates=candidate_ids is not None)
        return self.infer(ids, lengths, query, candidate_ids=candidate_ids, request_id=request_id, timeout_s=timeout_s)

    def infer(self, ids: np.ndarray, lengths: np.ndarray, query: Query, *, candidate_ids: np.ndarray | None = None,
              request_id: str | None = None, timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """One call of a checked :class:`~podium.protocol.query.Query` on numpy arrays (the typed form
        every ``get_*`` method above is an adapter over): one infer request, or a few of
        consecutive rows at once for a large answer (:class:`~podium.client.pipeline.Pipeline`). A
        full-vocabulary payload (``ask(outputs=["hidden_states"], payload_datatype="BF16")``) is one
        request, handed over as a tensor over the received bytes in the dtype asked
        (:func:`~podium.client.receive.payload_tensor`)."""
        request_id = request_id or uuid.uuid4().hex
        rows = int(ids.shape[0])
        candidates = None if candidate_ids is None else int(candidate_ids.shape[-1])
        size = query.answer_bytes(rows, int(ids.shape[-1]), candidates) / 1e6

        def whole() -> dict[str, np.ndarray]:
            return self._request(ids, lengths, candidate_ids, query, request_id, timeout_s)

        if query.payload is not None:  # one answer, handed over where it was received (no assembly copy)
            return whole()

        def chunk(index: int, start: int, end: int, left: float | None) -> dict[str, np.ndarray]:
            cands = None if candidate_ids is None else candidate_ids[start:end]
            return self._request(ids[start:end], lengths[start:end], cands, query, f"{request_id}.{index}", left,
                                 widen=False, observed=index == 0)

        return self._pipeline.call(rows, size, whole, chunk,
                                   timeout_s if timeout_s is not None else self.options.call_timeout_s)

    def _request(self, ids: np.ndarray, lengths: np.ndarray, candidate_ids: np.ndarray | None, query: Query,
                 request_id: str, timeout_s: float | None, widen: bool = True,
                 observed: bool = True) -> dict[str, np.ndarray]:
        """One infer request; the ``query``'s outputs of its answer in the caller's dtypes (ids as
        they travelled unless ``widen``: a pipelined call widens them as it puts them in place); its
        timing told to the pipeline when ``observed`` (a later chunk waits behind the others)."""
        outputs = list(query.outputs)
        binary = self.options.binary or query.values_datatype in oip.BINARY_ONLY or query.payload is not None
        inputs = [(INPUT_IDS, ids), (INPUT_LENGTHS, lengths)]
        if candidate_ids is not None:
            inputs.append((CANDIDATE_IDS, candidate_ids))
        chunks, header_len = oip.encode_request(
            inputs,
            outputs=outputs,
            binary_inputs=self.options.binary,
            binary_outputs=binary,
            parameters=query.parameters(),
        )
        headers = {REQUEST_ID_HEADER: request_id, CALLER_HEADER: _caller(),
                   "Content-Type": oip.BINARY_CONTENT_TYPE if header_len is not None else oip.JSON_CONTENT_TYPE}
        if header_len is not None:
            headers[oip.HEADER_LENGTH] = str(header_len)
        eager = EagerConversion(outputs, widen_ids=widen)
        resp, record = self.send("POST", infer_path(self.name), chunks, headers, timeout_s, watch=eager.received)
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
        self._hedger.close()
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

