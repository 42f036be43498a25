"""The names of podium's wire: tensors, parameters, headers, routes, the server's name and version.

=========================  =========================================================================
name                       meaning
=========================  =========================================================================
``input_ids``              INT32/INT64 ``[B, S]`` token ids, right-padded
``input_lengths``          INT32/INT64 ``[B]`` tokens of each row (``1..S``)
``logprobs``               FP32 ``[B, S]``: logprob of token ``i`` at position ``i`` (0 at 0 and past
                           the row's length), NeMo RL's convention
``topk_logprobs``          FP32 ``[B, S, k]`` with the request parameter ``top_k``, same alignment
                           as ``logprobs`` (position ``i``: the distribution token ``i`` came from)
``topk_indices``           INT64/INT32 ``[B, S, k]`` vocabulary ids of those
``topk_logits``            FP32/BF16 ``[B, S, k]``: the temperature-scaled *logits* ``z / T`` of the
                           top-k ids in the *next-token* alignment (position ``t``: the distribution
                           of the token after ``t``; 0 at and past ``length - 1``), NeMo RL's
                           ``get_topk_logits``
``topk_logit_indices``     INT64/INT32 ``[B, S, k]`` vocabulary ids of those
``candidate_ids``          input, INT32/INT64 ``[B, S, C]``: token ids whose logprobs the caller wants
                           at each position (next-token alignment, e.g. the student's own top-k)
``candidate_logprobs``     FP32/BF16 ``[B, S, C]``: ``log_softmax(z / T)`` of those ids
``target_rank``            INT64/INT32 ``[B, S]``: the 1-based rank of token ``i`` in the distribution it
                           was drawn from (1 + the ids of larger logprob; ``logprobs``' alignment, 0 at 0
                           and past the row's length), vLLM's prompt-logprob ``rank``
``hidden_states``          BF16/FP16/FP32 ``[B, S, H]``: the input of the output layer (after the
                           final norm) at each position ``i < length`` (the state that predicts
                           token ``i+1``; 0 past the row's length), NeMo RL's
                           ``teacher_full_hidden_states``
``logits``                 BF16/FP16/FP32 ``[B, S, V]``: the full-vocabulary logits ``z / T`` (V the
                           real vocabulary, TP padding cut), same alignment, NeMo RL's
                           ``teacher_full_logits``
=========================  =========================================================================

Request parameters: ``top_k`` (``1..min(vocab, server.max_top_k)``), ``micro_batch_size``,
``temperature`` (``0.001..1000``; default: the teacher's), ``values_datatype`` (``FP32`` or
``BF16``: top-k logits and candidate logprobs) and ``indices_datatype`` (``INT64``, the default, or
``INT32``: top-k indices of either kind; answered INT64 when the vocabulary does not fit INT32;
podium's client asks INT32 and hands its caller int64), ``payload_datatype`` (``BF16``, the
default, ``FP16`` or ``FP32``: the full-vocabulary payloads). BF16 travels only as binary data; the
payloads travel only as binary data whatever their dtype (a JSON list of 10⁹ numbers is no answer).
"""

from __future__ import annotations

from podium.version import __version__

INPUT_IDS = "input_ids"
INPUT_LENGTHS = "input_lengths"
LOGPROBS = "logprobs"
TOPK_LOGPROBS = "topk_logprobs"
TOPK_INDICES = "topk_indices"
TOPK_LOGITS = "topk_logits"
TOPK_LOGIT_INDICES = "topk_logit_indices"
CANDIDATE_IDS = "candidate_ids"
CANDIDATE_LOGPROBS = "candidate_logprobs"
TARGET_RANK = "target_rank"
HIDDEN_STATES = "hidden_states"
LOGITS = "logits"
INPUTS = (INPUT_IDS, INPUT_LENGTHS, CANDIDATE_IDS)
OUTPUTS = (LOGPROBS, TOPK_LOGPROBS, TOPK_INDICES, TOPK_LOGITS, TOPK_LOGIT_INDICES, CANDIDATE_LOGPROBS,
           TARGET_RANK, HIDDEN_STATES, LOGITS)
PAYLOAD_OUTPUTS = (HIDDEN_STATES, LOGITS)  # full-vocabulary payloads: one per call, binary only
TOPK_OUTPUTS = (TOPK_LOGPROBS, TOPK_INDICES, TOPK_LOGITS, TOPK_LOGIT_INDICES)  # need top_k
VALUE_OUTPUTS = (TOPK_LOGITS, CANDIDATE_LOGPROBS)  # may travel as BF16
INDEX_OUTPUTS = (TOPK_INDICES, TOPK_LOGIT_INDICES, TARGET_RANK)  # integers: may travel as INT32
ID_DATATYPES = ("INT32", "INT64")  # accepted for input ids
VALUE_DATATYPES = ("FP32", "BF16")  # offered for top-k logits / candidate logprobs (default first)
INDEX_DATATYPES = ("INT64", "INT32")  # offered for top-k indices (default first)
PAYLOAD_DATATYPES = ("BF16", "FP16", "FP32")  # offered for the payloads (default first)
INT32_VOCAB = 2**31  # vocabularies up to this size have their ids travel INT32 when asked

# Request parameters.
TOP_K = "top_k"
MICRO_BATCH_SIZE = "micro_batch_size"
TEMPERATURE = "temperature"
VALUES_DATATYPE = "values_datatype"
INDICES_DATATYPE = "indices_datatype"
PAYLOAD_DATATYPE = "payload_datatype"
GENERATION_PARAMETER = "podium_generation"  # in the response's parameters

# HTTP headers.
AUTHORIZATION = "Authorization"
REQUEST_ID_HEADER = "X-Request-ID"
GENERATION_HEADER = "X-Podium-Generation"
TEACHER_HEADER = "X-Podium-Teacher"
# Who is calling (host:pid of the client): the endpoint's scheduler takes turns between callers.
CALLER_HEADER = "X-Podium-Caller"
RETRY_AFTER = "Retry-After"
# What kind of failure an error answer is (the client's retry rule reads it, never the text):
ERROR_KIND_HEADER = "X-Podium-Error-Kind"
ERROR_REQUEST_FAILED = "request-failed"  # 500: this request's own computation failed; retried nowhere
ERROR_GROUP_BROKEN = "group-broken"  # 503: the group broke under this request; the next generation can
ERROR_UNAVAILABLE = "unavailable"  # 503: not computed (starting, draining, broken before it came): elsewhere
ERROR_QUEUE_FULL = "queue-full"  # 503 + Retry-After: try later (or another replica)
ERROR_REFUSED = "refused"  # 4xx: the request itself is refused (malformed, over a bound); retried nowhere
ERROR_KINDS = (ERROR_REQUEST_FAILED, ERROR_GROUP_BROKEN, ERROR_UNAVAILABLE, ERROR_QUEUE_FULL, ERROR_REFUSED)

# Routes.
HEALTH_LIVE = "/v2/health/live"
HEALTH_READY = "/v2/health/ready"
SERVER_METADATA = "/v2"
METRICS = "/metrics"  # Prometheus text format, no auth (as Triton's and vLLM's) unless server.metrics_need_token
# The server's proof that it holds the run's token and is the record's generation (no auth: podium's
# client asks it on each new connection before it sends the token there).
PROOF = "/v2/podium/proof"
PROOF_NONCE = "nonce"  # its query parameter: the client's challenge, hex


# The scoring fronts other trainers already call (vLLM's OpenAI-compatible server, SGLang's native
# API): an OpenAI client's ``base_url`` is a teacher's URL + OPENAI_BASE.
OPENAI_BASE = "/v1"
OPENAI_COMPLETIONS = OPENAI_BASE + "/completions"
OPENAI_MODELS = OPENAI_BASE + "/models"
SGLANG_GENERATE = "/generate"
VLLM_TOKEN_GENERATE = "/inference/v1/generate"  # vLLM's token-in route (prime-rl's teacher scoring)
# A base URL that carries the run's token in its path, for clients that send no Authorization header
# (TRL's, slime's, miles'): <url>/token/<token>/v1/completions is /v1/completions with the token.
# Only the scoring fronts' routes take it.
TOKEN_PATH = "/token"
# vLLM's and SGLang's readiness probe: TRL's client polls it, without a token, before its first call.
PLAIN_HEALTH = "/health"


def model_path(name: str) -> str:
    return f"/v2/models/{name}"


def infer_path(name: str) -> str:
    return f"{model_path(name)}/infer"


SERVER_NAME = "podium"
SERVER_VERSION = __version__
