"""The OpenAI Chat Completions and Completions APIs (`POST /v1/chat/completions`, `/v1/completions`).

Served: `messages` with `system`/`developer`, `user`, `assistant` (with `tool_calls`, `content:
null`) and `tool` roles, content as a string or a list of text parts; `tools` (rendered by the
model's chat template) with `tool_choice` `auto` or `none`; the sampled text's tool calls returned
as `tool_calls` (several in one reply: parallel calls); `stream` and `stream_options.include_usage`;
usage; finish reasons `stop`, `length`, `tool_calls`. Refused with the reason: images, audio and
files, `n > 1`, `logit_bias`, a forced `tool_choice`, `response_format`. Sampling settings in the
request are ignored: the rollout's own apply.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

from rollwire.producers.agent_api.common import (
    Api,
    ApiError,
    ChatRequest,
    Issued,
    Reply,
    assistant_turn,
    common_options,
    forced_tool_choice,
    text_of,
)

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
"""Roles an agent may send, and the role the chat template gets (`developer` is OpenAI's new name for `system`)."""


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options") or {}
    return bool(isinstance(options, dict) and options.get("include_usage"))


def parse_completion(body: object, issued: Issued) -> ChatRequest:
    body = common_options(body)
    if not isinstance(body.get("prompt"), str):
        raise ApiError("`prompt` must be a string (one prompt per request)")
    return ChatRequest([], None, str(body.get("model", "policy")), bool(body.get("stream")), _include_usage(body),
                       raw_prompt=body["prompt"], read_tool_calls=False)


def parse_chat(body: object, issued: Issued) -> ChatRequest:
    """The request `body` checked and translated. Raises `ApiError` naming what to change."""
    body = common_options(body)
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
        raise forced_tool_choice(choice)
    return ChatRequest(rendered, (tools or None) if choice != "none" else None, str(body.get("model", "policy")),
                       bool(body.get("stream")), _include_usage(body),
                       read_tool_calls=not body.get("rollwire_sampled_text"))


def _message(i: int, message: object, issued: Issued) -> dict:
    where = f"`messages[{i}]`"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ApiError(f"{where} must be an object with a `role` of {', '.join(ROLES)}")
    role = ROLES[message["role"]]
    content = text_of(where, message.get("content"))
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                  for c in calls):
            raise ApiError(f"{where}.tool_calls must be a list of {{\"id\", \"type\": \"function\", \"function\": "
                           "{\"name\", \"arguments\"}}")
        return assistant_turn(content, [{"id": c.get("id"), "name": c["function"].get("name"),
                                         "arguments": c["function"].get("arguments", {})} for c in calls], issued)
    out = {"role": role, "content": content}
    if role == "tool" and message.get("tool_call_id") is not None:
        out["tool_call_id"] = str(message["tool_call_id"])
    return out


def _usage(reply: Reply) -> dict:
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


def respond_chat(reply: Reply, request: ChatRequest, issued: Issued) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or (None if reply.calls else "")}
    if reply.calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                 for c in reply.calls]
    return {"id": f"chatcmpl-{secrets.token_hex(6)}", "object": "chat.completion", "created": int(time.time()),
            "model": request.model, "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason,
                                                 "logprobs": None}], "usage": _usage(reply)}


def respond_completion(reply: Reply, request: ChatRequest, issued: Issued) -> dict:
    finish = "stop" if reply.finish_reason == "tool_calls" else reply.finish_reason
    return {"id": f"cmpl-{secrets.token_hex(6)}", "object": "text_completion", "created": int(time.time()),
            "model": request.model, "choices": [{"index": 0, "text": reply.text, "finish_reason": finish,
                                                 "logprobs": None}], "usage": _usage(reply)}


def chat_events(response: dict, request: ChatRequest) -> Iterator[tuple[str | None, dict]]:
    """The chunks of `stream: true` for a finished response (the whole reply was sampled first, so
    the record is the same as without streaming): the role, the content, each tool call, the finish
    reason, and the usage when asked."""
    head = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    choice = response["choices"][0]
    message = choice["message"]

    def delta(**fields: Any) -> tuple[None, dict]:
        return None, {**head, "choices": [{"index": 0, "delta": fields, "finish_reason": None}]}

    yield delta(role="assistant", content="")
    if message.get("content"):
        yield delta(content=message["content"])
    for index, call in enumerate(message.get("tool_calls") or []):
        yield delta(tool_calls=[{"index": index, **call}])
    yield None, {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    if request.include_usage:
        yield None, {**head, "choices": [], "usage": response["usage"]}


def completion_events(response: dict, request: ChatRequest) -> Iterator[tuple[str | None, dict]]:
    head = {"id": response["id"], "object": "text_completion", "created": response["created"],
            "model": response["model"]}
    choice = response["choices"][0]
    yield None, {**head, "choices": [{"index": 0, "text": choice["text"], "finish_reason": None}]}
    yield None, {**head, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"]}]}
    if request.include_usage:
        yield None, {**head, "choices": [], "usage": response["usage"]}


CHAT_COMPLETIONS = Api("chat completions", parse_chat, respond_chat, chat_events)
COMPLETIONS = Api("completions", parse_completion, respond_completion, completion_events)
