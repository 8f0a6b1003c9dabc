"""The one HTTP client rollwire's components use to call JSON services: vLLM's routes, the
per-rollout interception endpoint, OpenAI-compatible endpoints, a teacher.

    client = JsonClient("http://127.0.0.1:8000", timeout_s=30)
    client.request("POST", "/tokenize", {"prompt": "…"})   # decoded JSON (or text), or HttpError
    for line in client.stream_lines("POST", "/inference/v1/generate", body): ...

One pool of kept-alive connections per client, safe to share between threads: an env worker's
rollouts call the same server from dozens of threads at once. It is built on urllib3 rather than
httpx: with 64 threads on one pool, httpx spends about 4 times the CPU per small request
(`python bench/http_client.py`, recorded in bench/RESULTS.md), and an env worker on a small machine
shares its CPUs with the inference server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3

from rollwire.core.errors import RollwireError


class HttpError(RollwireError):
    """A request failed (`status` None: no answer, e.g. refused or timed out) or was answered with
    an HTTP error status; the message has the route and the answer."""

    def __init__(self, message: str, status: int | None = None, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.unreachable = unreachable
        """No server answered: the connection was refused, or cut before an answer (the server
        went away). A timeout is not this: the server may still be working on the request."""


def _unreachable(exc: Exception) -> bool:
    return isinstance(exc, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ProtocolError))


class JsonClient:
    """JSON requests to one base URL."""

    def __init__(self, base_url: str, *, timeout_s: float = 120.0, max_connections: int = 64,
                 headers: Mapping[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._pool = urllib3.PoolManager(maxsize=max_connections, block=False, retries=False)

    def _send(self, method: str, path: str, body: Any, timeout_s: float | None, *, stream: bool):
        data = None if body is None else json.dumps(body).encode()
        timeout = urllib3.Timeout(connect=min(10.0, timeout_s or self.timeout_s), read=timeout_s or self.timeout_s)
        try:
            response = self._pool.request(method, self.base_url + path, body=data, headers=self._headers,
                                          timeout=timeout, preload_content=not stream)
        except urllib3.exceptions.HTTPError as exc:
            raise HttpError(f"{method} {self.base_url}{path} failed: {type(exc).__name__}: {exc}",
                            unreachable=_unreachable(exc)) from exc
        if response.status >= 400:
            content = response.data if not stream else response.read()
            response.release_conn()
            raise HttpError(f"{method} {path} answered HTTP {response.status}: {content[:1000]!r}", response.status)
        return response

    def request(self, method: str, path: str, body: Any = None, *, timeout_s: float | None = None) -> Any:
        """The decoded JSON answer (None when empty; the text when it is not JSON)."""
        raw = self._send(method, path, body, timeout_s, stream=False).data
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:  # some routes answer plain text, e.g. "Success: LoRA adapter … added"
            return raw.decode(errors="replace")

    def stream_lines(self, method: str, path: str, body: Any = None) -> Iterator[str]:
        """The answer's lines as they arrive (server-sent events, NDJSON)."""
        response = self._send(method, path, body, None, stream=True)
        try:
            buffered = b""
            for chunk in response.stream(4096):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                yield from (line.decode() for line in lines)
            if buffered:
                yield buffered.decode()
        except urllib3.exceptions.HTTPError as exc:
            raise HttpError(f"{method} {path} broke off: {type(exc).__name__}: {exc}",
                            unreachable=_unreachable(exc)) from exc
        finally:
            response.release_conn()

    def close(self) -> None:
        self._pool.clear()
