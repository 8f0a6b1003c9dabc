"""Tool calls read out of the text a model sampled, in the format its chat template teaches it.

    hermes        <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>   Hermes, Qwen2.5, Qwen3
    llama3_json   {"name": "add", "parameters": {"a": 2, "b": 3}}                       Llama 3.1 to 3.3
                  (optionally after <|python_tag|>; several separated by ";")
    mistral       [TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]          Mistral tokenizers before v11
                  [TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}                                 v11 and later
    call          CALL calculator(6 * 7)                                                the bundled calculator's own protocol

Which format a served model writes is read from its chat template (`format_written`: the template
renders a call of its own and the format is the one it wrote), or set where the template does not
say (`[env_workers] tool_call_format`). The chat harness answers the calls it finds; the
interception server returns them to agents as `tool_calls`, `tool_use` blocks or `function_call`
items (`producers/agent_api/`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

ToolCallFormat = Literal["hermes", "llama3_json", "mistral"]
TOOL_CALL_FORMATS: tuple[ToolCallFormat, ...] = ("hermes", "llama3_json", "mistral")

_CALL = re.compile(r"CALL\s+(\w+)\((.*?)\)")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str
    """The call's arguments by name, or (`CALL tool(text)`) the text of the tool's first argument."""
    error: str | None = None
    """Why the call could not be read; the model is told this instead of a result."""


@dataclass(frozen=True)
class Read:
    """A reply read in one format: the text outside its calls, and the calls (none: an answer)."""

    content: str
    calls: list[ToolCall]


def read_tool_calls(reply: str, fmt: ToolCallFormat = "hermes") -> Read:
    """The tool calls in `reply` as `fmt` writes them, and the text around them. A call that is
    begun but cannot be read is a `ToolCall` with its `error` (generation may stop inside one)."""
    return _READERS[fmt](reply)


def parse_tool_calls(reply: str, fmt: ToolCallFormat = "hermes") -> list[ToolCall]:
    """Every tool call in a reply (`read_tool_calls`); in the Hermes format, where there is no
    `<tool_call>` block, the calculator's `CALL tool(argument)`. None means an answer."""
    calls = read_tool_calls(reply, fmt).calls
    if not calls and fmt == "hermes":
        return [ToolCall(m.group(1), m.group(2)) for m in _CALL.finditer(reply)][:1]
    return calls


def format_written(text: str, tool_name: str) -> ToolCallFormat | None:
    """The format a chat template wrote a call of `tool_name` in (`text`: an assistant turn with that
    call, rendered by the template and decoded with its special tokens); None when it wrote none
    (a template without tool calls, or one that drops them)."""
    if "<tool_call>" in text:
        return "hermes"
    if MISTRAL_CALLS in text:
        return "mistral"
    if re.search(r'\{\s*"name"\s*:\s*"' + re.escape(tool_name) + r'"\s*,\s*"(parameters|arguments)"', text):
        return "llama3_json"
    return None


def _one_call(obj: object, arguments_keys: tuple[str, ...]) -> ToolCall:
    """A call from its JSON object: `name` and (the first present of) `arguments_keys`, an object or
    a JSON string of one (some models write the arguments as a string)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise ValueError('want {"name": TOOL, "arguments": {PARAMETER: VALUE, ...}}')
    arguments: Any = next((obj[k] for k in arguments_keys if k in obj), {})
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError("the arguments must be a JSON object of parameter names to values")
    return ToolCall(obj["name"], arguments)


def _malformed(text: str, exc: Exception) -> ToolCall:
    return ToolCall("", "", error=f"error: malformed tool call {text.strip()[:200]!r}: {exc}")


def _hermes(reply: str) -> Read:
    blocks = _TOOL_CALL.findall(reply)
    calls = []
    for block in blocks:
        try:
            calls.append(_one_call(json.loads(block), ("arguments", "parameters")))
        except (ValueError, TypeError) as exc:
            calls.append(_malformed(block, exc))
    return Read(_TOOL_CALL.sub("", reply).strip() if blocks else reply, calls)


def _json_objects(text: str, separator: str) -> list[object]:
    """The JSON values written one after another in `text`, each followed by `separator` or the end."""
    values, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        value, at = _JSON.raw_decode(text, at)
        values.append(value)
        rest = text[at:].lstrip()
        if not rest:
            return values
        if not rest.startswith(separator):
            raise ValueError(f"{rest[:40]!r} after a call: calls are separated by {separator!r}")
        at = len(text) - len(rest) + len(separator)


def _llama3_json(reply: str) -> Read:
    """Llama 3.1's JSON calls: the whole reply, after an optional `<|python_tag|>`. A reply that
    begins with `{` but is not calls is an answer (a model may answer in JSON); after the tag it is
    a malformed call."""
    text = reply.strip()
    tagged = text.startswith(PYTHON_TAG)
    if tagged:
        text = text[len(PYTHON_TAG):].strip()
    if not text.startswith("{"):
        return Read(reply, [_malformed(text, ValueError("want a JSON object after <|python_tag|>"))] if tagged else [])
    try:
        return Read("", [_one_call(obj, ("parameters", "arguments")) for obj in _json_objects(text, ";")])
    except (ValueError, TypeError) as exc:
        return Read("", [_malformed(text, exc)]) if tagged else Read(reply, [])


def _mistral(reply: str) -> Read:
    """Mistral's calls after `[TOOL_CALLS]`: a JSON list (or object) of calls before v11, else
    `name[ARGS]{arguments}` (or `name{arguments}`), one per `[TOOL_CALLS]`."""
    content, marker, rest = reply.partition(MISTRAL_CALLS)
    if not marker:
        return Read(reply, [])
    calls: list[ToolCall] = []
    for segment in rest.split(MISTRAL_CALLS):
        text = segment.strip()
        try:
            if text.startswith(("[", "{")):
                value = _JSON.raw_decode(text)[0]
                calls += [_one_call(obj, ("arguments",)) for obj in (value if isinstance(value, list) else [value])]
                continue
            if MISTRAL_ARGS in text:
                name, _, arguments = text.partition(MISTRAL_ARGS)
            else:  # name{arguments}
                brace = text.find("{") if "{" in text else len(text)
                name, arguments = text[:brace], text[brace:]
            arguments = arguments.strip()
            calls.append(_one_call({"name": name.strip(), "arguments": _JSON.raw_decode(arguments)[0] if arguments else {}},
                                   ("arguments",)))
        except (ValueError, TypeError) as exc:
            calls.append(_malformed(text, exc))
    return Read(content.strip(), calls)


_READERS = {"hermes": _hermes, "llama3_json": _llama3_json, "mistral": _mistral}
