"""A scripted OpenAI-compatible server over real HTTP (a few lines of http.server), for the code that
asks such an endpoint as a client: the LLM judge, the simulated user. Each POST gets the next reply
of the script (an int: that HTTP status with an error body), or, when the script is a function,
its reply to the request's body; every request body is kept."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedServer:
    def __init__(self, replies) -> None:
        self.replies, self.bodies = replies if callable(replies) else list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                reply = outer.replies(body) if callable(outer.replies) else outer.replies.pop(0)
                status, payload = (reply, {"error": "busy"}) if isinstance(reply, int) else \
                    (200, {"choices": [{"message": {"content": reply}}]})
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def prompts(self) -> list[str]:
        """The first message of each request."""
        return [body["messages"][0]["content"] for body in self.bodies]

    def close(self) -> None:
        self.server.shutdown()
