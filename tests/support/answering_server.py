"""An HTTP server that answers like SGLang's ``/health`` and ``/generate`` but captures nothing.

For tests of the client's start that need a server to answer (its wait for ``/health``, its
probe) and must see what the client sent, without a real SGLang: every prefill is answered at
once with the prompt length the client sent, and no dump ever appears.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class AnsweringServer:
    """``gets``: the paths a GET is answered 200 on (SGLang's /health by default); 404 elsewhere."""

    def __init__(self, gets: tuple[str, ...] = ("/health",)) -> None:
        self.requests: list[tuple[str, str]] = []  # (method, path), in arrival order
        self.generated = threading.Event()  # set by the first /generate
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                owner.requests.append(("GET", self.path))
                self._answer(200, {}) if self.path in gets else self._answer(404, {"error": "not here"})

            def do_POST(self) -> None:
                owner.requests.append(("POST", self.path))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/generate":
                    self._answer(404, {"error": "not here"})
                    return
                owner.generated.set()
                self._answer(
                    200,
                    {
                        "text": "x",
                        "meta_info": {
                            "prompt_tokens": len(body.get("input_ids", [])),
                            "finish_reason": {"type": "length"},
                        },
                    },
                )

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="answering-server", daemon=True)
        self._thread.start()

    def posts(self) -> list[str]:
        return [path for method, path in self.requests if method == "POST"]

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
