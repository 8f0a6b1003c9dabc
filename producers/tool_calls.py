"""Tool calls read out of the text a model sampled, as chat templates teach models to write them.

    <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>   Hermes / Qwen2.5 / Qwen3
    CALL calculator(6 * 7)                                                 the bundled calculator's own protocol

The chat harness answers the calls it finds; the interception server returns them to agents as
`tool_calls`, `tool_use` blocks or `function_call` items (`producers/agent_api/`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_CALL = re.compile(r"CALL\s+(\w+)\((.*?)\)")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str
    """The call's arguments by name, or (`CALL tool(text)`) the text of the tool's first argument."""
    error: str | None = None
    """Why the call could not be read; the model is told this instead of a result."""


def parse_tool_calls(reply: str) -> list[ToolCall]:
    """Every tool call in a reply: Hermes/Qwen `<tool_call>{json}</tool_call>` blocks (an unclosed
    last one too: generation may stop inside it), else `CALL tool(argument)`; none means an answer."""
    blocks = _TOOL_CALL.findall(reply)
    if not blocks:
        return [ToolCall(m.group(1), m.group(2)) for m in _CALL.finditer(reply)][:1]
    calls = []
    for block in blocks:
        try:
            call = json.loads(block)
            name, arguments = call["name"], call.get("arguments", {})
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                arguments = json.loads(arguments)
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise ValueError("want {\"name\": TOOL, \"arguments\": {PARAMETER: VALUE, ...}}")
            calls.append(ToolCall(name, arguments))
        except (ValueError, KeyError, TypeError) as exc:
            calls.append(ToolCall("", "", error=f"error: malformed tool call {block.strip()[:200]!r}: {exc}"))
    return calls


def without_tool_calls(reply: str) -> str:
    """The reply's text outside its `<tool_call>` blocks."""
    return _TOOL_CALL.sub("", reply).strip()
