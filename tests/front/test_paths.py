"""The front's pure parts: what a path names, the names it gives an alias, the answer a call's end becomes."""

from __future__ import annotations

import pytest

from podium.client.errors import TeacherRequestError, TeacherStoppedError, TeacherUnavailableError
from podium.front.app import refusal
from podium.front.paths import Target, env_name, parse_path, shown
from podium.web.errors import RequestError


@pytest.mark.parametrize(("path", "target"), [
    ("/health", Target(None, "/health")),
    ("/v1/completions", Target(None, "/v1/completions")),
    ("/v1/models", Target(None, "/v1/models")),
    ("/token/s3cret/v1/completions", Target(None, "/v1/completions", "s3cret")),
    ("/math/health", Target("math", "/health")),
    ("/math/v1/completions", Target("math", "/v1/completions")),
    ("/math/generate", Target("math", "/generate")),
    ("/math/inference/v1/generate", Target("math", "/inference/v1/generate")),
    ("/math/v2/models/math/infer", Target("math", "/v2/models/math/infer")),
    ("/math/token/s3cret/generate", Target("math", "/generate", "s3cret")),
    ("/token/s3cret/math/v2/models/math/infer", Target("math", "/v2/models/math/infer", "s3cret")),
])
def test_a_path_names_its_alias_route_and_token(path: str, target: Target) -> None:
    assert parse_path(path) == target


def test_a_shown_path_never_holds_the_token() -> None:
    assert shown("/math/token/s3cret/generate") == "/math/token/<token>/generate"
    assert shown("/token/s3cret/math/v1/models") == "/token/<token>/math/v1/models"


def test_each_alias_has_its_environment_variable() -> None:
    assert env_name("math") == "PODIUM_FRONT_URL_MATH"
    assert env_name("code-agent.v2") == "PODIUM_FRONT_URL_CODE_AGENT_V2"


def test_a_call_s_end_becomes_its_answer() -> None:
    stopped = refusal(TeacherStoppedError("'math' (k)", "7:0", "stopped by podium down", 1.7e9), None)
    assert isinstance(stopped, RequestError) and stopped.status == 410 and "'math'" in stopped.message
    waited = refusal(TeacherUnavailableError("'math' (k)", "7:0", 30.0, ["generation 7:0 preempted"]), None)
    assert isinstance(waited, RequestError) and waited.status == 503 and waited.headers["Retry-After"]
    refused = refusal(TeacherRequestError("'math' (k)", "7:0", 400, "field 'prompt': empty"), None)
    assert isinstance(refused, RequestError) and refused.status == 400
