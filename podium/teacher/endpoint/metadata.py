"""What the endpoint says about itself: KServe v2 server and model metadata, and the model's facts.

:func:`server_metadata` answers ``GET /v2``; :func:`model_info` is the
:class:`~podium.rendezvous.records.ModelInfo` the lifecycle publishes in the endpoint record (and a
client checks its tokenizer against); :func:`model_metadata` answers ``GET /v2/models/<name>``: the
v2 fields, then podium's own (the model's facts, what a request may ask, and the server's state as
the caller passes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podium.protocol.names import (
    CANDIDATE_IDS,
    CANDIDATE_LOGPROBS,
    HIDDEN_STATES,
    ID_DATATYPES,
    INDEX_DATATYPES,
    INDICES_DATATYPE,
    INPUT_IDS,
    INPUT_LENGTHS,
    LOGITS,
    LOGPROBS,
    MICRO_BATCH_SIZE,
    PAYLOAD_DATATYPE,
    PAYLOAD_DATATYPES,
    SERVER_NAME,
    SERVER_VERSION,
    TEMPERATURE,
    TOP_K,
    TOPK_INDICES,
    TOPK_LOGIT_INDICES,
    TOPK_LOGITS,
    TOPK_LOGPROBS,
    VALUE_DATATYPES,
    VALUES_DATATYPE,
)
from podium.protocol.query import MAX_TEMPERATURE, MIN_TEMPERATURE
from podium.rendezvous.records import ModelInfo
from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.seam import GroupFacts


def server_metadata() -> dict[str, Any]:
    """The answer of ``GET /v2``: the server's name, version and protocol extensions."""
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": ["binary_tensor_data"]}


def model_info(facts: GroupFacts, config: EndpointConfig) -> ModelInfo:
    """The model's facts: the group's (its checkpoint and layout) and the config's (names, tokenizer)."""
    return ModelInfo(
        served_name=config.served_name,
        model_name=config.model_name,
        checkpoint_path=facts.checkpoint_path or None,
        vocab_size=facts.vocab_size,
        max_sequence_length=facts.max_sequence_length,
        sequence_length_multiple=facts.sequence_length_multiple,
        data_parallel_size=facts.data_parallel_size,
        temperature=facts.temperature,
        parallel_sizes=dict(facts.parallel_sizes),
        tokenizer_fingerprint=config.tokenizer_fingerprint,
        tokenizer_vocab_size=config.tokenizer_vocab_size,
    )


def model_metadata(config: EndpointConfig, info: ModelInfo, state: Mapping[str, Any],
                   facts: GroupFacts | None = None) -> dict[str, Any]:
    """The model metadata answer; ``state``: the server's (readiness, queue, counters), last;
    ``facts``: the group's, for the payloads it offers (their width, a refusal's reason)."""
    gen = config.generation
    hidden = facts.hidden_size if facts is not None else None
    refusal = facts.hidden_states_refusal if facts is not None else None
    return {
        "name": config.served_name,
        "versions": [config.model_version],
        "platform": "podium",
        "inputs": [
            {"name": INPUT_IDS, "datatype": "INT64", "shape": [-1, -1]},
            {"name": INPUT_LENGTHS, "datatype": "INT64", "shape": [-1]},
            {"name": CANDIDATE_IDS, "datatype": "INT64", "shape": [-1, -1, -1], "optional": True},
        ],
        "outputs": [
            {"name": LOGPROBS, "datatype": "FP32", "shape": [-1, -1]},
            {"name": TOPK_LOGPROBS, "datatype": "FP32", "shape": [-1, -1, -1]},
            {"name": TOPK_INDICES, "datatype": "INT64", "shape": [-1, -1, -1]},
            {"name": TOPK_LOGITS, "datatype": "FP32", "shape": [-1, -1, -1]},
            {"name": TOPK_LOGIT_INDICES, "datatype": "INT64", "shape": [-1, -1, -1]},
            {"name": CANDIDATE_LOGPROBS, "datatype": "FP32", "shape": [-1, -1, -1]},
            {"name": HIDDEN_STATES, "datatype": PAYLOAD_DATATYPES[0], "shape": [-1, -1, hidden or -1]},
            {"name": LOGITS, "datatype": PAYLOAD_DATATYPES[0], "shape": [-1, -1, info.vocab_size]},
        ],
        "podium": {
            **info.model_dump(mode="json"),
            "teacher_key": config.teacher_key,
            "aliases": list(config.aliases),
            "generation": None if gen is None else {"job_id": gen.job_id, "restart": gen.restart},
            "accepted_input_datatypes": list(ID_DATATYPES),
            "parameters": {TOP_K: f"1..{config.max_top_k(info.vocab_size)}", MICRO_BATCH_SIZE: ">= 1",
                           TEMPERATURE: f"{MIN_TEMPERATURE:g}..{MAX_TEMPERATURE:g}",
                           VALUES_DATATYPE: list(VALUE_DATATYPES), INDICES_DATATYPE: list(INDEX_DATATYPES),
                           PAYLOAD_DATATYPE: list(PAYLOAD_DATATYPES)},
            # the full-vocabulary payloads: hidden_states' width, and why it is refused (None: offered)
            "payloads": {"hidden_size": hidden, "hidden_states_refused": refusal},
            **state,
        },
    }
