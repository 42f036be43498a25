"""podium.client: what trainers import to reach podium's teachers.

``podium.connect(path)`` (or :func:`connect` here) reads ``<run_dir>/rendezvous.json`` and returns a
:class:`PodiumClient`:

- ``get_logprobs(alias_or_agent_name, data, *, top_k=None, micro_batch_size=None)``
- ``get_logprobs_by_agent(data, agent_names, ...)``: several teachers at once, rows in order
- ``check_tokenizer(alias, tokenizer)``: vocab size + tokenizer fingerprint
- ``get_topk_logits(alias, data, k)``: NeMo RL's top-k logits; ``get_candidate_logprobs``: logprobs of
  the caller's ids

NeMo RL's facades on a client: ``podium.nemo_rl.RemoteTeacherWorkerGroup.from_client(client, alias)``
(that package imports this one, never the other way round).

What a call asks is a :class:`~podium.protocol.query.Query` (:func:`ask`), checked here by the rule
the teacher applies: ``client.teacher(alias).infer(ids, lengths, ask(outputs=["hidden_states"],
payload_datatype="BF16"))["hidden_states"]`` is a teacher's full-vocabulary payload; the wire
itself is ``podium.protocol``. Every module opens with what it owns.
Importing this package pulls numpy but not torch: podium's base install (no extras: a trainer's
light install) has neither torch nor transformers. Results are torch tensors where torch is
importable (a trainer's), else numpy arrays (``ClientOptions.return_type``).
"""

from podium.client.client import PodiumClient, connect
from podium.client.errors import (
    PodiumClientError,
    ServerProofError,
    TeacherFailedError,
    TeacherRequestError,
    TeacherRequestFailedError,
    TeacherServerError,
    TeacherStoppedError,
    TeacherUnavailableError,
    TokenizerMismatchError,
    TransportError,
)
from podium.client.options import ClientOptions
from podium.client.teacher import TeacherClient
from podium.protocol.batch import BatchError
from podium.protocol.query import ask
from podium.protocol.tokenizer import tokenizer_fingerprint

__all__ = [
    "BatchError",
    "ClientOptions",
    "PodiumClient",
    "PodiumClientError",
    "ServerProofError",
    "TeacherClient",
    "TeacherFailedError",
    "TeacherRequestError",
    "TeacherRequestFailedError",
    "TeacherServerError",
    "TeacherStoppedError",
    "TeacherUnavailableError",
    "TokenizerMismatchError",
    "TransportError",
    "ask",
    "connect",
    "tokenizer_fingerprint",
]
