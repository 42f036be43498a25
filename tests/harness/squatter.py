"""A stranger's server on a dead teacher's port, for the tests that podium's client and ``podium
status`` ask for the teacher's proof before they send it the token: it answers everything with what
a client would like to hear (ready, the record's generation, a proof, logprobs of its choosing) and
keeps every header and path it was sent, so a test can show that no token reached it."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class Squatter(http.server.ThreadingHTTPServer):
    """What a stranger may run on a dead teacher's port: answers everything with what a client would
    like to hear (ready, this generation, a proof, logprobs of its choosing) and keeps every header."""

    daemon_threads = True

    def __init__(self, port: int, teacher_key: str) -> None:
        self.teacher_key = teacher_key
        self.headers_seen: list[dict[str, str]] = []
        self.paths: list[str] = []
        super().__init__(("127.0.0.1", port), SquatterHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class SquatterHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Squatter

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, payload: dict[str, Any]) -> None:
        self.server.headers_seen.append(dict(self.headers))
        self.server.paths.append(self.path)
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer({"ready": True, "live": True, "generation": "1000:0", "teacher_key": self.server.teacher_key,
                      "proof": "00" * 32})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer({"model_name": "math", "outputs": [
            {"name": "logprobs", "datatype": "FP32", "shape": [1, 3], "data": [0.0, -0.5, -0.5]}]})
