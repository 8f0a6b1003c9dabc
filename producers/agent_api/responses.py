"""The OpenAI Responses API (`POST /v1/responses`), as the `openai` SDK and the OpenAI Agents SDK send it.

Served: `instructions`; `input` as a string or items: messages (`role` of `system`, `developer`,
`user`, `assistant`; content a string or `input_text` / `output_text` parts), `function_call`
(the model's call, `call_id`, `name`, JSON `arguments`) and `function_call_output` (its answer);
`previous_response_id`, for a response of the same rollout (the conversation up to it is kept in
the rollout's memory: nothing is stored beyond the rollout); `tools` of `type: "function"`
(rendered by the model's chat template) with `tool_choice` `auto` or `none`; the sampled text's
tool calls returned as `function_call` items beside the `message` item; `status` `completed`, or
`incomplete` with `max_output_tokens` as the reason; usage; `stream: true` as the API's events
(`response.created`, `response.output_item.added`, `response.output_text.delta`,
`response.function_call_arguments.delta`, ... `response.completed`). Refused with the reason:
images and files, reasoning items, built-in tools (web search, file search, computer use), a
forced `tool_choice`, `text.format` schemas, a `previous_response_id` this rollout did not answer.
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
    openai_error,
    text_of,
)

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def parse(body: object, issued: Issued) -> ChatRequest:
    body = common_options(body)
    history: list[dict] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        with issued.lock:
            known = issued.responses.get(str(previous))
        if known is None:
            raise ApiError(f"previous_response_id {previous!r} is not a response of this rollout: send the whole "
                           "conversation as `input`, or a response id this rollout's URL returned")
        history = [dict(m) for m in known]
    instructions = body.get("instructions")  # this request's only: a later response does not carry them over
    lead = [{"role": "system", "content": text_of("`instructions`", instructions)}] if instructions else []
    given = body.get("input")
    if isinstance(given, str):
        items: list = [{"role": "user", "content": given}]
    elif isinstance(given, list) and given:
        items = given
    else:
        raise ApiError("`input` must be a string or a non-empty list of items")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ApiError("`tools` must be a list of {\"type\": \"function\", \"name\", \"parameters\"}")
    for tool in tools:
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise ApiError(f"a tool of type {tool.get('type')!r} is not served: only functions ({{\"type\": "
                           "\"function\", \"name\", \"parameters\"}}), run by the agent")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise forced_tool_choice(choice)
    text_format = ((body.get("text") or {}).get("format") or {}).get("type") if isinstance(body.get("text"), dict) \
        else None
    if text_format not in (None, "text"):
        raise ApiError("text.format is not served: the rollout's sampler cannot constrain the output (ask for the "
                       "format in the prompt, and check it in the reward)")
    schemas = [{"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                                 "parameters": t.get("parameters") or {"type": "object"}}}
               for t in tools]
    return ChatRequest(lead + history + _messages(items, issued), (schemas or None) if choice != "none" else None,
                       str(body.get("model", "policy")), bool(body.get("stream")), not_carried=len(lead))


def _messages(items: list, issued: Issued) -> list[dict]:
    """Input items as template messages: an assistant message and the function calls after it are
    one assistant turn."""
    out: list[dict] = []
    turn_text: list[str] = []
    turn_calls: list[dict] = []

    def close_turn() -> None:
        if turn_text or turn_calls:
            out.append(assistant_turn("".join(turn_text), list(turn_calls), issued))
            turn_text.clear()
            turn_calls.clear()

    for i, item in enumerate(items):
        where = f"`input[{i}]`"
        if not isinstance(item, dict):
            raise ApiError(f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise ApiError(f"{where} must have a `role` of {', '.join(ROLES)}")
            text = text_of(where, item.get("content"), refused_hint="send input_text parts")
            if role == "assistant":
                if turn_calls:  # a new assistant message after calls: the earlier turn ended
                    close_turn()
                turn_text.append(text)
                continue
            close_turn()
            out.append({"role": role, "content": text})
        elif kind == "function_call":
            turn_calls.append({"id": item.get("call_id"), "name": item.get("name"),
                               "arguments": item.get("arguments", "{}")})
        elif kind == "function_call_output":
            close_turn()
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id")),
                        "content": output if isinstance(output, str) else text_of(where, output)})
        else:
            raise ApiError(f"{where}: an item of type {kind!r} is not served (messages, function_call, "
                           "function_call_output)")
    close_turn()
    return out


def respond(reply: Reply, request: ChatRequest, issued: Issued) -> dict:
    output: list[dict[str, Any]] = []
    response_id = f"resp_{secrets.token_hex(12)}"
    if reply.content or not reply.calls:
        output.append({"type": "message", "id": f"msg_{secrets.token_hex(12)}", "status": "completed",
                       "role": "assistant",
                       "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
    output += [{"type": "function_call", "id": f"fc_{secrets.token_hex(12)}", "call_id": c.id, "name": c.name,
                "arguments": json.dumps(c.arguments), "status": "completed"} for c in reply.calls]
    incomplete = reply.finish_reason == "length"
    response = {
        "id": response_id, "object": "response", "created_at": time.time(),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
        "model": request.model, "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"],
                   "strict": False} for t in request.tools or []],
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    with issued.lock:  # what a later request's previous_response_id continues
        issued.responses[response_id] = [*request.messages[request.not_carried:],
                                            {"role": "assistant", "content": reply.text}]
    return response


def events(response: dict, request: ChatRequest) -> Iterator[tuple[str | None, dict]]:
    """The Responses stream for a finished response: created, each output item added with its text
    or arguments, done, then completed."""
    number = iter(range(1 << 30))

    def event(kind: str, **fields: Any) -> tuple[str, dict]:
        return kind, {"type": kind, "sequence_number": next(number), **fields}

    yield event("response.created", response={**response, "status": "in_progress", "output": [], "usage": None})
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                        part=part)
            yield event("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                        delta=text, logprobs=[])
            yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                        text=text, logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                        part={**part, "text": text})
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        arguments=item["arguments"], name=item["name"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.incomplete" if response["status"] == "incomplete" else "response.completed",
                response=response)


RESPONSES = Api("responses", parse, respond, events, error=openai_error)
