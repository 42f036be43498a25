"""What a request to ``podium front`` asks for, read from its path alone (pure), and the names the
front gives each alias (base URL, environment variable).

=====================================================  =========================================
path                                                   means
=====================================================  =========================================
``/health``                                            the run: 200 while every alias has a ready
                                                       replica (open, no token)
``/v1/models``                                         the run's aliases, as OpenAI models
``/v1/completions``                                    routed by the body's ``model`` (an alias)
``/<alias>/health``                                    the alias: 200 while it has a ready replica
``/<alias>/v1/models``                                 the alias, as the one model
``/<alias><route>``                                    ``<route>`` of the alias's teacher (every
                                                       route a teacher serves: ``/v1/completions``,
                                                       ``/inference/v1/generate``, ``/generate``,
                                                       ``/v2/...``)
``/<alias>/token/<token><route>``                      the same, the token in the path (clients
``/token/<token>/<alias><route>``                      that send no header); also at the root
=====================================================  =========================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from podium.protocol.names import OPENAI_BASE, PLAIN_HEALTH, SGLANG_GENERATE, TOKEN_PATH, VLLM_TOKEN_GENERATE

ENV_URL = "PODIUM_FRONT_URL"  # the front's URL, exported to the command ``--exec`` runs
ENV_URL_PREFIX = ENV_URL + "_"  # + the alias, upper-cased, non-alphanumerics as "_": its base URL

# a path's first segment that is a route of the root, never an alias
ROOT_SEGMENTS = frozenset(s.strip("/").partition("/")[0] for s in
                          (OPENAI_BASE, PLAIN_HEALTH, SGLANG_GENERATE, VLLM_TOKEN_GENERATE, TOKEN_PATH, "/v2"))


@dataclass(frozen=True)
class Target:
    """What a request's path names: an alias (None: the front's root), the route of the teacher
    under it, and a token the path carries (None: none)."""

    alias: str | None
    route: str
    token: str | None = None


def _take_token(path: str) -> tuple[str | None, str]:
    """(the token of a ``/token/<token>`` prefix, the path after it), or (None, ``path``)."""
    if not path.startswith(TOKEN_PATH + "/"):
        return None, path
    token, _, rest = path[len(TOKEN_PATH) + 1:].partition("/")
    return token, "/" + rest


def parse_path(path: str) -> Target:
    """The :class:`Target` of a request's path (see the module's table)."""
    token, rest = _take_token(path)
    first, _, tail = rest[1:].partition("/")
    if not first or first in ROOT_SEGMENTS:
        return Target(None, rest, token)
    route = "/" + tail
    if token is None:
        token, route = _take_token(route)
    return Target(first, route, token)


def shown(path: str) -> str:
    """``path`` as errors and logs show it: never a token it carries."""
    return re.sub(r"(^|/)token/[^/]*", r"\1token/<token>", path)


def env_name(alias: str) -> str:
    """The environment variable ``--exec`` gives ``alias``'s base URL in."""
    return ENV_URL_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", alias).upper()


def base_url(front_url: str, alias: str) -> str:
    return f"{front_url}/{alias}"
