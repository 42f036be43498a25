"""How a server of podium checks the run's token in a request's ``Authorization`` header.

Owns :func:`check_authorization`: a bearer token, or (where the route takes it) HTTP Basic with the
token as the password (any user name: what a client makes of a base URL
``http://podium:<token>@host:port``). Tokens are compared in constant time
(:func:`~podium.rendezvous.token.tokens_equal`); an answer never repeats what was sent. The
teacher's endpoint (:mod:`podium.teacher.endpoint.middleware`) and ``podium front``
(:mod:`podium.front.app`) both check with it.
"""

from __future__ import annotations

from aiohttp import BasicAuth

from podium.rendezvous.token import tokens_equal
from podium.web.errors import RequestError


def check_authorization(header: str, token: str, *, basic: bool) -> None:
    """A :class:`RequestError` (401) unless ``header`` carries ``token`` (as Basic's password too
    where ``basic``)."""
    if not header:
        # the callers who meet this are other frameworks' clients that send no token: say where it is
        raise RequestError(401, "missing Authorization: Bearer <token> header (the token is the run's: "
                                "<run_dir>/auth_token; an OpenAI client's api_key"
                                f"{'; or a base URL http://podium:<token>@host:port' if basic else ''})",
                           {"WWW-Authenticate": "Bearer"})
    scheme, _, given = header.partition(" ")
    if basic and scheme.lower() == "basic":
        try:
            password = BasicAuth.decode(header).password
        except ValueError:
            raise RequestError(401, "malformed Basic credentials (send http://podium:<token>@host:port)",
                               {"WWW-Authenticate": "Bearer"}) from None
        if not tokens_equal(password, token):
            raise RequestError(401, "invalid token (the Basic password)", {"WWW-Authenticate": "Bearer"})
        return
    if scheme.lower() != "bearer" or not tokens_equal(given.strip(), token):
        raise RequestError(401, "invalid bearer token", {"WWW-Authenticate": 'Bearer error="invalid_token"'})
