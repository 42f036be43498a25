"""The query, the rule defined once for the client and the teacher: every option checked and named
when bad, the default outputs, the outputs a query may ask, its parameters on the wire and the
size of its answer."""

from __future__ import annotations

import pytest

from podium.protocol.batch import BatchError
from podium.protocol.query import Query, ask, default_outputs


def test_options_are_checked_and_named() -> None:
    query = ask(top_k=3, micro_batch_size=None, vocab_size=10)
    assert (query.top_k, query.micro_batch_size, query.temperature) == (3, None, None)
    assert (query.values_datatype, query.indices_datatype) == ("FP32", "INT64")
    assert ask(temperature=2, values_datatype="BF16", indices_datatype="INT32", vocab_size=10) \
        .temperature == 2.0
    for kwargs, message in (({"top_k": 11}, r"out of range \(1..10\)"), ({"top_k": True}, "must be an integer"),
                            ({"top_k": 0}, r"'top_k' = 0 is out of range"),
                            ({"micro_batch_size": 0}, "'micro_batch_size' = 0"),
                            ({"temperature": 0}, "'temperature' must be a finite number > 0"),
                            ({"temperature": float("inf")}, "'temperature' must be a finite number > 0"),
                            ({"values_datatype": "FP16"}, "'values_datatype' must be one of FP32, BF16"),
                            ({"indices_datatype": "UINT8"}, "'indices_datatype' must be one of INT64, INT32")):
        with pytest.raises(BatchError, match=message):
            ask(vocab_size=10, **kwargs)


def test_the_default_outputs_are_one_rule() -> None:
    assert default_outputs(None, False) == ("logprobs",)
    assert default_outputs(3, False) == ("logprobs", "topk_logprobs", "topk_indices")
    assert default_outputs(3, True) == ("logprobs", "topk_logprobs", "topk_indices", "candidate_logprobs")
    assert ask(top_k=3, candidates=True).outputs == default_outputs(3, True)
    assert ask().outputs == ("logprobs",)


def test_outputs_are_checked_and_named() -> None:
    assert ask(outputs=["topk_logits", "logprobs"], top_k=2).outputs == ("topk_logits", "logprobs")  # order kept
    for kwargs, message in (({"outputs": ["nope"]}, r"unknown output\(s\) \['nope'\]"),
                            ({"outputs": "logprobs"}, "must be a list of output names"),
                            ({"outputs": ["logprobs", "logprobs"]}, "requested twice"),
                            ({"outputs": ["topk_logits"]}, "need the request parameter 'top_k'"),
                            ({"outputs": ["candidate_logprobs"]}, "needs the input 'candidate_ids'")):
        with pytest.raises(BatchError, match=message):
            ask(**kwargs)


def test_parameters_say_the_query_without_its_defaults() -> None:
    assert ask().parameters() == {}
    assert ask(top_k=4, micro_batch_size=2, temperature=0.5, values_datatype="BF16", indices_datatype="INT32",
               outputs=["topk_logits"]).parameters() == {"top_k": 4, "micro_batch_size": 2, "temperature": 0.5,
                                                         "values_datatype": "BF16", "indices_datatype": "INT32"}
    assert ask(values_datatype="FP32", indices_datatype="INT64").parameters() == {}


def test_the_answer_size_counts_each_output_in_its_wire_dtype() -> None:
    query = ask(top_k=8, outputs=["logprobs", "topk_logprobs", "topk_indices", "topk_logits", "topk_logit_indices"],
                values_datatype="BF16", indices_datatype="INT32")
    # per position: logprobs 4 + top-k logprobs 8 x 4 + ids 8 x 4 + logits 8 x 2 (BF16) + ids 8 x 4
    assert query.answer_bytes(3, 5) == 3 * 5 * (4 + 32 + 32 + 16 + 32)
    cands = ask(outputs=["candidate_logprobs"], candidates=True)
    assert cands.answer_bytes(2, 4, candidates=6) == 2 * 4 * 6 * 4
    assert cands.answer_bytes(2, 4, candidates=6, binary={"candidate_logprobs": False}) == 2 * 4 * 6 * 16  # JSON


def test_queries_compute_alike_whatever_their_row_cap_and_wire_dtypes() -> None:
    a = ask(top_k=2, micro_batch_size=1, values_datatype="BF16", outputs=["topk_logits", "topk_logit_indices"])
    b = ask(top_k=2, outputs=["topk_logit_indices", "topk_logits"])
    assert a.computed_alike == b.computed_alike and a != b
    assert Query().computed_alike != ask(temperature=2.0).computed_alike


def test_a_full_vocabulary_payload_is_one_per_call_in_its_datatype() -> None:
    """``hidden_states`` / ``logits``: BF16 by default, FP16 or FP32 when asked; one per call; a
    teacher whose logits are not ``output_layer(h)`` refuses ``hidden_states`` naming why."""
    query = ask(outputs=["hidden_states"])
    assert (query.payload, query.payload_datatype, query.wire_datatype("hidden_states")) == ("hidden_states", "BF16",
                                                                                            "BF16")
    assert query.parameters() == {}
    assert ask(outputs=["logprobs", "logits"], payload_datatype="FP32").parameters() == {"payload_datatype": "FP32"}
    assert ask(outputs=["logprobs"]).payload is None
    for kwargs, message in (({"outputs": ["hidden_states", "logits"]}, "one full-vocabulary payload at most"),
                            ({"outputs": ["logits"], "payload_datatype": "INT8"},
                             "'payload_datatype' must be one of BF16, FP16, FP32"),
                            ({"outputs": ["hidden_states"], "hidden_states_refusal": "its logits are softcapped"},
                             "hidden_states is refused by this teacher: its logits are softcapped; ask for logits")):
        with pytest.raises(BatchError, match=message):
            ask(**kwargs)
    assert ask(outputs=["logits"], hidden_states_refusal="softcapped").payload == "logits"  # logits stay exact
    # computed in its dtype by the workers: another dtype computes otherwise
    assert ask(outputs=["logits"]).computed_alike != ask(outputs=["logits"], payload_datatype="FP16").computed_alike


def test_a_payload_answer_is_sized_by_the_teacher_width() -> None:
    rows, width = 64, 2048
    hidden = ask(outputs=["hidden_states"], payload_datatype="BF16")
    assert hidden.answer_bytes(rows, width, hidden_size=4096) == rows * width * 4096 * 2
    both = ask(outputs=["logprobs", "logits"], payload_datatype="FP32")
    assert both.answer_bytes(rows, width, vocab_size=1000) == rows * width * 4 + rows * width * 1000 * 4
    assert ask(outputs=["logits"], payload_datatype="FP16").answer_bytes(2, 3, vocab_size=10) == 2 * 3 * 10 * 2
