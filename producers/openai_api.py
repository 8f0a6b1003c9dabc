"""The OpenAI API as agents use it, translated to and from a rollout's recorded calls: what the
interception server (`producers/interception_server.py`) serves on each rollout's URL.

    request body  --chat_request-->  ChatRequest: messages as the chat template takes them, tools
    sampled text  --chat_response--> a chat.completion: content, tool_calls, finish_reason, usage
    a response    --stream_chunks--> the chat.completion.chunk events of `stream: true`

Served: `messages` with `system`/`developer`, `user`, `assistant` (with `tool_calls`, `content:
null`) and `tool` roles, content as a string or a list of text parts; `tools` (rendered by the
model's chat template) with `tool_choice` `auto` or `none`; the sampled text parsed into
`tool_calls` (Hermes/Qwen `<tool_call>{json}</tool_call>` blocks, several in one reply as parallel
calls); `stream` and `stream_options.include_usage`; usage; finish reasons `stop`, `length`,
`tool_calls`. Refused with the reason: images, audio and files (the policy reads text), `n > 1`,
`logit_bias`, a forced `tool_choice` and `response_format` schemas (the sampler samples freely, as
training needs). Sampling settings in the request are ignored: the rollout's own apply.

Token-exact across turns: an assistant turn the agent sends back, whose tool calls this rollout
issued, is replaced by the text the model sampled for it (`issued`), so the template renders the
same tokens and the next call's prompt extends the sampled ones instead of re-rendering the calls
as the template would write them.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rollwire.producers.tool_calls import parse_tool_calls, without_tool_calls

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
"""Roles an agent may send, and the role the chat template gets (`developer` is OpenAI's new name for `system`)."""


class ApiError(Exception):
    """A request that cannot be served: answered with `status` and this message, naming the fix."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    """As the chat template takes them: role and text content; `tool_calls` kept where this rollout did not issue them."""
    tools: list[dict] | None
    model: str
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    model: str
    stream: bool
    include_usage: bool


def _common(body: object) -> dict:
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


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options") or {}
    return bool(isinstance(options, dict) and options.get("include_usage"))


def completion_request(body: object) -> CompletionRequest:
    body = _common(body)
    if not isinstance(body.get("prompt"), str):
        raise ApiError("`prompt` must be a string (one prompt per request)")
    return CompletionRequest(body["prompt"], str(body.get("model", "policy")), bool(body.get("stream")),
                             _include_usage(body))


def chat_request(body: object, issued: Mapping[str, str]) -> ChatRequest:
    """The request `body` checked and translated; `issued` maps the tool call ids this rollout
    returned to the text sampled with them. Raises `ApiError` naming what to change."""
    body = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("`messages` must be a non-empty list")
    rendered = [_message(i, m, issued) for i, m in enumerate(messages)]
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError("response_format is not served: the rollout's sampler cannot constrain the output (ask for "
                       "the format in the prompt, and check it in the reward)")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools)):
        raise ApiError("`tools` must be a list of function objects ({\"type\": \"function\", \"function\": "
                       "{\"name\": ..., \"parameters\": {...}}})")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise ApiError(f"tool_choice {json.dumps(choice)} is not served: the rollout's sampler cannot force a call "
                       "(use \"auto\", and let the reward judge whether the model called the tool)")
    return ChatRequest(rendered, (tools or None) if choice != "none" else None, str(body.get("model", "policy")),
                       bool(body.get("stream")), _include_usage(body))


def _message(i: int, message: object, issued: Mapping[str, str]) -> dict:
    where = f"`messages[{i}]`"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ApiError(f"{where} must be an object with a `role` of {', '.join(ROLES)}")
    role = ROLES[message["role"]]
    content = _text(where, message.get("content"))
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                  for c in calls):
            raise ApiError(f"{where}.tool_calls must be a list of {{\"id\", \"type\": \"function\", \"function\": "
                           "{\"name\", \"arguments\"}}")
        sampled = {issued.get(str(c.get("id")), None) for c in calls}
        if len(sampled) == 1 and None not in sampled:  # this rollout's own turn: the tokens as sampled
            return {"role": "assistant", "content": sampled.pop()}
        return {"role": "assistant", "content": content, "tool_calls": [_call_for_template(c) for c in calls]}
    out = {"role": role, "content": content}
    if role == "tool" and message.get("tool_call_id") is not None:
        out["tool_call_id"] = str(message["tool_call_id"])
    return out


def _call_for_template(call: dict) -> dict:
    """A tool call the agent wrote itself (or another model did), as templates render them: arguments as an object."""
    function = call["function"]
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ApiError(f"tool call {call.get('id')!r}: its arguments are not JSON: {arguments[:200]!r}") from None
    return {"id": call.get("id"), "type": "function", "function": {"name": function.get("name"), "arguments": arguments}}


def _text(where: str, content: object) -> str:
    """Content as text: a string, None (an assistant turn of tool calls only), or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("text", "input_text", "output_text", "refusal") and isinstance(
                    part.get("text", part.get("refusal")), str):
                texts.append(part.get("text", part.get("refusal")))
            else:
                raise ApiError(f"{where}: a content part of type {kind!r} is not served: the policy reads text "
                               "only (send text parts)")
        return "".join(texts)
    raise ApiError(f"{where}.content must be a string, null, or a list of text parts")


def chat_response(text: str, finish_reason: str | None, usage: dict, model: str, issued: dict[str, str]) -> dict:
    """A chat.completion for the sampled `text`: its tool calls parsed out (each given an id, kept in
    `issued` with the text), the rest as content."""
    calls = [c for c in parse_tool_calls(text) if c.error is None and c.name] if "<tool_call>" in text else []
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        ids = [f"call_{secrets.token_hex(12)}" for _ in calls]
        issued.update(dict.fromkeys(ids, text))
        rest = without_tool_calls(text)
        message = {"role": "assistant", "content": rest or None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in zip(ids, calls)]}
        finish_reason = "tool_calls"
    return {"id": f"chatcmpl-{secrets.token_hex(6)}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish_reason or "stop",
                                         "logprobs": None}], "usage": usage}


def completion_response(text: str, finish_reason: str | None, usage: dict, model: str) -> dict:
    return {"id": f"cmpl-{secrets.token_hex(6)}", "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "text": text, "finish_reason": finish_reason or "stop",
                                         "logprobs": None}], "usage": usage}


def stream_chunks(response: dict, include_usage: bool) -> Iterator[dict]:
    """The events of `stream: true` for a finished `response` (the whole reply was sampled first,
    so the record is the same as without streaming): the role, the content, each tool call, the
    finish reason, and the usage when asked."""
    head = {"id": response["id"], "created": response["created"], "model": response["model"]}
    choice = response["choices"][0]
    if response["object"] == "text_completion":
        head["object"] = "text_completion"
        yield {**head, "choices": [{"index": 0, "text": choice["text"], "finish_reason": None}]}
        yield {**head, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"]}]}
    else:
        head["object"] = "chat.completion.chunk"
        message = choice["message"]

        def delta(**fields: Any) -> dict:
            return {**head, "choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

        yield delta(role="assistant", content="")
        if message.get("content"):
            yield delta(content=message["content"])
        for index, call in enumerate(message.get("tool_calls") or []):
            yield delta(tool_calls=[{"index": index, **call}])
        yield {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    if include_usage:
        yield {**head, "choices": [], "usage": response["usage"]}
