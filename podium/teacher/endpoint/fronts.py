"""The scoring fronts on every teacher's endpoint: vLLM's OpenAI-compatible ``POST /v1/completions``
and ``GET /v1/models``, vLLM's token-in ``POST /inference/v1/generate``, SGLang's ``POST /generate``
and the open ``GET /health`` (what verl, TRL, prime-rl, slime and miles send their teachers).

Each is the Open Inference Protocol's route in another dress: the same token auth (an OpenAI
client's ``api_key`` is the run's token, sent as ``Authorization: Bearer``), admission and body
bounds (:meth:`EndpointServer.admit`), cost bounds (:func:`~podium.teacher.endpoint.cost.check_cost`),
batching with every other caller's rows and the same group (:meth:`EndpointServer.score`). The
request is parsed and checked (:mod:`podium.protocol.openai_scoring`,
:mod:`podium.protocol.sglang_scoring`, through :mod:`podium.protocol.scoring`) and its JSON answer
built on the endpoint's codec threads, never on the event loop. A text prompt is tokenized by the
checkpoint's tokenizer, loaded once on first use; without one, a text is a 400 saying to send ids.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import numpy as np
from aiohttp import web

from podium.protocol import oip
from podium.protocol.batch import Batch, BatchError
from podium.protocol.names import (
    CANDIDATE_LOGPROBS,
    OPENAI_COMPLETIONS,
    OPENAI_MODELS,
    PLAIN_HEALTH,
    SGLANG_GENERATE,
    TOKEN_PATH,
    TOP_K,
    VLLM_TOKEN_GENERATE,
)
from podium.protocol.openai_scoring import CompletionForm, completion_response, models_response, parse_completion
from podium.protocol.query import Query
from podium.protocol.scoring import ScoringCall, TokenNames, row_answers
from podium.protocol.sglang_scoring import GenerateForm, generate_response, parse_generate
from podium.protocol.tokenizer import load_tokenizer
from podium.protocol.vllm_generate import parse_token_generate, token_generate_response
from podium.teacher.endpoint.batching import RowBlocks
from podium.teacher.endpoint.body import RawRequest
from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.endpoint.cost import check_cost
from podium.teacher.endpoint.middleware import FRONT_ROUTES, REQUEST_ID, TOKEN_MATCH
from podium.teacher.seam import GroupFacts
from podium.web.errors import RequestError

logger = logging.getLogger(__name__)


Handler = Callable[[web.Request, RawRequest], Awaitable[web.StreamResponse]]  # a route's work once admitted
RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ScoringServer(Protocol):
    """What the fronts use of their :class:`~podium.teacher.endpoint.server.EndpointServer`."""

    config: EndpointConfig
    facts: GroupFacts
    vocab_size: int

    @property
    def codec(self) -> concurrent.futures.Executor: ...

    @property
    def ready(self) -> bool: ...

    def not_ready(self) -> RequestError: ...

    async def admit(self, request: web.Request, handle: Handler) -> web.StreamResponse: ...

    async def score(self, batch: Batch, query: Query, request: web.Request) -> dict[str, RowBlocks]: ...

class ScoringFronts:
    """The fronts' routes on one endpoint (see the module doc)."""

    def __init__(self, server: ScoringServer) -> None:
        self.server = server
        self._names: TokenNames | None = None
        self._lock = threading.Lock()

    def install(self, app: web.Application) -> None:
        """The routes, each also under a token URL (``TOKEN_PATH/{token}``: the token in the path, for
        clients that send no Authorization header; the auth middleware checks it, and takes HTTP
        Basic with the token as the password on these routes)."""
        routes = ((OPENAI_COMPLETIONS, "POST", self._scoring_route(self._parse_completion, self._shape_completion)),
                  (SGLANG_GENERATE, "POST", self._scoring_route(self._parse_generate, self._shape_generate)),
                  (VLLM_TOKEN_GENERATE, "POST", self._scoring_route(self._parse_token_generate,
                                                                    self._shape_token_generate)),
                  (OPENAI_MODELS, "GET", self._models), (PLAIN_HEALTH, "GET", self._health))
        assert {path for path, _, _ in routes} == set(FRONT_ROUTES), "middleware.FRONT_ROUTES names these routes"
        for path, method, handler in routes:
            for prefix in ("", f"{TOKEN_PATH}/{{{TOKEN_MATCH}}}"):
                app.router.add_route(method, prefix + path, handler)

    # ------------------------------------------------------------------ who the teacher is

    @property
    def model_names(self) -> list[str]:
        """What a request's ``model`` may say: the served name, aliases, teacher key, checkpoint path."""
        config, path = self.server.config, self.server.facts.checkpoint_path
        names = [config.served_name, *config.aliases, config.teacher_key, path or ""]
        return list(dict.fromkeys(name for name in names if name))

    def token_names(self) -> TokenNames:
        """The checkpoint's tokenizer as token names (loaded once, on a codec thread)."""
        with self._lock:
            if self._names is None:
                path = self.server.facts.checkpoint_path
                tokenizer = None
                if path:
                    try:
                        tokenizer = load_tokenizer(path)
                    except Exception as exc:  # a broken tokenizer: ids still work
                        logger.warning("teacher %r: tokenizer of %s not loaded (%s: %s); text prompts refused",
                                       self.server.config.served_name, path, type(exc).__name__, exc)
                self._names = TokenNames(tokenizer)
            return self._names

    # ------------------------------------------------------------------ routes

    async def _health(self, request: web.Request) -> web.Response:
        """vLLM's and SGLang's ``GET /health``, open as theirs are (TRL polls it without a token until
        its teacher answers): 200 while the teacher serves, else the 503 (``Retry-After``) every
        route answers then. It says no more than ``/v2/health/live`` does to anyone who asks."""
        if not self.server.ready:
            raise self.server.not_ready()
        return web.Response(body=b"", status=200)

    async def _models(self, request: web.Request) -> web.Response:
        facts = self.server.facts
        body = models_response(self.model_names, root=facts.checkpoint_path, max_model_len=facts.max_sequence_length,
                               vocab_size=facts.vocab_size, created=int(time.time()))
        return web.Response(body=body, content_type=oip.JSON_CONTENT_TYPE)

    def _scoring_route(self, parse: Callable[[RawRequest], tuple[Any, Batch, Query]],
                       shape: Callable[[Any, Mapping[str, np.ndarray], str], bytes]) -> RouteHandler:
        """A computing route: admitted as the OIP route is, the request parsed and checked
        (``parse``) and its answer shaped (``shape(form, outputs, request_id)``) on the codec threads,
        the teacher's group between; a refusal is answered by the error middleware, in OpenAI's
        error shape on these routes."""
        async def admitted(request: web.Request, raw: RawRequest) -> web.StreamResponse:
            loop = asyncio.get_running_loop()
            form, batch, query = await loop.run_in_executor(self.server.codec, parse, raw)
            outputs = await self._score(batch, query, request)
            body = await loop.run_in_executor(self.server.codec, shape, form, outputs, request[REQUEST_ID])
            return web.Response(body=body, content_type=oip.JSON_CONTENT_TYPE)

        async def route(request: web.Request) -> web.StreamResponse:
            return await self.server.admit(request, admitted)

        return route

    async def _score(self, batch: Batch, query: Query, request: web.Request) -> dict[str, np.ndarray]:
        result = await self.server.score(batch, query, request)
        missing = [name for name in query.outputs if name not in result]
        if missing:
            raise RequestError(500, f"teacher {self.server.config.served_name!r} returned no {missing}")
        return {name: _whole(blocks) for name, blocks in result.items()}

    # ------------------------------------------------------------------ on codec threads

    def _parse_completion(self, raw: RawRequest) -> tuple[CompletionForm, Batch, Query]:
        names = self.token_names()
        tokenizer = names.tokenizer
        tokenize = None if tokenizer is None else (
            lambda text, special: list(tokenizer(text, add_special_tokens=special)["input_ids"]))
        form = self._parsed(raw, lambda body: parse_completion(body, tokenize))
        self._check_model_field(form.model)
        return (form, *self._checked(form.call))

    def _parse_token_generate(self, raw: RawRequest) -> tuple[CompletionForm, Batch, Query]:
        form = self._parsed(raw, parse_token_generate)
        self._check_model_field(form.model)
        return (form, *self._checked(form.call))

    def _parse_generate(self, raw: RawRequest) -> tuple[GenerateForm, Batch, Query]:
        tokenizer = self.token_names().tokenizer
        tokenize = None if tokenizer is None else (lambda text: list(tokenizer(text)["input_ids"]))
        form = self._parsed(raw, lambda body: parse_generate(body, tokenize))
        return (form, *self._checked(form.call))

    def _shape_completion(self, form: CompletionForm, outputs: Mapping[str, np.ndarray], request_id: str) -> bytes:
        return completion_response(form, row_answers(form.call, outputs), self.token_names(),
                                   model=form.model or self.server.config.served_name, request_id=request_id,
                                   created=int(time.time()))

    def _shape_token_generate(self, form: CompletionForm, outputs: Mapping[str, np.ndarray], request_id: str) -> bytes:
        return token_generate_response(form, row_answers(form.call, outputs), self.token_names(),
                                       request_id=request_id)

    def _shape_generate(self, form: GenerateForm, outputs: Mapping[str, np.ndarray], request_id: str) -> bytes:
        return generate_response(form, row_answers(form.call, outputs), self.token_names(), request_id=request_id)

    def _parsed(self, raw: RawRequest, parse: Callable[[Any], Any]) -> Any:
        if raw.json is None:
            raise RequestError(400, "send a JSON body (the binary tensor extension is the OIP route's)")
        try:
            body = json.loads(raw.json)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RequestError(400, f"body is not JSON: {exc}") from None
        try:
            return parse(body)
        except BatchError as exc:
            raise RequestError(400, str(exc), param=exc.param) from None

    def _check_model_field(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise RequestError(404, f"field 'model': {model!r} is not served here; this teacher answers to "
                                    f"{self.model_names}", param="model")

    def _checked(self, call: ScoringCall) -> tuple[Batch, Query]:
        """The call's batch and query (the one validation), refused over the endpoint's cost bounds."""
        server = self.server
        if call.position_candidates is not None:  # vLLM bounds the widest list by --max-logprobs; podium by max_top_k
            width, most = int(call.position_candidates.shape[-1]), server.config.max_top_k(server.vocab_size)
            if width > most:
                raise RequestError(413, f"field {call.candidates_field!r}: a row of {width} candidate ids is over this "
                                        f"teacher's limit of {most} (podium.server.max_top_k)",
                                   param=call.candidates_field)
        try:
            batch, query = call.ask(vocab_size=server.vocab_size, max_sequence_length=server.facts.max_sequence_length)
        except BatchError as exc:
            raise RequestError(400, str(exc), param=exc.param) from None
        try:
            binary = dict.fromkeys(query.outputs, False)  # JSON text, about JSON_BYTES_PER_VALUE a value
            if call.position_candidates is not None:  # vLLM's teacher scoring: a .npy float32 matrix, base64
                binary[CANDIDATE_LOGPROBS] = True
            check_cost(server.config, batch, query, binary, server.vocab_size)
        except RequestError as exc:
            field = call.top_k_field if exc.param == TOP_K else call.ids_field
            raise RequestError(exc.status, f"field {field!r}: {exc.message}", exc.headers, param=field) from None
        return batch, query


def _whole(blocks: RowBlocks) -> np.ndarray:
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
