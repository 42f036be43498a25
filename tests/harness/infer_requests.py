"""Open Inference Protocol requests for the endpoint tests: bodies, and the table of bad requests.

- :func:`infer_body` (JSON tensors), :func:`binary_body` (binary tensors after a JSON header, and the
  header's length), :func:`json_tensors`, :func:`declared_body`: request bodies as a client sends them;
- :func:`bad_requests`: every malformed or refused request with the status and message it must get;
- :func:`check_bad_requests_then_good`: sends each, and a good request after each, to a served
  teacher (a stand-in group or the real one) whose answers ``expected`` computes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import requests

MAX_BODY = 256 * 1024


def infer_body(ids: Any, lengths: Any, *, id_type: str = "INT64", len_type: str = "INT64", **extra: Any) -> bytes:
    ids, lengths = np.asarray(ids), np.asarray(lengths)
    body = {"inputs": [
        {"name": "input_ids", "datatype": id_type, "shape": list(ids.shape), "data": ids.ravel().tolist()},
        {"name": "input_lengths", "datatype": len_type, "shape": list(lengths.shape), "data": lengths.ravel().tolist()},
    ], **extra}
    return json.dumps(body).encode()


def binary_body(ids: np.ndarray, lengths: np.ndarray, *, sizes: tuple[int, int] | None = None,
                trailing: bytes = b"") -> tuple[bytes, int]:
    a, b = ids.astype("<i8").tobytes(), lengths.astype("<i8").tobytes()
    sa, sb = sizes or (len(a), len(b))
    head = json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": list(ids.shape), "parameters": {"binary_data_size": sa}},
        {"name": "input_lengths", "datatype": "INT64", "shape": list(lengths.shape),
         "parameters": {"binary_data_size": sb}},
    ], "outputs": [{"name": "logprobs", "parameters": {"binary_data": True}}]}).encode()
    return head + a + b + trailing, len(head)


GOOD_IDS = np.array([[5, 6, 7, 8], [9, 10, 0, 0]])
GOOD_LENS = np.array([4, 2])


def json_tensors(ids: dict, lengths: dict | None = None, *, more: tuple[dict, ...] = (), **extra: Any) -> bytes:
    """A JSON body from raw tensor entries (``lengths`` defaults to one valid row of length 1;
    ``more``: further named inputs)."""
    lengths = lengths or {"datatype": "INT64", "shape": [1], "data": [1]}
    inputs = [{"name": "input_ids", **ids}, {"name": "input_lengths", **lengths}, *more]
    return json.dumps({"inputs": inputs, **extra}).encode()


def declared_body(shape: list[int], size: int, payload: bytes) -> tuple[bytes, int]:
    """A binary body whose header declares ``input_ids`` of ``shape`` and ``size`` bytes, followed by
    ``payload`` (whatever the test wants to send) and nothing for ``input_lengths``."""
    head = json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": shape, "parameters": {"binary_data_size": size}},
        {"name": "input_lengths", "datatype": "INT64", "shape": [1], "data": [1]}]}).encode()
    return head + payload, len(head)


def bad_requests(vocab: int, max_len: int, max_body: int) -> list[tuple[str, str, str, dict, bytes, int, str]]:
    """(case, method, path suffix, headers, body, status, message) for every kind of bad request."""
    ok_ids, ok_lens = GOOD_IDS, GOOD_LENS
    bin_ok, _ = binary_body(ok_ids, ok_lens)
    bad_sizes, hl_bad = binary_body(ok_ids, ok_lens, sizes=(8, 16))
    trailing, hl_tr = binary_body(ok_ids, ok_lens, trailing=b"\0" * 8)
    short, hl_short = binary_body(ok_ids, ok_lens)
    short = short[:hl_short + 40]  # the header declares 64 + 16 bytes; 40 follow
    ten_gb, hl_10g = declared_body([1, 10 * 2**30 // 8], 10 * 2**30, b"\0" * 64)
    deep = b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": ' + b"[" * 10_000 + \
        b"]" * 10_000 + b"}]}"
    hdr = "Inference-Header-Content-Length"
    infer = "/infer"
    return [
        ("unknown model", "POST", "/v2/models/nope/infer", {}, infer_body(ok_ids, ok_lens), 404,
         "unknown model 'nope'"),
        ("unknown version", "POST", "/versions/7/infer", {}, infer_body(ok_ids, ok_lens), 404, "no version '7'"),
        ("wrong datatype", "POST", infer, {}, infer_body(ok_ids.astype(float), ok_lens, id_type="FP32"), 400,
         "datatype FP32 not accepted"),
        ("wrong length datatype", "POST", infer, {}, infer_body(ok_ids, ok_lens, len_type="FP64"), 400,
         "'input_lengths': datatype FP64"),
        ("shape mismatch", "POST", infer, {}, infer_body(ok_ids, [4, 2, 1]), 400, "shape mismatch"),
        ("ids not 2-D", "POST", infer, {}, infer_body([1, 2, 3], [3]), 400, "must be [B, S]"),
        ("data vs shape", "POST", infer, {}, json.dumps({"inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [2, 4], "data": [1, 2, 3]},
            {"name": "input_lengths", "datatype": "INT64", "shape": [2], "data": [1, 1]}]}).encode(), 400,
         "needs 8 values"),
        ("length past S", "POST", infer, {}, infer_body(ok_ids, [5, 2]), 400, "input_lengths[0] = 5 not in 1..4"),
        ("negative length", "POST", infer, {}, infer_body(ok_ids, [4, -1]), 400, "input_lengths[1] = -1"),
        ("zero length", "POST", infer, {}, infer_body(ok_ids, [0, 2]), 400, "input_lengths[0] = 0 not in 1..4"),
        ("length past max", "POST", infer, {}, infer_body(np.ones((1, max_len + 1), int), [max_len + 1]), 400,
         f"exceeds the teacher's max_sequence_length {max_len}"),
        ("id outside vocab", "POST", infer, {}, infer_body([[1, vocab, 2, 3]], [4]), 400,
         f"input_ids[0, 1] = {vocab} not in 0..{vocab - 1}"),
        ("negative id", "POST", infer, {}, infer_body([[1, 2, -3, 3]], [4]), 400, "input_ids[0, 2] = -3"),
        ("empty batch", "POST", infer, {}, infer_body(np.zeros((0, 4), int), np.zeros((0,), int)), 400, "empty batch"),
        ("missing input", "POST", infer, {}, json.dumps({"inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [1]}]}).encode(), 400,
         "missing input 'input_lengths'"),
        ("unknown input", "POST", infer, {}, json.dumps({"inputs": [
            {"name": "foo", "datatype": "INT64", "shape": [1], "data": [1]}]}).encode(), 400,
         "unknown input(s) ['foo']"),
        ("non-integer data", "POST", infer, {}, json.dumps({"inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1.5, 2]},
            {"name": "input_lengths", "datatype": "INT64", "shape": [1], "data": [2]}]}).encode(), 400, "non-integer"),
        ("malformed JSON", "POST", infer, {}, b'{"inputs": [{"name": ', 400, "malformed JSON"),
        ("not an object", "POST", infer, {}, b"[]", 400, "must be a JSON object"),
        ("binary size vs shape", "POST", infer, {hdr: str(hl_bad)}, bad_sizes, 400, "binary_data_size 8 != 64"),
        ("binary bytes left over", "POST", infer, {hdr: str(hl_tr)}, trailing, 400, "add up to 80 bytes but 88"),
        ("header length past body", "POST", infer, {hdr: str(len(bin_ok) + 1)}, bin_ok, 400, "outside the body"),
        ("header length not int", "POST", infer, {hdr: "abc"}, bin_ok, 400, "not an integer"),
        ("binary without header", "POST", infer, {}, bin_ok, 400, "need the Inference-Header-Content-Length header"),
        ("top_k zero", "POST", infer, {}, infer_body(ok_ids, ok_lens, parameters={"top_k": 0}), 400, "'top_k' = 0"),
        ("top_k past vocab", "POST", infer, {}, infer_body(ok_ids, ok_lens, parameters={"top_k": vocab + 1}), 400,
         f"out of range (1..{vocab})"),
        ("top_k not int", "POST", infer, {}, infer_body(ok_ids, ok_lens, parameters={"top_k": "5"}), 400,
         "must be an integer"),
        ("micro batch zero", "POST", infer, {}, infer_body(ok_ids, ok_lens, parameters={"micro_batch_size": 0}), 400,
         "'micro_batch_size' = 0"),
        ("unknown output", "POST", infer, {}, infer_body(ok_ids, ok_lens, outputs=[{"name": "probs"}]), 400,
         "unknown output(s) ['probs']"),
        ("top-k output without top_k", "POST", infer, {},
         infer_body(ok_ids, ok_lens, outputs=[{"name": "topk_indices"}]), 400, "need the request parameter 'top_k'"),
        ("topk_logits without top_k", "POST", infer, {}, infer_body(ok_ids, ok_lens, outputs=[{"name": "topk_logits"}]),
         400, "need the request parameter 'top_k'"),
        ("temperature zero", "POST", infer, {}, infer_body(ok_ids, ok_lens, parameters={"temperature": 0}), 400,
         "'temperature' must be a finite number > 0, got 0"),
        ("temperature not a number", "POST", infer, {}, infer_body(ok_ids, ok_lens, parameters={"temperature": "hot"}),
         400, "'temperature' must be a finite number > 0"),
        ("values datatype unknown", "POST", infer, {},
         infer_body(ok_ids, ok_lens, parameters={"top_k": 2, "values_datatype": "FP16"}), 400,
         "'values_datatype' must be one of FP32, BF16, got 'FP16'"),
        ("BF16 asked in JSON", "POST", infer, {},
         infer_body(ok_ids, ok_lens, parameters={"top_k": 2, "values_datatype": "BF16"},
                    outputs=[{"name": "topk_logits"}]), 400,
         "values_datatype=BF16 travels only as binary data"),
        ("candidate logprobs without candidates", "POST", infer, {},
         infer_body(ok_ids, ok_lens, outputs=[{"name": "candidate_logprobs"}]), 400, "needs the input 'candidate_ids'"),
        ("candidates of the wrong shape", "POST", infer, {}, json_tensors(
            {"datatype": "INT64", "shape": [2, 4], "data": ok_ids.ravel().tolist()},
            {"datatype": "INT64", "shape": [2], "data": ok_lens.tolist()},
            more=({"name": "candidate_ids", "datatype": "INT64", "shape": [2, 3, 1], "data": [1] * 6},)), 400,
         "'candidate_ids': shape [2, 3, 1] must be [B, S, C]"),
        ("candidate outside vocab", "POST", infer, {}, json_tensors(
            {"datatype": "INT64", "shape": [2, 4], "data": ok_ids.ravel().tolist()},
            {"datatype": "INT64", "shape": [2], "data": ok_lens.tolist()},
            more=({"name": "candidate_ids", "datatype": "INT64", "shape": [2, 4, 1],
                   "data": [1, vocab] + [1] * 6},)), 400,
         f"candidate_ids outside the vocabulary: candidate_ids[0, 1, 0] = {vocab}"),
        ("body over the limit", "POST", infer, {}, b"{" + b" " * (max_body + 10) + b"}", 413,
         f"larger than the limit of {max_body} bytes"),
        ("65 dimensions", "POST", infer, {}, json_tensors({"datatype": "INT64", "shape": [1] * 65, "data": [1]}), 400,
         "tensor 'input_ids': shape has 65 dimensions; at most 8"),
        ("JSON nested 10,000 deep", "POST", infer, {}, deep, 400, "nesting too deep"),
        ("data nested deeper than the shape", "POST", infer, {},
         json_tensors({"datatype": "INT64", "shape": [1, 1], "data": [[[[1]]]]}), 400,
         "'input_ids': data nests deeper than its shape [1, 1]"),
        ("shape product past the body", "POST", infer, {},
         json_tensors({"datatype": "INT64", "shape": [2**40, 2**40], "data": [1]}), 400,
         f"'input_ids': shape [{2**40}, {2**40}] has {2**80} elements, more than the"),
        ("shape past int64", "POST", infer, {}, json_tensors({"datatype": "INT64", "shape": [0, 2**70], "data": []}),
         400, "more than the"),
        ("10 GB declared, 64 bytes sent", "POST", infer, {hdr: str(hl_10g)}, ten_gb, 400,
         "'input_ids': shape [1, 1342177280] has 1342177280 elements, more than the"),
        ("binary body shorter than declared", "POST", infer, {hdr: str(hl_short)}, short, 400,
         f"'input_ids': binary data ends at byte 64 but only 40 binary bytes follow the JSON header "
         f"(Content-Length {hl_short + 40} = {hl_short} bytes of JSON header + 40; the binary tensors declare 80)"),
        ("id with a newline", "POST", infer, {}, infer_body(ok_ids, ok_lens, id="a\r\nX-Injected: 1"), 400,
         "'id' must be printable"),
        ("top_k deeply nested", "POST", infer, {},
         infer_body(ok_ids, ok_lens, parameters={"top_k": json.loads("[" * 500 + "]" * 500)}), 400,
         "'top_k' must be an integer, got [[[[...]]]]"),
        ("GET on infer", "GET", infer, {}, b"", 405, "not allowed"),
        ("unknown route", "GET", "/v2/nothing/here", {}, b"", 404, "no route"),
    ]


def send(session: requests.Session, url: str, model: str, token: str, case: tuple) -> requests.Response:
    _name, method, path, headers, body, _status, _msg = case
    if path.startswith("/v2"):
        full = url + path
    elif path.startswith("/versions"):
        full = f"{url}/v2/models/{model}{path}"
    else:
        full = f"{url}/v2/models/{model}{path}"
    return session.request(method, full, data=body or None,
                           headers={"Authorization": f"Bearer {token}", **headers}, timeout=60)


def check_bad_requests_then_good(url: str, model: str, token: str, vocab: int, max_len: int, max_body: int,
                                 expected: Any) -> None:
    """Each bad request gets its status and message; the good request right after it succeeds."""
    session = requests.Session()
    ids, lens = GOOD_IDS, GOOD_LENS
    good, hl = binary_body(ids, lens)
    for case in bad_requests(vocab, max_len, max_body):
        resp = send(session, url, model, token, case)
        assert resp.status_code == case[5], (case[0], resp.status_code, resp.text[:300])
        assert resp.headers["Content-Type"].startswith("application/json"), case[0]
        assert case[6] in resp.json()["error"], (case[0], resp.json())
        ok = session.post(f"{url}/v2/models/{model}/infer", data=good, timeout=120,
                          headers={"Authorization": f"Bearer {token}", "Inference-Header-Content-Length": str(hl)})
        assert ok.status_code == 200, (case[0], ok.text[:300])
        header_len = int(ok.headers["Inference-Header-Content-Length"])
        out = np.frombuffer(ok.content[header_len:], dtype="<f4").reshape(ids.shape)
        np.testing.assert_allclose(out, expected(ids, lens), atol=1e-5, err_msg=case[0])
