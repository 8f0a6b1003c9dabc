"""Harnesses: how the model works on a task. Every one reaches the model only through the
rollout's `Interceptor`, so every sampled token is recorded.

    completion   one raw-text completion of the row's `prompt`
    chat         a multi-turn chat from the row's `messages`, with tools (`rollwire.producers.tools`)
                 the model calls in the format of Hermes and Qwen templates, `<tool_call>{"name":
                 ..., "arguments": {...}}</tool_call>` (the row's `tools` are rendered into the
                 prompt by the chat template), or as `CALL tool(argument)`; each result comes back as
                 a `tool` message, and a call that does not parse, a wrong argument or a tool's
                 failure comes back as an error the model can read; `max_turns` is an option
    conversation the chat harness for several turns with a simulated user (a script, or another
                 model playing the user: `rollwire.producers.users`) saying each next user message
    script       unmodified agent code in a subprocess that knows only its rollout's URL
                 (OPENAI_BASE_URL for the OpenAI APIs, ANTHROPIC_BASE_URL for Anthropic's:
                 `rollwire.producers.agent_api`) and the task (ROLLWIRE_TASK, JSON); the last line
                 it prints is its answer

A harness returns the final answer text; raising (or a non-zero exit) makes the rollout errored.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator

from rollwire.core.errors import RollwireError
from rollwire.core.processes import agent_environment, die_with_parent
from rollwire.core.registry import Registry
from rollwire.producers.agent_api import agent_variables
from rollwire.producers.interception import Interceptor
from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.tool_calls import parse_tool_calls
from rollwire.producers.tools import ToolSet
from rollwire.producers.users import USERS, UserModelSettings, resolve_user

Harness = Callable[[dict, Interceptor], str]
"""`harness(task_row, interceptor) -> final answer text`."""



class HarnessError(RollwireError, RuntimeError):
    """The harness could not finish the rollout; the message says why."""


class HarnessTimeout(HarnessError):
    """The harness ran past its time limit."""


class ResourceLimit(HarnessError):
    """The harness's sandbox hit a limit (memory, processes); the message names which and the setting."""


def completion_harness(row: dict, interceptor: Interceptor) -> str:
    return interceptor.complete(row["prompt"])


def chat_harness(row: dict, interceptor: Interceptor, *, max_turns: int = 4) -> str:
    """Chats until the model answers without calling a tool (or `max_turns` replies). The row's
    `tools` (names or references, `rollwire.producers.tools`) go to the template as schemas, their
    toolboxes set up for this rollout and torn down after it; every call of a reply is answered, in
    order, each by its own `tool` message."""
    messages = list(row["messages"])
    with ToolSet.named(row.get("tools", [])).open(row) as tools:
        return _answer(messages, interceptor, tools, max_turns)


def conversation_harness(row: dict, interceptor: Interceptor, *, max_turns: int = 3,
                         user: Annotated[str, AfterValidator(USERS.check)] = "scripted",
                         user_model: UserModelSettings | None = None, max_tool_rounds: int = 4) -> str:
    """A conversation with a simulated user (`rollwire.producers.users`): the model answers the row's
    `messages` (calling the row's tools as the chat harness does, at most `max_tool_rounds` replies
    an answer), the user says the next message, and so on for `max_turns` answers or until the user
    ends it. `user` names a scripted user (`scripted` says the row's `user_turns`); `user_model`
    has another model play the user. The user's messages are environment tokens, never trained."""
    party = resolve_user(user, user_model)
    messages = list(row["messages"])
    answer = ""
    with ToolSet.named(row.get("tools", [])).open(row) as tools:
        for turn in range(max_turns):
            answer = _answer(messages, interceptor, tools, max_tool_rounds)
            said = party(row, messages) if turn + 1 < max_turns else None
            if said is None:
                break
            messages.append({"role": "user", "content": said})
    return answer


def _answer(messages: list[dict], interceptor: Interceptor, tools: ToolSet, rounds: int) -> str:
    """The model's replies to `messages` (extended in place) until one calls no tool, or `rounds`
    replies; each call is answered by its own `tool` message. Returns the last reply."""
    schemas = tools.schemas()
    reply = ""
    for _ in range(rounds):
        reply = interceptor.chat(messages, tools=schemas) if schemas else interceptor.chat(messages)
        messages.append({"role": "assistant", "content": reply})
        calls = parse_tool_calls(reply, interceptor.tool_call_format)
        if not calls:
            break
        messages += [{"role": "tool", "content": call.error or tools.call(call.name, call.arguments)}
                     for call in calls]
    return reply


HARNESSES: Registry[Harness] = Registry("harness")
"""Harnesses a taskset can name (`Taskset.harness`); `script_harness` is configured per worker."""
HARNESSES.add("completion", completion_harness)
HARNESSES.add("chat", chat_harness)
HARNESSES.add("conversation", conversation_harness)


def run_against_endpoint(command: list[str], server: InterceptionServer, interceptor: Interceptor,
                         env: Callable[[str], dict[str, str]], *, timeout_s: float,
                         what: str) -> subprocess.CompletedProcess:
    """Runs `command` with the rollout's own OpenAI-compatible URL (`env(url)` says under which
    variables) and no credential of ours in its environment (`agent_environment`), killing it past
    `timeout_s` (`HarnessTimeout`); every call it makes is recorded by `interceptor`. Shared by
    agent scripts and the subprocess runtime."""
    base_url = server.open(interceptor)
    try:
        return subprocess.run(command, env={**agent_environment(), **env(base_url)}, capture_output=True, text=True,
                              timeout=timeout_s, preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired as exc:
        raise HarnessTimeout(f"{what} ran past {timeout_s:g} s and was killed") from exc
    finally:
        server.close(base_url)


def script_harness(command: list[str], server: InterceptionServer, *, timeout_s: float = 120.0) -> Harness:
    """A harness that runs `command` as an unmodified agent against the rollout's endpoint."""
    def run(row: dict, interceptor: Interceptor) -> str:
        done = run_against_endpoint(command, server, interceptor, lambda url: {
            **agent_variables(url), "ROLLWIRE_TASK": json.dumps(row)},
            timeout_s=timeout_s, what="the agent")
        if done.returncode != 0:
            raise HarnessError(f"the agent exited with code {done.returncode}: {done.stderr[-500:]}")
        lines = done.stdout.strip().splitlines()
        return lines[-1] if lines else ""
    return run
