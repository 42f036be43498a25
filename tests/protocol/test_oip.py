"""The Open Inference Protocol codec, both ways, JSON and binary, and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from podium.protocol import oip, pieces


def _roundtrip_request(binary: bool) -> oip.InferRequest:
    ids = np.arange(12, dtype=np.int64).reshape(3, 4)
    lengths = np.array([4, 2, 1], dtype=np.int32)
    chunks, header_len = oip.encode_request(
        [("input_ids", ids), ("input_lengths", lengths)],
        outputs=["logprobs"], binary_inputs=binary, binary_outputs=binary, parameters={"top_k": 3}, request_id="r1",
    )
    body = pieces.join(chunks)
    assert (header_len is not None) == binary
    req = oip.decode_request(body, header_len)
    np.testing.assert_array_equal(req.inputs["input_ids"].array, ids)
    np.testing.assert_array_equal(req.inputs["input_lengths"].array, lengths)
    assert req.inputs["input_lengths"].datatype == "INT32"
    assert req.id == "r1" and req.parameters["top_k"] == 3
    assert req.wants_binary("logprobs") is binary
    return req


@pytest.mark.parametrize("binary", [True, False])
def test_request_roundtrip(binary: bool) -> None:
    _roundtrip_request(binary)


@pytest.mark.parametrize("binary", [True, False])
def test_response_roundtrip(binary: bool) -> None:
    logprobs = (np.random.default_rng(0).standard_normal((3, 5)) * 3).astype(np.float32)
    idx = np.arange(30, dtype=np.int64).reshape(3, 5, 2)
    chunks, header_len = oip.encode_response(
        "m", [("logprobs", logprobs, binary), ("topk_indices", idx, False)], request_id="x", model_version="1"
    )
    resp = oip.decode_response(pieces.join(chunks), header_len)
    assert resp.id == "x" and resp.model_name == "m"
    np.testing.assert_array_equal(resp.outputs["logprobs"], logprobs)  # float32 exact through JSON too
    np.testing.assert_array_equal(resp.outputs["topk_indices"], idx)


def test_json_nested_data_and_binary_output_default() -> None:
    body = json.dumps({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]]}],
                       "parameters": {"binary_data_output": True}}).encode()
    req = oip.decode_request(body)
    assert req.inputs["a"].array.tolist() == [[1, 2], [3, 4]]
    assert req.wants_binary("anything")


@pytest.mark.parametrize(
    ("header", "binary", "header_len", "message"),
    [
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2], "data": [1, 2, 3]}]}, b"", None,
         "needs 2 values"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2], "data": [1.5, 2]}]}, b"", None, "non-integer"),
        ({"inputs": [{"name": "a", "datatype": "INT32", "shape": [1], "data": [2**40]}]}, b"", None, "do not fit"),
        ({"inputs": [{"name": "a", "datatype": "STRING", "shape": [1], "data": [1]}]}, b"", None,
         "unsupported datatype"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": "2", "data": [1]}]}, b"", None, "shape must be"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2]}]}, b"", None, "neither"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": 8}}]},
         b"\0" * 8, 0, "binary_data_size 8 != 16"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": 16}}]},
         b"\0" * 8, 0, "only 8 binary bytes"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [1], "parameters": {"binary_data_size": 8}}]},
         b"\0" * 12, 0, "add up to 8"),
        ({"outputs": []}, b"", None, "no 'inputs'"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3]]}]}, b"", None,
         "regular"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [1], "data": [[1]]}]}, b"", None,
         r"data nests deeper than its shape \[1\]"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [1] * 65, "data": [1]}]}, b"", None,
         "shape has 65 dimensions; at most 8"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2**40, 2**40], "data": [1]}]}, b"", None,
         "more than the .*-byte body can hold"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [0, 2**70], "data": []}]}, b"", None,
         "more than the .*-byte body can hold"),
        ({"inputs": [{"name": "a", "datatype": "INT64", "shape": [1], "data": [1]}], "id": "a\r\nX-Evil: 1"}, b"", None,
         "'id' must be printable"),
    ],
)
def test_malformed_requests(header: dict, binary: bytes, header_len, message: str) -> None:
    head = json.dumps(header).encode()
    body = head + binary
    with pytest.raises(oip.OIPError, match=message) as info:
        oip.decode_request(body, len(head) if header_len is not None else None)
    assert info.value.status == 400


def test_deep_nesting_is_a_400_not_a_recursion_error() -> None:
    deep = (b'{"inputs": [{"name": "a", "datatype": "INT64", "shape": [1], "data": '
            + b"[" * 10_000 + b"]" * 10_000 + b"}]}")
    with pytest.raises(oip.OIPError, match="nesting too deep") as info:
        oip.decode_request(deep)
    assert info.value.status == 400


def test_request_head_says_what_the_binary_tensors_need_before_they_are_read() -> None:
    ids, lengths = np.arange(8, dtype=np.int64).reshape(2, 4), np.array([4, 3], dtype=np.int64)
    chunks, header_len = oip.encode_request([("input_ids", ids), ("input_lengths", lengths)])
    body = bytearray(pieces.join(chunks))
    head = oip.parse_request_head(body[:header_len], body_length=len(body), binary_follows=True)
    assert head.binary_bytes == 64 + 16 == len(body) - header_len
    with pytest.raises(oip.OIPError, match="add up to 80 bytes but 1000 bytes follow"):
        head.check_binary_length(1000)
    with pytest.raises(oip.OIPError, match="'input_lengths': binary data ends at byte 80 but only 70"):
        head.check_binary_length(70)
    req = head.decode(memoryview(body)[header_len:])
    got = req.inputs["input_ids"].array
    np.testing.assert_array_equal(got, ids)
    assert got.flags.writeable and np.shares_memory(got, np.frombuffer(body, dtype=np.uint8))  # a view, no copy


def test_header_length_and_json_errors() -> None:
    with pytest.raises(oip.OIPError, match="not an integer"):
        oip.parse_header_length("ten", 100)
    with pytest.raises(oip.OIPError, match="outside the body"):
        oip.parse_header_length("101", 100)
    with pytest.raises(oip.OIPError, match="malformed JSON"):
        oip.decode_request(b'{"inputs": [', None)
    with pytest.raises(oip.OIPError, match="JSON object"):
        oip.decode_request(b"[1, 2]", None)


def _bf16_cases() -> np.ndarray:
    """Exact ties both ways, values just above and below a tie, infinities, the largest finite
    values, subnormals, signed zeros, and random normals."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
                     0x7F7F7FFF, 0x00000001, 0x00018000, 0x80000000, 0x00000000], dtype=np.uint32)
    rng = np.random.default_rng(0)
    return np.concatenate([bits.view(np.float32), rng.standard_normal(4096).astype(np.float32) * 1e3])


def test_bf16_rounds_to_nearest_even_and_widens_exactly() -> None:
    values = _bf16_cases()
    bits = pieces.to_bf16(values)
    assert list(bits[:4]) == [0x3F80, 0x3F82, 0x3F81, 0x3F80]  # ties to even; off-tie to nearest
    assert list(bits[4:8]) == [0x7F80, 0xFF80, 0x7F80, 0x7F7F]  # inf stays; the largest finite rounds up to inf
    wide = pieces.from_bf16(bits)
    assert wide.dtype == np.float32 and np.array_equal(wide.view(np.uint32), bits.astype(np.uint32) << 16)
    assert np.all(np.abs(wide[12:] - values[12:]) <= np.abs(values[12:]) * 2.0**-8)


def test_the_teachers_bf16_cast_gives_the_protocols_bits() -> None:
    from podium.teacher.endpoint.answer import bf16_bits

    values = _bf16_cases()
    assert np.array_equal(bf16_bits(values), pieces.to_bf16(values))
    assert bf16_bits(np.array([np.nan], dtype=np.float32)).view(np.uint16)[0] & 0x7FC0 == 0x7FC0  # NaN stays NaN
