"""What a request will cost, refused before anything is computed.

A teacher's memory grows with the positions it answers times what it answers at each (``top_k``
values and ids, candidate logprobs, a full-vocabulary payload's hidden size or vocabulary), on the GPU
while computing and in host memory while the
answer is encoded and sent. :func:`check_cost` refuses (413, naming the ``podium.server`` key that
bounds it) a request whose ``top_k`` is over ``max_top_k``, whose positions (rows × width) are
over ``max_request_tokens``, or whose answer, estimated from its shape, outputs and wire dtypes,
would be over ``max_response_mb``. The bounds are the recipe's; a refusal names how to raise it.
"""

from __future__ import annotations

from podium.protocol.batch import Batch
from podium.protocol.names import TOP_K
from podium.protocol.query import Query
from podium.teacher.endpoint.config import MIB, EndpointConfig
from podium.web.errors import RequestError


def check_cost(config: EndpointConfig, batch: Batch, query: Query, binary: dict[str, bool], vocab_size: int, *,
               hidden_size: int | None = None) -> None:
    """Refuse (413) a request over one of the cost bounds of ``config.server`` (``hidden_size``: the
    width of a ``hidden_states`` answer)."""
    settings = config.server
    top_k_limit = config.max_top_k(vocab_size)
    if query.top_k is not None and query.top_k > top_k_limit:
        raise RequestError(413, f"parameter {TOP_K!r} = {query.top_k} is over this teacher's limit of "
                                f"{top_k_limit} (podium.server.max_top_k)", param=TOP_K)
    rows, width, tokens, most = batch.rows, batch.width, batch.rows * batch.width, settings.max_request_tokens
    if tokens > most:
        raise RequestError(413, f"request of {rows} rows × {width} positions = {tokens} tokens is over the limit of "
                                f"{most} (podium.server.max_request_tokens; split it into smaller requests)")
    size = query.answer_bytes(batch.rows, batch.width, batch.candidates, binary, hidden_size=hidden_size,
                              vocab_size=vocab_size)
    mb = settings.max_response_mb
    if size > mb * MIB:
        fewer = "a smaller payload_datatype" if query.payload else "a smaller top_k"
        raise RequestError(413, f"the answer would take about {size / MIB:.0f} MiB, over the limit of {mb}"
                                f" MiB (podium.server.max_response_mb; ask for fewer rows, {fewer}, binary)")
