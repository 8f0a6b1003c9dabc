"""Runtimes: where harness code runs.

A harness reaches the model only through the client it is handed (`complete(prompt)`,
`chat(messages)`), so the same harness runs wherever such a client can reach the rollout:

    in-process   the harness runs in the worker's thread and gets the rollout's `Interceptor`
    subprocess   the harness runs in a child Python process (`python -m rollwire.producers.runtimes`)
                 and gets an `EndpointClient` for the rollout's interception URL (OpenAI-compatible
                 `/completions` and `/chat/completions`); its answer comes back on stdout; past the
                 time limit the child is killed

A container runtime (`rollwire.producers.sandbox`) is one more `Runtime` with the same contract: start
something that can reach the interception URL, hand it the task row and the harness reference,
read back the answer. Tasksets and harnesses do not change: every call is still recorded by the
rollout's `Interceptor`, on the worker's side of the URL.

Harnesses are referenced by name (`completion`, `chat`) or as `package.module:function`, so that a
child process can import them.
"""

from __future__ import annotations

import json
import os
import sys
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from rollwire.core.errors import ConfigError
from rollwire.core.http import HttpError, JsonClient
from rollwire.core.registry import UnknownNameError
from rollwire.producers.harnesses import HARNESSES, Harness, HarnessError, run_against_endpoint
from rollwire.producers.interception import Interceptor
from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.tool_calls import ToolCallFormat


def resolve_harness(reference: str) -> Harness:
    """A harness by registered name or reference (`package.module:function`, `path/file.py:function`)."""
    try:
        return HARNESSES.get(reference)
    except UnknownNameError as exc:
        raise HarnessError(f"{exc}; or give package.module:function") from None
    except ConfigError as exc:  # a reference that does not import
        raise HarnessError(f"cannot import {exc}") from exc


class Runtime(ABC):
    """Runs one rollout's harness and returns its final answer text."""

    name: ClassVar[str]
    watchdog_grace_s: ClassVar[float] = 0.0
    """How long past the rollout's time limit the worker waits before timing the rollout out itself:
    a runtime that enforces the limit on its own gets the time to say why it ended it."""

    @abstractmethod
    def run(self, harness: str, row: dict, interceptor: Interceptor, *, timeout_s: float,
            options: dict[str, Any] | None = None) -> str:
        """Runs `harness(row, interceptor, **options)`. Raises `HarnessTimeout` past `timeout_s`,
        `HarnessError` (or the harness's own exception) on failure."""

    def close(self) -> None:  # noqa: B027 - optional: most runtimes hold nothing to release
        """Releases what the runtime holds (servers, pools)."""


class InProcess(Runtime):
    """The harness runs in the calling thread (the env worker's rollout pool); the worker enforces the time limit."""

    name = "in-process"

    def run(self, harness: str, row: dict, interceptor: Interceptor, *, timeout_s: float,
            options: dict[str, Any] | None = None) -> str:
        return resolve_harness(harness)(row, interceptor, **(options or {}))


class Subprocess(Runtime):
    """The harness runs in a child Python process that reaches the model through the rollout's URL."""

    name = "subprocess"
    watchdog_grace_s = 5.0

    def __init__(self, server: InterceptionServer | None = None, *, python: str = sys.executable) -> None:
        self.server = server or InterceptionServer()
        self._own_server = server is None
        self.python = python

    def run(self, harness: str, row: dict, interceptor: Interceptor, *, timeout_s: float,
            options: dict[str, Any] | None = None) -> str:
        done = run_against_endpoint([self.python, "-m", "rollwire.producers.runtimes"], self.server, interceptor,
                                    lambda url: {"ROLLWIRE_MODEL_URL": url, "ROLLWIRE_TASK": json.dumps(row),
                                                 "ROLLWIRE_HARNESS": harness,
                                                 "ROLLWIRE_HARNESS_OPTIONS": json.dumps(options or {}),
                                                 "ROLLWIRE_TOOL_CALL_FORMAT": interceptor.tool_call_format},
                                    timeout_s=timeout_s, what="the harness in its subprocess")
        lines = done.stdout.strip().splitlines()
        try:
            result = json.loads(lines[-1]) if lines else {}
        except ValueError:
            result = {}
        if done.returncode != 0 or "answer" not in result:
            reason = result.get("error") or done.stderr.strip()[-500:] or f"exit code {done.returncode}"
            raise HarnessError(f"the harness failed in its subprocess: {reason}")
        return result["answer"]

    def close(self) -> None:
        if self._own_server:
            self.server.shutdown()


RUNTIMES = {"in-process": InProcess, "subprocess": Subprocess}


class EndpointClient:
    """What a harness in a child process holds instead of the `Interceptor`: the same two calls,
    over the rollout's OpenAI-compatible interception URL."""

    def __init__(self, base_url: str, timeout_s: float = 300.0, *, tool_call_format: ToolCallFormat = "hermes") -> None:
        self._http = JsonClient(base_url, timeout_s=timeout_s, max_connections=4)
        self.tool_call_format = tool_call_format
        """The format the policy writes tool calls in: the worker's Interceptor's, passed down."""

    def complete(self, prompt: str) -> str:
        return self._post("/completions", {"model": "policy", "prompt": prompt})["choices"][0]["text"]

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        # the text as sampled, tool calls and all: rollwire's harnesses read the calls themselves
        body: dict[str, Any] = {"model": "policy", "messages": messages, "rollwire_sampled_text": True}
        if tools:
            body["tools"] = tools
        return self._post("/chat/completions", body)["choices"][0]["message"]["content"]

    def _post(self, path: str, body: dict) -> dict:
        try:
            return self._http.request("POST", path, body)
        except HttpError as exc:
            raise HarnessError(f"the interception endpoint failed: {exc}") from exc


def _child() -> int:
    """Entry point of the subprocess runtime: run the harness, print `{"answer": ...}` or `{"error": ...}`."""
    try:
        harness = resolve_harness(os.environ["ROLLWIRE_HARNESS"])
        options = json.loads(os.environ.get("ROLLWIRE_HARNESS_OPTIONS") or "{}")
        client = EndpointClient(os.environ["ROLLWIRE_MODEL_URL"],  # the Interceptor's two calls, over HTTP
                                tool_call_format=os.environ.get("ROLLWIRE_TOOL_CALL_FORMAT", "hermes"))  # type: ignore[arg-type]
        answer = harness(json.loads(os.environ["ROLLWIRE_TASK"]), client, **options)  # type: ignore[arg-type]
    except Exception as exc:  # reported to the worker, which marks the rollout errored
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"answer": answer}))
    return 0


if __name__ == "__main__":
    sys.exit(_child())
