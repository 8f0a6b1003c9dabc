"""An OpenAI-compatible endpoint per rollout, so unmodified agent code can be trained.

    base_url = server.open(interceptor)   ->  http://127.0.0.1:PORT/rollouts/<token>/v1
    POST <base_url>/chat/completions       ->  interceptor.chat(messages, tools): recorded in tokens
    POST <base_url>/completions            ->  interceptor.complete(prompt): raw text, recorded in tokens
    POST <base_url>/responses              ->  the Responses API, onto interceptor.chat
    POST <base_url minus /v1>/v1/messages  ->  the Anthropic Messages API, onto interceptor.chat
    server.close(base_url)                 ->  the URL stops answering (404)
    server.listen_unix(path)               ->  the same routes on a Unix socket too (containers with
                                              no network reach their rollout through it)

The agent sees the APIs as it would from a provider (`producers/agent_api/`: tools and tool calls,
tool results, text parts, `stream: true`, usage, finish and stop reasons); sampling
settings come from the task (whatever the agent asks for temperature or max_tokens is ignored),
and every call lands in that rollout's interceptor. Loopback only.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import ThreadingUnixStreamServer

from rollwire.producers.agent_api.anthropic import MESSAGES
from rollwire.producers.agent_api.common import ApiError, Issued, read_reply
from rollwire.producers.agent_api.openai_chat import CHAT_COMPLETIONS, COMPLETIONS
from rollwire.producers.agent_api.responses import RESPONSES
from rollwire.producers.interception import Interceptor, RolloutTooLong

ROUTES = {("v1", "chat", "completions"): CHAT_COMPLETIONS, ("v1", "completions"): COMPLETIONS,
          ("v1", "responses"): RESPONSES, ("v1", "messages"): MESSAGES}
"""What each rollout URL's paths serve (`producers/agent_api/`)."""
MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body an agent may send (a conversation of a few million characters); larger get 413."""
READ_TIMEOUT_S = 60.0
"""A client that sends nothing for this long is disconnected: a stalled agent holds no thread for good."""


class InterceptionServer:
    def __init__(self) -> None:
        self._rollouts: dict[str, Interceptor] = {}
        self._issued: dict[str, Issued] = {}
        """Per rollout, the tool call ids and response ids it returned, with what was sampled (`agent_api`)."""
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._unix: list[ThreadingUnixStreamServer] = []
        threading.Thread(target=self._httpd.serve_forever, name="interception", daemon=True).start()

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def open(self, interceptor: Interceptor) -> str:
        token = secrets.token_hex(8)
        with self._lock:
            self._rollouts[token] = interceptor
            self._issued[token] = Issued()
        return f"http://127.0.0.1:{self.port}/rollouts/{token}/v1"

    def close(self, base_url: str) -> None:
        token = base_url.rstrip("/").split("/")[-2]
        with self._lock:
            self._rollouts.pop(token, None)
            self._issued.pop(token, None)

    def listen_unix(self, path: Path) -> None:
        """Serves every rollout's routes on the Unix socket `path` too (created here, readable and
        writable by anyone who can reach its folder: a container's unprivileged user)."""
        unix = ThreadingUnixStreamServer(str(path), self._handler())
        unix.daemon_threads = True
        path.chmod(0o666)
        self._unix.append(unix)
        threading.Thread(target=unix.serve_forever, name="interception-unix", daemon=True).start()

    @staticmethod
    def route(base_url: str) -> str:
        """The path part of a rollout's URL (`/rollouts/<token>/v1`): the same on every listener."""
        return "/" + base_url.split("/", 3)[3]

    def shutdown(self) -> None:
        for server in [self._httpd, *self._unix]:
            server.shutdown()
            server.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = READ_TIMEOUT_S

            def address_string(self) -> str:  # a Unix socket's peer has no address
                return str(self.client_address or "unix")

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                parts = self.path.strip("/").split("/")
                with server._lock:
                    interceptor = server._rollouts.get(parts[1]) if len(parts) >= 2 else None
                    issued = server._issued.get(parts[1]) if len(parts) >= 2 else None
                api = ROUTES.get(tuple(parts[2:]))
                if interceptor is None or issued is None or parts[0] != "rollouts" or api is None:
                    return self._answer(404, {"error": {"message": f"no such rollout endpoint: {self.path} (served: "
                                                        f"{', '.join('/' + '/'.join(r) for r in ROUTES)})"}})
                kind = api.name
                try:
                    length = int(self.headers.get("Content-Length", "0"))
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY_BYTES:
                    self.close_connection = True  # the unread body must not be taken for the next request
                    return self._answer(413 if length > MAX_BODY_BYTES else 400, {"error": {"message": (
                        f"the body is over {MAX_BODY_BYTES} bytes" if length > MAX_BODY_BYTES
                        else "a request needs a valid Content-Length")}})
                try:
                    data = self.rfile.read(length)
                except OSError:  # the client stalled past READ_TIMEOUT_S, or went away: nobody to answer
                    self.close_connection = True
                    return None
                try:
                    body = json.loads(data)
                except ValueError as exc:  # UnicodeDecodeError included
                    return self._answer(400, {"error": {"message": f"not a {kind} request: the body is not JSON: {exc}"}})
                try:
                    request = api.parse(body, issued)
                except ApiError as exc:
                    return self._answer(exc.status, api.error(f"not a {kind} request: {exc}"))
                try:
                    if request.raw_prompt is not None:
                        text = interceptor.complete(request.raw_prompt)
                    elif request.tools:  # rendered into the prompt by the model's chat template
                        text = interceptor.chat(request.messages, tools=request.tools)
                    else:
                        text = interceptor.chat(request.messages)
                except RolloutTooLong as exc:  # the agent's conversation outgrew the rollout's limit
                    return self._answer(400, api.error(str(exc), "context_length_exceeded"))
                except Exception as exc:  # the fleet failed: tell the agent, as an API would
                    return self._answer(502, api.error(f"inference failed: {exc}"))
                reply = read_reply(text, interceptor.finish_reason, interceptor.usage, issued, api.call_prefix,
                                   tools=request.read_tool_calls and request.raw_prompt is None,
                                   tool_call_format=interceptor.tool_call_format if request.raw_prompt is None else "hermes")
                response = api.respond(reply, request, issued)
                if request.stream:
                    return self._stream(api.events(response, request))
                self._answer(200, response)

            def _stream(self, events) -> None:
                """Server-sent events, one per `(event name or None, payload)`, then OpenAI's `[DONE]`;
                the connection's end ends the stream."""
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for name, payload in events:
                        line = f"event: {name}\n" if name else ""
                        self.wfile.write(f"{line}data: {json.dumps(payload)}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:  # the agent went away mid-stream: its call is recorded all the same
                    pass

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
