"""The client converts an answer's BF16 values and INT32 ids while the rest arrives
(:mod:`podium.client.receive`): fed a real encoded answer a few bytes at a time, what it hands over
is bit-identical to converting the decoded answer, and anything it does not recognise makes it hand
over nothing (the decoder then converts as before). Through a real endpoint:
``tests/client/test_wire_stream.py``."""

from __future__ import annotations

from email.message import Message

import numpy as np
import pytest

from podium.client.receive import EagerConversion, caller_arrays
from podium.protocol import oip, pieces
from podium.protocol.names import LOGPROBS, TOPK_LOGIT_INDICES, TOPK_LOGITS

OUTPUTS = (LOGPROBS, TOPK_LOGITS, TOPK_LOGIT_INDICES)


def _answer(binary: bool = True) -> tuple[bytearray, Message]:
    """FP32 logprobs, BF16 top-k logits and INT32 ids (JSON: FP32 values, BF16 being binary only)."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal((3, 50, 8)).astype(np.float32) * 100
    ids = rng.integers(0, 151_936, (3, 50, 8)).astype(np.int32)
    chunks, header_len = oip.encode_response(
        "t", [(LOGPROBS, values[:, :, 0].copy(), binary),
              (TOPK_LOGITS, pieces.to_bf16(values) if binary else values, binary),
              (TOPK_LOGIT_INDICES, ids, binary)], datatypes={TOPK_LOGITS: "BF16"} if binary else None)
    headers = Message()
    if header_len is not None:
        headers[oip.HEADER_LENGTH] = str(header_len)
    return bytearray(pieces.join(chunks)), headers


def _decoded(body: bytearray, headers: Message) -> oip.InferResponse:
    return oip.decode_response(body, oip.parse_header_length(headers.get(oip.HEADER_LENGTH), len(body)))


@pytest.mark.parametrize("step", [1, 7, 333, 4096, 1 << 20])
def test_converted_as_it_arrives_equals_converting_the_whole_answer(step: int) -> None:
    body, headers = _answer()
    view = memoryview(body)
    eager = EagerConversion(OUTPUTS, widen_ids=True)
    for got in [*range(step, len(body), step), len(body)]:
        eager.received(view, got, headers)
    decoded = _decoded(body, headers)
    expected = caller_arrays(decoded, OUTPUTS)
    taken = eager.take(view, decoded)
    assert set(taken) == {TOPK_LOGITS, TOPK_LOGIT_INDICES}  # FP32 logprobs travel as the caller gets them
    for name, array in taken.items():
        assert array.dtype == expected[name].dtype and array.tobytes() == expected[name].tobytes(), name
        assert not np.shares_memory(array, np.frombuffer(body, np.uint8))
    got = caller_arrays(decoded, OUTPUTS, converted=taken)
    assert all(got[name].tobytes() == expected[name].tobytes() for name in OUTPUTS)


def test_ids_are_left_as_they_travelled_when_not_widened_here() -> None:
    body, headers = _answer()
    view = memoryview(body)
    eager = EagerConversion(OUTPUTS, widen_ids=False)  # a pipelined chunk: widened as it is put in place
    eager.received(view, len(body), headers)
    assert set(eager.take(view, _decoded(body, headers))) == {TOPK_LOGITS}


def test_what_it_does_not_recognise_it_leaves_to_the_decoder() -> None:
    body, headers = _answer()
    view = memoryview(body)
    decoded = _decoded(body, headers)
    other = EagerConversion(OUTPUTS, widen_ids=True)
    other.received(view, len(body), headers)
    assert other.take(memoryview(bytearray(body)), decoded) == {}  # another attempt's body
    for broken in ("", "0", str(len(body) + 1), "nonsense"):
        bad = Message()
        bad[oip.HEADER_LENGTH] = broken
        eager = EagerConversion(OUTPUTS, widen_ids=True)
        eager.received(view, len(body), bad)
        assert eager.take(view, decoded) == {}, broken
    garbled = bytearray(body)
    garbled[:1] = b"["  # the JSON header is no object
    garbled_view = memoryview(garbled)
    eager = EagerConversion(OUTPUTS, widen_ids=True)
    eager.received(garbled_view, len(garbled), headers)
    assert eager.take(garbled_view, decoded) == {}
    json_body, json_headers = _answer(binary=False)
    json_view = memoryview(json_body)
    eager = EagerConversion(OUTPUTS, widen_ids=True)
    eager.received(json_view, len(json_body), json_headers)
    assert eager.take(json_view, _decoded(json_body, json_headers)) == {}
