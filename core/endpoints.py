"""OpenAI-compatible endpoints rollwire asks as a client: the model under `rollwire eval`, an LLM
judge, a simulated user. Any server that speaks the OpenAI API does (a vLLM server, a hosted API).

    endpoint = OpenAIEndpoint("http://127.0.0.1:8001/v1", "judge", timeout_s=60)
    text = endpoint.chat([{"role": "user", "content": "..."}], max_tokens=64, temperature=0.0)

Nothing here records tokens: the policy's own calls in a rollout go through its `Interceptor`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from rollwire.core import telemetry
from rollwire.core.errors import RollwireError
from rollwire.core.http import HttpError, JsonClient


class EndpointError(RollwireError):
    """The endpoint refused or failed a request, or answered with something that is not an OpenAI
    reply; the message has its answer."""


class OpenAIEndpoint:
    """A minimal OpenAI-compatible client, safe to share between threads."""

    def __init__(self, base_url: str, model: str, *, api_key: str = "EMPTY", timeout_s: float = 120.0) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model
        self._http = JsonClient(self.base_url, timeout_s=timeout_s, headers={"Authorization": f"Bearer {api_key}"})

    def post(self, path: str, body: dict) -> dict:
        """POSTs `body` (with this endpoint's `model`) to `path`; `EndpointError` with the answer on failure."""
        try:
            return self._http.request("POST", path, {"model": self.model, **body})
        except HttpError as exc:
            raise EndpointError(str(exc)) from exc

    def chat(self, messages: list[dict], **params: Any) -> str:
        """The text of the first choice of a `/chat/completions` call with `params` (max_tokens, ...)."""
        reply = self.post("/chat/completions", {"messages": messages, **params})
        try:
            return reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"{self.base_url}/chat/completions answered without a message: {str(reply)[:300]}") from exc

    def complete(self, prompt: str, **params: Any) -> str:
        """The text of the first choice of a `/completions` call with `params`."""
        reply = self.post("/completions", {"prompt": prompt, **params})
        try:
            return reply["choices"][0]["text"]
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"{self.base_url}/completions answered without a text: {str(reply)[:300]}") from exc


def replies(ask: Callable[[], str], *, retries: int, span: str, prefix: str, attributes: dict[str, Any],
            reasons: list[str]) -> Iterator[tuple[int, str, Any]]:
    """Asks (`ask()`) up to `retries` + 1 times, each try a span `span` with its seconds, reply or
    error under `prefix`; yields (try, reply, its span) for each reply, for the caller to return on a good
    one or note in `reasons` why it is not and go on. A failed request is noted there itself."""
    for attempt in range(retries + 1):
        with telemetry.tracer().start_as_current_span(span, attributes={**attributes, f"{prefix}.attempt": attempt}) as current:
            started = time.perf_counter()
            try:
                reply = ask()
            except EndpointError as exc:  # no answer, or not an OpenAI one
                reasons.append(f"try {attempt + 1}: {type(exc).__name__}: {exc}")
                current.set_attribute(f"{prefix}.error", str(exc)[:300])
                continue
            finally:
                current.set_attribute(f"{prefix}.seconds", time.perf_counter() - started)
            current.set_attribute(f"{prefix}.reply", reply[:500])
            yield attempt, reply, current
