"""What every agent API shares: the request as the chat template takes it, the sampled reply with
its tool calls read out, the ids a rollout issued, and refusals that name the fix."""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rollwire.producers.tool_calls import ToolCallFormat, read_tool_calls


class ApiError(Exception):
    """A request that cannot be served: answered with `status` and this message, naming the fix."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ChatRequest:
    """One call, whatever API it came in: what the rollout's interceptor samples from."""

    messages: list[dict]
    """Role and text content each, as the chat template takes them; `tool_calls` (arguments as
    objects) on an assistant turn this rollout did not sample, `tool_call_id` on tool results."""
    tools: list[dict] | None
    """OpenAI function schemas (`{"type": "function", "function": {...}}`) for the template."""
    model: str
    stream: bool
    include_usage: bool = False
    raw_prompt: str | None = None
    """A completion's prompt: raw text, no template (`/v1/completions`)."""
    not_carried: int = 0
    """Leading messages a continuation of this call does not carry over (the Responses API's `instructions`)."""
    read_tool_calls: bool = True
    """Return tool calls as the API's structures; false returns the sampled text whole (the body's
    `rollwire_sampled_text`: rollwire's own harnesses in a subprocess read the calls themselves)."""


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """The sampled text of one call, read: the text outside its tool calls, the calls, and why it stopped."""

    text: str
    """Everything sampled (what the rollout recorded)."""
    content: str
    """The text outside the tool calls."""
    calls: list[Call]
    finish_reason: str
    """`stop`, `length` or `tool_calls`."""
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Issued:
    """One rollout's memory of what it returned: each tool call id with the text sampled with it, and
    (Responses API) each response id with the conversation up to and including it."""

    calls: dict[str, str] = field(default_factory=dict)
    responses: dict[str, list[dict]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sampled_turn(self, ids: Iterable[str]) -> str | None:
        """The text sampled with every one of these call ids, when one turn of this rollout issued them all."""
        with self.lock:
            texts = {self.calls.get(i) for i in ids}
        return texts.pop() if len(texts) == 1 and None not in texts else None


def read_reply(text: str, finish_reason: str | None, usage: dict, issued: Issued, prefix: str = "call_", *,
               tools: bool = True, tool_call_format: ToolCallFormat = "hermes") -> Reply:
    """The sampled `text` with its well-formed tool calls (written in `tool_call_format`) read out
    (with `tools`), each given a new id (`prefix`) that `issued` remembers with the text. A reply
    whose calls do not all parse stays text."""
    read = read_tool_calls(text, tool_call_format) if tools else None
    well_formed = read is not None and read.calls and all(
        c.error is None and c.name and isinstance(c.arguments, dict) for c in read.calls)
    calls = [Call(f"{prefix}{secrets.token_hex(12)}", c.name, dict(c.arguments))  # type: ignore[arg-type]
             for c in read.calls] if read is not None and well_formed else []
    if calls:
        with issued.lock:
            issued.calls.update(dict.fromkeys((c.id for c in calls), text))
    return Reply(text=text, content=read.content if read is not None and calls else text, calls=calls,
                 finish_reason="tool_calls" if calls else (finish_reason or "stop"),
                 prompt_tokens=int(usage.get("prompt_tokens", 0)), completion_tokens=int(usage.get("completion_tokens", 0)))


def assistant_turn(content: str, calls: list[dict], issued: Issued) -> dict:
    """An assistant turn sent back: the text this rollout sampled when it issued all of `calls`
    (`{"id", "name", "arguments"}`), else the turn as the template would render another model's."""
    sampled = issued.sampled_turn(str(c["id"]) for c in calls) if calls else None
    if sampled is not None:
        return {"role": "assistant", "content": sampled}
    turn: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        turn["tool_calls"] = [{"id": c["id"], "type": "function",
                               "function": {"name": c["name"], "arguments": json_object(c["arguments"], c["id"])}}
                              for c in calls]
    return turn


def json_object(arguments: Any, call_id: object) -> dict:
    """A tool call's arguments as an object (APIs send a JSON string or an object)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ApiError(f"tool call {call_id!r}: its arguments are not JSON: {arguments[:200]!r}") from None
    if not isinstance(arguments, dict):
        raise ApiError(f"tool call {call_id!r}: its arguments must be a JSON object")
    return arguments


TEXT_PARTS = ("text", "input_text", "output_text")


def text_of(where: str, content: object, *, refused_hint: str = "send text parts") -> str:
    """Content as text: a string, None, or a list of text parts (images, audio and files refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
            else:
                raise ApiError(f"{where}: a content part of type {kind!r} is not served: the policy reads text "
                               f"only ({refused_hint})")
        return "".join(texts)
    raise ApiError(f"{where}: content must be a string, null, or a list of text parts")


def common_options(body: object) -> dict:
    """The body as an object, with the options no API can serve refused."""
    if not isinstance(body, dict):
        raise ApiError(f"the body is a JSON {type(body).__name__}, not an object")
    n = body.get("n")
    if n not in (None, 1):
        raise ApiError(f"n = {n} is not served: a rollout samples one answer per call (send the request n times)")
    if body.get("logit_bias"):
        raise ApiError("logit_bias is not served: the rollout's sampler samples the policy's own distribution, as "
                       "training needs")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError("`stream` must be true or false")
    return body


def forced_tool_choice(choice: object) -> ApiError:
    return ApiError(f"tool_choice {json.dumps(choice)} is not served: the rollout's sampler cannot force a call "
                    "(use \"auto\", and let the reward judge whether the model called the tool)")


def openai_error(message: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


@dataclass(frozen=True)
class Api:
    """One API a rollout's URL serves: how its requests read, and how its replies and streams are written."""

    name: str
    """What the API is called in messages ("chat completions")."""
    parse: Any
    """`(body, issued) -> ChatRequest`, raising `ApiError`."""
    respond: Any
    """`(reply, request, issued) -> dict`: the response body."""
    events: Any
    """`(response, request) -> Iterator[(event name or None, payload)]`: the stream of `stream: true`."""
    call_prefix: str = "call_"
    """How this API's tool call ids begin."""
    error: Any = openai_error
    """`(message, code=None) -> dict`: an error body as this API's clients read it."""
