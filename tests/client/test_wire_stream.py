"""The top-k wire end to end: a real endpoint and podium's client, answers small (one write) and
large (streamed by the endpoint's sender threads), every values/indices datatype pair.

- what arrives is bit-identical to what the group answered in-process (BF16: its rounding of it),
  indices int64 for the caller whatever they travelled as, on a ragged batch;
- ids travel INT32 unless the caller asks INT64 (an older client that asks INT64 gets INT64);
- a client that goes away in the middle of a streamed answer frees it: the sender thread ends, the
  connection is closed and forgotten, nothing is logged as an error, the next caller is served.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from harness.lifecycle import Teacher
from harness.poll import wait_for
from harness.run import TeacherDef, make_run

import podium
from podium.client.pipeline import Pipeline
from podium.client.transport import HTTPTransport
from podium.protocol import oip, pieces
from podium.protocol.batch import Batch
from podium.protocol.names import (
    INDICES_DATATYPE,
    INPUT_IDS,
    INPUT_LENGTHS,
    LOGPROBS,
    TOP_K,
    TOPK_INDICES,
    TOPK_LOGIT_INDICES,
    TOPK_LOGITS,
    TOPK_LOGPROBS,
    infer_path,
)
from podium.protocol.query import Query
from podium.teacher.endpoint.stream import STREAM_FROM
from podium.teacher.seam import GroupFacts, Liveness

WIRE = TeacherDef("c3c3c3c3c3c3", "wire", ("wire",))
VOCAB = 151_936  # a real vocabulary (Qwen's): ids past 65535
FAST = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}
K = 16


def answer(ids: np.ndarray, lengths: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
    """The WireGroup's outputs for ``ids [B, S]``: float32 values with full mantissas (some
    negative, some tiny) and ids up to the vocabulary's last, per position and rank; 0 at and past
    each row's length (as a real group: the padding's width cannot change an answer)."""
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.arange(ids.shape[1])[None, :, None]
    rank = np.arange(top_k)[None, None, :]
    seed = ids[:, :, None] * 131 + pos * 7 + rank * 3
    scale = (np.float32(3.0) ** (rank % 5)).astype(np.float32)
    values = (((seed % 1009).astype(np.float32) - np.float32(500.0)) * np.float32(0.7310586) / scale).astype(np.float32)
    indices = (ids[:, :, None] * 17 + rank * 1237 + VOCAB - 1 - top_k) % VOCAB
    past = pos >= np.asarray(lengths)[:, None, None]
    values, indices = np.where(past, np.float32(0), values), np.where(past, 0, indices)
    return {LOGPROBS: values[:, :, 0].copy(), TOPK_LOGPROBS: values, TOPK_INDICES: indices,
            TOPK_LOGITS: np.float32(0) - values, TOPK_LOGIT_INDICES: indices[:, :, ::-1].copy()}  # 0 - 0 is +0


class WireGroup:
    """A stand-in group that answers every top-k output at once (:func:`answer` of the ids): the
    ids of ``get_topk_logits`` in int32 (as podium's worker head answers them), those of
    ``get_logprobs``' top-k in int64 (as another group may), so the endpoint both narrows and widens."""

    facts = GroupFacts(vocab_size=VOCAB, max_sequence_length=8192)
    broken = None
    last_batch = None
    liveness = Liveness()

    def compute(self, data: Batch, query: Query) -> dict[str, Any]:
        out = answer(data.input_ids, data.input_lengths, int(query.top_k or 1))
        out[TOPK_LOGIT_INDICES] = out[TOPK_LOGIT_INDICES].astype(np.int32)
        return {name: torch.from_numpy(data.pad(value)) for name, value in out.items() if query.wants(name)}

    def shutdown(self) -> bool:
        return True


@pytest.fixture(scope="module")
def wire_teacher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Teacher]]:
    layout, token = make_run(tmp_path_factory.mktemp("wire"), [WIRE])
    teacher = Teacher(WireGroup(), layout, WIRE, token).start()
    yield layout.rendezvous_path, teacher
    teacher.stop()


def ragged(rows: int, seq: int, seed: int) -> dict[str, torch.Tensor]:
    """A right-padded batch whose rows have different lengths (one of them full)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq + 1, rows)
    lengths[rows // 2] = seq
    ids = rng.integers(0, VOCAB, (rows, seq))
    ids[np.arange(seq)[None, :] >= lengths[:, None]] = 0
    return {"input_ids": torch.from_numpy(ids), "input_lengths": torch.from_numpy(lengths)}


def as_sent(values: np.ndarray, datatype: str) -> np.ndarray:
    """float32 values as they arrive when sent as ``datatype``."""
    return pieces.from_bf16(pieces.to_bf16(values)) if datatype == "BF16" else values


def same_bits(got: torch.Tensor, expected: np.ndarray) -> bool:
    array = got.numpy()
    return array.dtype == expected.dtype and array.shape == expected.shape and array.tobytes() == expected.tobytes()


PAIRS = [("FP32", "INT64"), ("FP32", "INT32"), ("BF16", "INT32"), ("BF16", "INT64")]


@pytest.mark.parametrize(("values", "indices"), PAIRS, ids=[f"{v}-{i}" for v, i in PAIRS])
@pytest.mark.parametrize(("rows", "seq", "binary"), [(3, 9, True), (8, 640, True), (40, 1024, True), (3, 7, False)],
                         ids=["small", "streamed", "streamed-over-calls", "json"])
def test_topk_answers_arrive_bit_identical(wire_teacher: tuple[Path, Teacher], rows: int, seq: int, binary: bool,
                                           values: str, indices: str) -> None:
    """Each values/indices pair, one write or streamed, binary or JSON tensors (BF16 is binary
    always): the group's numbers, bit for bit (BF16: their rounding), ids int64 in hand. The
    largest request spans several group calls (the answer leaves as their row blocks, some cut to
    the request's width) and its cast tensors several pieces (:class:`pieces.CastBlock`)."""
    path, teacher = wire_teacher
    assert teacher.server is not None
    sender = teacher.server.server.sender
    streamed_before = sender.sent
    batch = ragged(rows, seq, seed=rows * seq)
    expected = answer(batch["input_ids"].numpy(), batch["input_lengths"].numpy(), K)
    with podium.connect(path, binary=binary, **FAST) as client:
        top = client.get_topk_logits("wire", batch, K, values_datatype=values, indices_datatype=indices)
        assert same_bits(top["topk_logits"], as_sent(expected[TOPK_LOGITS], values))
        assert same_bits(top["topk_indices"], expected[TOPK_LOGIT_INDICES])  # int64, whatever travelled
        got = client.teacher("wire").get_logprobs(batch, top_k=K)
        for name in (LOGPROBS, TOPK_LOGPROBS, TOPK_INDICES):
            assert same_bits(got[name], expected[name]), name
    body = rows * seq * K * ((2 if values == "BF16" else 4) + (4 if indices == "INT32" else 8))
    assert (sender.sent - streamed_before > 0) == (binary and body >= STREAM_FROM)  # the large ones were streamed


def _infer(teacher: Teacher, params: dict[str, Any], outputs: tuple[str, ...]) -> oip.InferResponse:
    """One infer request by hand (podium's transport, no client defaults); the decoded answer."""
    ids = np.arange(2 * 5, dtype=np.int64).reshape(2, 5) * 9973
    chunks, header_len = oip.encode_request([(INPUT_IDS, ids), (INPUT_LENGTHS, np.array([5, 3]))], outputs=outputs,
                                            parameters=params)
    headers = {"Content-Type": oip.BINARY_CONTENT_TYPE, oip.HEADER_LENGTH: str(header_len)}
    transport = HTTPTransport(teacher.url, teacher.token)
    try:
        resp = transport.request("POST", infer_path("wire"), chunks, headers, timeout_s=30)
    finally:
        transport.close()
    assert resp.status == 200, bytes(resp.body[:300])
    return oip.decode_response(resp.body, oip.parse_header_length(resp.header(oip.HEADER_LENGTH), len(resp.body)))


def test_ids_travel_int32_when_asked_and_int64_otherwise(wire_teacher: tuple[Path, Teacher],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An older client (or any OIP client) that does not name ``indices_datatype`` gets INT64, one
    that asks INT64 gets INT64; podium's client asks INT32, for both kinds of top-k ids."""
    _, teacher = wire_teacher
    outputs = (TOPK_LOGPROBS, TOPK_INDICES, TOPK_LOGITS, TOPK_LOGIT_INDICES)
    for params, datatype in (({}, "INT64"), ({INDICES_DATATYPE: "INT64"}, "INT64"),
                             ({INDICES_DATATYPE: "INT32"}, "INT32")):
        decoded = _infer(teacher, {TOP_K: 4, **params}, outputs)
        assert decoded.datatypes[TOPK_INDICES] == decoded.datatypes[TOPK_LOGIT_INDICES] == datatype, params
        assert decoded.outputs[TOPK_LOGIT_INDICES].dtype == oip.DATATYPES[datatype]
    # podium's client, not told: INT32 on the wire (the answer is 4 bytes a value smaller), int64 in hand
    seen: list[int] = []
    request = HTTPTransport.request

    def measured(self: HTTPTransport, *args: Any, **kw: Any) -> Any:
        resp = request(self, *args, **kw)
        seen.append(len(resp.body))
        return resp

    path, _ = wire_teacher
    with podium.connect(path, **FAST) as client:
        batch = ragged(2, 6, seed=1)
        monkeypatch.setattr(HTTPTransport, "request", measured)  # counts the bytes, sends as before
        ids, lengths = batch["input_ids"].numpy(), batch["input_lengths"].numpy()
        narrow = client.teacher("wire").get_logprobs_arrays(ids, lengths, top_k=K, outputs=(TOPK_INDICES,))
        wide = client.teacher("wire").get_logprobs_arrays(ids, lengths, top_k=K, outputs=(TOPK_INDICES,),
                                                          indices_datatype="INT64")
    assert narrow[TOPK_INDICES].dtype == wide[TOPK_INDICES].dtype == np.int64
    assert np.array_equal(narrow[TOPK_INDICES], wide[TOPK_INDICES])
    assert seen[-1] - seen[-2] >= 2 * 6 * K * 4 - 8  # the JSON header may differ by its padding


def _raw_request(url: str, token: str, body_chunks: list[pieces.Buffer], header_len: int) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    body = b"".join(body_chunks)
    head = (f"POST {infer_path('wire')} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: {oip.BINARY_CONTENT_TYPE}\r\n{oip.HEADER_LENGTH}: {header_len}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    sock.sendall(head.encode() + body)
    return sock


def test_a_client_gone_mid_stream_frees_the_answer(wire_teacher: tuple[Path, Teacher],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    path, teacher = wire_teacher
    assert teacher.server is not None
    server = teacher.server.server
    sender = server.sender
    cut_before, open_before = sender.cut, server.connections.open
    ids = np.random.default_rng(0).integers(0, VOCAB, (48, 1024))
    chunks, header_len = oip.encode_request([(INPUT_IDS, ids), (INPUT_LENGTHS, np.full(48, 1024))],
                                            outputs=(TOPK_LOGITS, TOPK_LOGIT_INDICES), parameters={TOP_K: 64})
    caplog.set_level(logging.INFO)
    sock = _raw_request(teacher.url, teacher.token, chunks, header_len)  # a ~38 MB answer
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(65536)
    head = got.split(b"\r\n\r\n")[0].decode()
    length = next(int(line.split(":")[1]) for line in head.lower().splitlines() if line.startswith("content-length"))
    assert " 200 " in head.splitlines()[0] and length > 48 * 1024 * 64 * 12  # said before the body, JSON header too
    wait_for(lambda: sender.active == 1, "the answer being written by a sender thread", timeout_s=30)
    sock.recv(1 << 20)  # a little of it
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # a reset
    sock.close()
    wait_for(lambda: sender.active == 0 and sender.cut == cut_before + 1, "the sender thread freed", timeout_s=30)
    wait_for(lambda: server.connections.open <= open_before, "the connection closed and forgotten", timeout_s=30)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]
    assert any("cut off" in r.getMessage() for r in caplog.records)
    # the endpoint serves on: a whole streamed answer to the next caller
    with podium.connect(path, **FAST) as client:
        batch = ragged(8, 640, seed=2)
        top = client.get_topk_logits("wire", batch, K)
        expected = answer(batch["input_ids"].numpy(), batch["input_lengths"].numpy(), K)
        assert same_bits(top["topk_indices"], expected[TOPK_LOGIT_INDICES])
    assert json.loads(bytes(_health(teacher)))["ready"] is True


def _health(teacher: Teacher) -> memoryview:
    transport = HTTPTransport(teacher.url, teacher.token)
    try:
        started = time.monotonic()
        resp = transport.request("GET", "/v2/health/ready", timeout_s=10)
        assert time.monotonic() - started < 5
        return resp.body
    finally:
        transport.close()


def test_a_large_call_goes_as_row_chunks_in_flight_and_comes_back_whole(wire_teacher: tuple[Path, Teacher]) -> None:
    """``pipeline_mb``: a call whose answer is that large goes as requests of consecutive rows at
    once; their answers are put back in row order, bit-identical to one request's; an error of the
    call is raised as one request's would be."""
    path, teacher = wire_teacher
    assert teacher.server is not None
    server = teacher.server.server
    batch = ragged(7, 300, seed=11)  # 7 x 300 x 16 x (4 + 4) bytes: 0.27 MB
    expected = answer(batch["input_ids"].numpy(), batch["input_lengths"].numpy(), K)
    with podium.connect(path, pipeline_mb=0.1, **FAST) as client:
        served = server.served
        top = client.get_topk_logits("wire", batch, K)
        assert server.served - served == 4  # 4 requests of 2, 2, 1, 2 rows (about equal)
        assert same_bits(top["topk_logits"], expected[TOPK_LOGITS])
        assert same_bits(top["topk_indices"], expected[TOPK_LOGIT_INDICES])
        got = client.teacher("wire").get_logprobs(batch, top_k=K)
        for name in (LOGPROBS, TOPK_LOGPROBS, TOPK_INDICES):
            assert same_bits(got[name], expected[name]), name
        with pytest.raises(podium.client.TeacherRequestError, match="'top_k' = 300 is over this teacher's limit"):
            client.get_topk_logits("wire", batch, 300)
    with podium.connect(path, pipeline_mb=None, **FAST) as client:
        served = server.served
        assert same_bits(client.get_topk_logits("wire", batch, K)["topk_logits"], expected[TOPK_LOGITS])
        assert server.served - served == 1


def test_a_client_that_stops_reading_is_cut_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A client that reads nothing of a streamed answer for ``body_timeout_s`` holds its sender
    thread no longer: the answer is cut off, its connection closed."""
    layout, token = make_run(tmp_path, [WIRE])
    teacher = Teacher(WireGroup(), layout, WIRE, token, server_settings={"body_timeout_s": 1.0}).start()
    try:
        assert teacher.server is not None
        server = teacher.server.server
        ids = np.random.default_rng(1).integers(0, VOCAB, (48, 1024))
        chunks, header_len = oip.encode_request([(INPUT_IDS, ids), (INPUT_LENGTHS, np.full(48, 1024))],
                                                outputs=(TOPK_LOGITS, TOPK_LOGIT_INDICES), parameters={TOP_K: 64})
        caplog.set_level(logging.INFO)
        sock = _raw_request(teacher.url, token, chunks, header_len)
        try:
            wait_for(lambda: server.sender.active == 1, "the answer being written", timeout_s=30)
            started = time.monotonic()
            wait_for(lambda: server.sender.active == 0 and server.sender.cut == 1, "the answer cut off", timeout_s=30)
            assert 0.5 < time.monotonic() - started < 10
            assert any("read nothing for 1s" in r.getMessage() for r in caplog.records)
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "draining" not in r.getMessage()]
        finally:
            sock.close()
    finally:
        teacher.stop()


def test_a_call_is_pipelined_only_when_there_is_compute_to_hide_the_wire_behind() -> None:
    """With company the teacher computes the other call's rows while this answer travels: the
    chunks would only take more of its queue; a teacher that answers at once gains nothing."""
    pipeline = Pipeline(pipeline_mb=1.0)
    used: list[str] = []

    def chunk(index: int, start: int, end: int, left: float | None) -> dict[str, np.ndarray]:
        used.append("chunk")
        return {"x": np.arange(start, end)}

    def whole_while_another_runs() -> dict[str, np.ndarray]:
        used.append("whole")
        inner = pipeline.call(8, 10.0, lambda: (used.append("inner whole"), {"x": np.arange(8)})[1], chunk, None)
        assert np.array_equal(inner["x"], np.arange(8))
        return {"x": np.arange(8)}

    try:
        assert np.array_equal(pipeline.call(8, 10.0, dict, chunk, None)["x"], np.arange(8))  # alone: chunks
        assert used == ["chunk"] * 4
        used.clear()
        assert pipeline.call(8, 0.5, whole_while_another_runs, chunk, None)  # below pipeline_mb: whole
        assert used == ["whole", "inner whole"]  # the inner call had company: whole too
        # a teacher that answers at once (its answers wait less than their bodies take): no overlap to gain
        for _ in range(3):
            pipeline.observe(waited_s=0.002, received_s=0.05)
        used.clear()
        pipeline.call(8, 10.0, lambda: (used.append("whole"), {"x": np.arange(8)})[1], chunk, None)
        assert used == ["whole"]
        pipeline.observe(waited_s=1.3, received_s=0.05)  # one that computes: chunks again
        used.clear()
        pipeline.call(8, 10.0, dict, chunk, None)
        assert used == ["chunk"] * 4
    finally:
        pipeline.close()
