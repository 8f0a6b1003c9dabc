"""An OpenAI-compatible endpoint per rollout, so unmodified agent code can be trained.

    base_url = server.open(interceptor)   ->  http://127.0.0.1:PORT/rollouts/<token>/v1
    POST <base_url>/chat/completions       ->  interceptor.chat(messages): recorded in tokens
    POST <base_url>/completions            ->  interceptor.complete(prompt): raw text, recorded in tokens
    server.close(base_url)                 ->  the URL stops answering (404)

The agent sees a normal chat-completions API; sampling settings come from the task (whatever
the agent asks for temperature or max_tokens is ignored), and every call lands in that
rollout's interceptor. Loopback only.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rollwire.producers.interception import Interceptor

CHAT = ["v1", "chat", "completions"]
COMPLETIONS = ["v1", "completions"]


class InterceptionServer:
    def __init__(self) -> None:
        self._rollouts: dict[str, Interceptor] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="interception", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def open(self, interceptor: Interceptor) -> str:
        token = secrets.token_hex(8)
        with self._lock:
            self._rollouts[token] = interceptor
        return f"http://127.0.0.1:{self.port}/rollouts/{token}/v1"

    def close(self, base_url: str) -> None:
        with self._lock:
            self._rollouts.pop(base_url.rstrip("/").split("/")[-2], None)

    def shutdown(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                parts = self.path.strip("/").split("/")
                with server._lock:
                    interceptor = server._rollouts.get(parts[1]) if len(parts) >= 2 else None
                route = parts[2:]
                if interceptor is None or parts[0] != "rollouts" or route not in (CHAT, COMPLETIONS):
                    return self._answer(404, {"error": {"message": f"no such rollout endpoint: {self.path}"}})
                chat = route == CHAT
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    text = interceptor.chat(body["messages"]) if chat else interceptor.complete(body["prompt"])
                except (ValueError, KeyError, TypeError) as exc:
                    kind = "chat completions" if chat else "completions"
                    return self._answer(400, {"error": {"message": f"not a {kind} request: {exc}"}})
                except Exception as exc:  # the fleet failed: tell the agent, as an API would
                    return self._answer(502, {"error": {"message": f"inference failed: {exc}"}})
                finish = interceptor.finish_reason or "stop"
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                          if chat else {"index": 0, "text": text, "finish_reason": finish})
                last = interceptor.calls[-1]
                self._answer(200, {
                    "id": f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(6)}",
                    "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                    "model": body.get("model", "policy"), "choices": [choice],
                    "usage": {"prompt_tokens": len(last.prompt_token_ids),
                              "completion_tokens": len(last.completion_token_ids),
                              "total_tokens": len(last.prompt_token_ids) + len(last.completion_token_ids)}})

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        return Handler
