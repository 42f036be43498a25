"""The bytes an endpoint sends: ``podium_response_bytes_total`` and its rate over the last minute
(``podium_response_bytes_per_second_1m``) equal the body bytes its clients received, and ``podium
status`` shows the rate per teacher, so a user sees when the wire, not the model, is the limit.

A real endpoint in front of the numpy stand-in group (answers of known size: JSON and binary, top-k
ones, one large enough to be streamed, a refusal); and the middleware alone in front of handlers answering a whole body
(``web.Response``) and streams written in chunks (``web.StreamResponse`` with a Content-Length) by
the handler or after it, read by aiohttp's client.

What ``/metrics`` shows of its callers: no caller's name (``X-Podium-Caller``), and it needs the
token where the site says so (``podium.server.metrics_need_token``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from harness.endpoint import AUTH, post, start_server
from harness.fake_group import FakeGroup
from harness.infer_requests import binary_body, infer_body
from harness.lifecycle import Teacher
from harness.run import TeacherDef, make_run
from rich.console import Console

from podium.cli_render import bytes_per_s, status_table
from podium.launcher.login.run_dir import write_spec
from podium.launcher.login.status import status
from podium.protocol import oip
from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.endpoint.metrics import WINDOW_S, EndpointMetrics, summary, totals
from podium.teacher.endpoint.middleware import error_middleware
from podium.teacher.endpoint.stream import STREAM_FROM

MATH = TeacherDef("feedc0ffee0777", "math", ("math",))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Teacher]:
    layout, token = make_run(tmp_path, [MATH])
    teacher = Teacher(FakeGroup(vocab_size=128, max_sequence_length=64), layout, MATH, token).start()
    yield teacher
    teacher.stop()


def _answers(teacher: Teacher) -> int:
    """Sends answers of several kinds and sizes (one streamed); the body bytes the client received."""
    url, headers = f"{teacher.url}/v2/models/math/infer", {"Authorization": f"Bearer {teacher.token}"}
    rng = np.random.default_rng(3)
    received = 0
    with requests.Session() as session:
        for rows, width in ((1, 4), (3, 17), (8, 64), (16, 64)):
            ids = rng.integers(0, 128, (rows, width))
            lengths = rng.integers(1, width + 1, rows)
            bodies = [
                (infer_body(ids, lengths), {}),
                (infer_body(ids, lengths, parameters={"top_k": 5}), {}),
                (binary_body(ids, lengths)[0], {"Inference-Header-Content-Length": str(binary_body(ids, lengths)[1])}),
            ]
            for body, extra in bodies:
                resp = session.post(url, data=body, headers={**headers, **extra}, timeout=60)
                assert resp.status_code == 200, resp.text
                assert len(resp.content) > 0
                received += len(resp.content)
        # a top-k answer over STREAM_FROM bytes, which a sender thread streams after the middleware
        ids = rng.integers(0, 128, (64, 64))
        chunks, header_len = oip.encode_request([("input_ids", ids), ("input_lengths", np.full(64, 64))],
                                                outputs=("topk_logprobs", "topk_indices"), parameters={"top_k": 64})
        assert teacher.server is not None
        streamed = teacher.server.server.sender.sent
        resp = session.post(url, data=b"".join(chunks), timeout=60,
                            headers={**headers, "Content-Type": oip.BINARY_CONTENT_TYPE,
                                     oip.HEADER_LENGTH: str(header_len)})
        assert resp.status_code == 200 and len(resp.content) >= STREAM_FROM, resp.text[:300]
        assert teacher.server.server.sender.sent == streamed + 1
        received += len(resp.content)
        refused = session.post(url, data=infer_body([[1, 2]], [3]), headers=headers, timeout=60)  # length > width
        assert refused.status_code == 400
        received += len(refused.content)
    return received


def test_the_bytes_counted_are_the_bytes_the_clients_received_and_status_shows_their_rate(
        served: Teacher, tmp_path: Path) -> None:
    received = _answers(served)
    assert received > WINDOW_S * 1e3  # the table shows kB/s
    values = totals(requests.get(f"{served.url}/metrics", timeout=60).text)
    assert values["podium_response_bytes_total"] == received
    assert values["podium_response_bytes_per_second_1m"] == pytest.approx(received / WINDOW_S)

    # `podium status` (its view of the run dir with the scheduler left out; its table; --json)
    write_spec(served.layout.run_dir, served.spec())
    (row,) = status(served.layout.run_dir, states_of=lambda records: {})
    assert row.load is not None and row.load["bytes_out_per_s_1m"] == pytest.approx(received / WINDOW_S)
    console = Console(width=300, record=True)
    console.print(status_table([row]))
    text = console.export_text()
    assert "out/s 1m" in text
    line = next(line for line in text.splitlines() if "math" in line)
    assert f"{received / WINDOW_S / 1e3:.1f} kB" in line, line
    assert [bytes_per_s(v) for v in (2.44e9, 310.54e3, 1e6, 12.4, 0)] == ["2.4 GB", "310.5 kB", "1.0 MB", "12 B", "0 B"]
    assert row.to_dict()["load"]["bytes_out_per_s_1m"] == row.load["bytes_out_per_s_1m"]  # `status --json`


def test_the_middleware_counts_a_whole_body_and_a_stream_as_their_clients_read_them() -> None:
    whole = bytes(range(256)) * 1000
    chunks = [b"a" * 70_000, b"b" * 3, bytes(1 << 20)]

    async def whole_answer(request: web.Request) -> web.StreamResponse:
        return web.Response(body=whole)

    async def streamed_answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = sum(map(len, chunks))
        await response.prepare(request)
        for chunk in chunks:
            await response.write(memoryview(chunk))
        await response.write_eof()
        return response

    class LateStream(web.StreamResponse):
        """Written after the middleware, as podium's streamed answers are (only its size is known)."""

        def __init__(self) -> None:
            super().__init__()
            self.content_length = sum(map(len, chunks))

        async def write_eof(self, data: bytes = b"") -> None:
            if not self._eof_sent:
                for chunk in chunks:
                    await self.write(chunk)
            await super().write_eof()

    async def late_answer(request: web.Request) -> web.StreamResponse:
        return LateStream()

    async def exchange() -> tuple[list[int], str]:
        metrics = EndpointMetrics("t", queue_depth=lambda: 0, queued_rows=lambda: 0)
        server = web.Application(middlewares=[error_middleware(EndpointConfig("t", token="x"), metrics)])
        server.router.add_post("/v2/models/whole/infer", whole_answer)
        server.router.add_post("/v2/models/stream/infer", streamed_answer)
        server.router.add_post("/v2/models/late/infer", late_answer)
        got = []
        async with TestClient(TestServer(server)) as client:
            for name in ("whole", "stream", "late", "whole"):
                resp = await client.post(f"/v2/models/{name}/infer")
                got.append(len(await resp.read()))
        return got, metrics.render().decode()

    got, text = asyncio.run(exchange())
    assert got == [len(whole), sum(map(len, chunks)), sum(map(len, chunks)), len(whole)]
    assert totals(text)["podium_response_bytes_total"] == sum(got)
    assert summary(text)["bytes_out_per_s_1m"] == pytest.approx(sum(got) / WINDOW_S)


def test_metrics_show_no_caller_and_need_the_token_when_the_site_says_so() -> None:
    group = FakeGroup(vocab_size=128)
    server = start_server(group)
    try:
        assert post(server, infer_body([[1, 2]], [2]), {"X-Podium-Caller": "secret-host:4242"}).status_code == 200
        text = requests.get(f"{server.url}/metrics", timeout=10).text
        assert "secret-host" not in text and "podium_requests_total" in text
    finally:
        server.stop()
    server = start_server(group, {"metrics_need_token": True})
    try:
        assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 401
        assert requests.get(f"{server.url}/metrics", headers=AUTH, timeout=10).status_code == 200
        assert requests.get(f"{server.url}/v2/health/live", timeout=10).status_code == 200
    finally:
        server.stop()
