"""The endpoint's proof of who it is: ``GET /v2/podium/proof?nonce=<hex>``, answered without the token.

A client must not send the run's token to whatever listens at an address a record names (the
teacher there may be dead and the port taken by someone else). So podium's client first sends a
fresh nonce on each new connection, and this answers ``{"generation": "J:R", "teacher_key": ...,
"proof": hex HMAC-SHA256(token, "podium-proof|nonce|generation|teacher_key")}``
(:func:`podium.rendezvous.token.server_proof`); the client checks it against its record before it
sends the token on that connection. The answer reveals nothing a stranger could use: without the
token no one can compute it, and a nonce is never reused by a client.

It is a middleware outside the others (see :func:`install`): the auth middleware must not ask this
route for the token it is proving, and nothing else is done for it.
"""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from podium.protocol.names import PROOF, PROOF_NONCE
from podium.rendezvous.token import server_proof
from podium.teacher.endpoint.config import EndpointConfig
from podium.web.errors import json_error

NONCE = re.compile(r"[0-9a-fA-F]{32,128}")  # 16..64 random bytes, hex: nothing else is signed


def proof_answer(config: EndpointConfig, nonce: str) -> dict[str, str | None]:
    """This endpoint's answer to ``nonce`` (its generation, its teacher key, the HMAC over them)."""
    generation = str(config.generation) if config.generation is not None else None
    return {"generation": generation, "teacher_key": config.teacher_key,
            "proof": server_proof(config.token, nonce, generation or "", config.teacher_key)}


def proof_middleware(config: EndpointConfig) -> Middleware:
    """Answers :data:`~podium.protocol.names.PROOF`; every other request goes on."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != PROOF:
            return await handler(request)
        if request.method != "GET":
            return json_error(405, f"method {request.method} not allowed on {PROOF}")
        nonce = request.query.get(PROOF_NONCE, "")
        if not NONCE.fullmatch(nonce):
            return json_error(400, f"{PROOF} needs ?{PROOF_NONCE}=<32 to 128 hex digits>")
        return web.json_response(proof_answer(config, nonce))

    return middleware


def install(app: web.Application, config: EndpointConfig) -> None:
    """Serve the proof route in ``app`` (before its middlewares run: it needs no token)."""
    app.middlewares.insert(0, proof_middleware(config))
