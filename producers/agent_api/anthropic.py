"""The Anthropic Messages API (`POST /v1/messages`), as the `anthropic` SDK sends it; its base URL
is the rollout's URL without `/v1` (ANTHROPIC_BASE_URL in an agent's environment).

Served: `system` (a string or text blocks); `messages` of `user` and `assistant` turns whose
content is a string or blocks: `text`, `tool_use` (the assistant's calls) and `tool_result` (their
answers, a string or text blocks, `is_error` said in the text); `tools` (`name`, `description`,
`input_schema`), rendered by the model's chat template as function schemas, with `tool_choice`
`auto` or `none`; the sampled text's tool calls returned as `tool_use` blocks (`stop_reason:
"tool_use"`), else `end_turn` or `max_tokens`; usage; `stream: true` as Anthropic's events
(`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`).
Refused with the reason: images and documents, thinking blocks, a forced `tool_choice`.
"""

from __future__ import annotations

import json
import secrets
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
)


def _text_blocks(where: str, content: object) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    kinds = sorted({str(b.get("type")) if isinstance(b, dict) else type(b).__name__ for b in content}) \
        if isinstance(content, list) else [type(content).__name__]
    raise ApiError(f"{where}: blocks of type {', '.join(kinds)} are not served here: the policy reads text only")


def parse(body: object, issued: Issued) -> ChatRequest:
    body = common_options(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("`messages` must be a non-empty list of {\"role\": \"user\" | \"assistant\", \"content\": ...}")
    rendered: list[dict] = []
    if body.get("system"):
        rendered.append({"role": "system", "content": _text_blocks("`system`", body["system"])})
    for i, message in enumerate(messages):
        rendered += _turn(i, message, issued)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools)):
        raise ApiError("`tools` must be a list of {\"name\", \"description\", \"input_schema\"}")
    choice = (body.get("tool_choice") or {}).get("type") if isinstance(body.get("tool_choice"), dict) else None
    if choice not in (None, "auto", "none"):
        raise forced_tool_choice(body["tool_choice"])
    schemas = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                 "parameters": t.get("input_schema") or {"type": "object"}}}
               for t in tools or []]
    return ChatRequest(rendered, (schemas or None) if choice != "none" else None, str(body.get("model", "policy")),
                       bool(body.get("stream")))


def _turn(i: int, message: object, issued: Issued) -> list[dict]:
    where = f"`messages[{i}]`"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise ApiError(f"{where} must be an object with a `role` of user or assistant")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise ApiError(f"{where}.content must be a string or a list of blocks")
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append({"id": block.get("id"), "name": block.get("name"), "arguments": block.get("input") or {}})
        elif kind == "tool_result" and role == "user":
            text = _text_blocks(f"{where}.content[{j}].content", block.get("content"))
            results.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id")),
                            "content": f"error: {text}" if block.get("is_error") else text})
        else:
            raise ApiError(f"{where}.content[{j}]: a {kind!r} block is not served in a {role} turn (text, "
                           "tool_use from the assistant, tool_result from the user)")
    if role == "assistant":
        return [assistant_turn("".join(texts), calls, issued)]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def respond(reply: Reply, request: ChatRequest, issued: Issued) -> dict:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.content}] if reply.content or not reply.calls else []
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in reply.calls]
    stop = {"tool_calls": "tool_use", "length": "max_tokens"}.get(reply.finish_reason, "end_turn")
    return {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant", "model": request.model,
            "content": blocks, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens}}


def events(response: dict, request: ChatRequest) -> Iterator[tuple[str | None, dict]]:
    """Anthropic's stream for a finished response: the message, each block started, its text or its
    input as JSON, stopped, then the stop reason and usage."""
    start = {**response, "content": [], "stop_reason": None,
             "usage": {"input_tokens": response["usage"]["input_tokens"], "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(response["content"]):
        opened: dict[str, Any]
        if block["type"] == "text":
            opened, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            opened = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": opened}
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": response["stop_reason"],
                                                               "stop_sequence": None},
                            "usage": {"output_tokens": response["usage"]["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}


def error(message: str, code: str | None = None) -> dict:
    return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


MESSAGES = Api("messages", parse, respond, events, call_prefix="toolu_", error=error)
