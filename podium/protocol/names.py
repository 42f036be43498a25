"""The names of podium's wire: tensors, parameters, headers, routes, the server's name and version.

=========================  =========================================================================
name                       meaning
=========================  =========================================================================
``input_ids``              INT32/INT64 ``[B, S]`` token ids, right-padded
``input_lengths``          INT32/INT64 ``[B]`` tokens of each row (``1..S``)
``logprobs``               FP32 ``[B, S]``: logprob of token ``i`` at position ``i`` (0 at 0 and past
                           the row's length), NeMo RL's convention
``topk_logprobs``          FP32 ``[B, S, k]`` with the request parameter ``top_k``
``topk_indices``           INT64 ``[B, S, k]`` vocabulary ids of those
=========================  =========================================================================
"""

from __future__ import annotations

from podium import __version__

INPUT_IDS = "input_ids"
INPUT_LENGTHS = "input_lengths"
LOGPROBS = "logprobs"
TOPK_LOGPROBS = "topk_logprobs"
TOPK_INDICES = "topk_indices"
INPUTS = (INPUT_IDS, INPUT_LENGTHS)
OUTPUTS = (LOGPROBS, TOPK_LOGPROBS, TOPK_INDICES)
ID_DATATYPES = ("INT32", "INT64")

# Request parameters.
TOP_K = "top_k"
MICRO_BATCH_SIZE = "micro_batch_size"
GENERATION_PARAMETER = "podium_generation"  # in the response's parameters

# HTTP headers.
AUTHORIZATION = "Authorization"
REQUEST_ID_HEADER = "X-Request-ID"
GENERATION_HEADER = "X-Podium-Generation"
TEACHER_HEADER = "X-Podium-Teacher"
RETRY_AFTER = "Retry-After"

# Routes.
HEALTH_LIVE = "/v2/health/live"
HEALTH_READY = "/v2/health/ready"
SERVER_METADATA = "/v2"


def model_path(name: str) -> str:
    return f"/v2/models/{name}"


def infer_path(name: str) -> str:
    return f"{model_path(name)}/infer"


SERVER_NAME = "podium"
SERVER_VERSION = __version__
