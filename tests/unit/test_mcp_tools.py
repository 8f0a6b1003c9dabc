"""Tools from a real MCP server (`tests/data/mcp_counter.py`, served by the `mcp` package over
stdio): its schemas reach the model, calls and their errors come back as text, a shared server
keeps its state across rollouts while one per rollout starts fresh and is stopped after it, and
references find the same tools in another process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from rollwire.core.errors import ConfigError
from rollwire.producers.harnesses import chat_harness
from rollwire.producers.mcp_tools import McpServer
from rollwire.producers.tasksets import load_taskset
from rollwire.producers.tools import ToolSet, offered_tools

TASKS = Path(__file__).resolve().parent.parent / "data" / "mcp_tasks.py"


@pytest.fixture(scope="module")
def counting():
    return load_taskset(f"{TASKS}:Counting")


def servers() -> int:
    """MCP counter servers running under this process."""
    return sum("mcp_counter.py" in " ".join(p.cmdline()) for p in psutil.Process().children(recursive=True))


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


class Model:
    """Stands for the rollout's Interceptor: says `replies` in order, keeps what it was shown."""

    tool_call_format = "hermes"

    def __init__(self, *replies: str) -> None:
        self.replies, self.shown = list(replies), []

    def chat(self, messages, tools=None):
        self.shown.append(([dict(m) for m in messages], tools))
        return self.replies.pop(0)


def test_the_servers_tools_reach_the_model_with_their_own_schemas(counting):
    schemas = {s["function"]["name"]: s["function"] for s in ToolSet.named(type(counting).tools).schemas()}
    assert sorted(schemas) == ["add", "bump", "fail", "own_add", "own_bump", "own_fail"]
    assert schemas["add"]["description"] == "Adds two whole numbers."
    assert schemas["add"]["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert schemas["add"]["parameters"]["required"] == ["a", "b"]


def test_calls_and_their_failures_come_back_to_the_model_as_text(counting):
    model = Model(call("add", a=2, b=3) + call("add", a="two") + call("fail", reason="no disk"), "5")
    row = {"messages": [{"role": "user", "content": "2+3?"}], "tools": offered_tools({}, type(counting).tools)}
    assert chat_harness(row, model) == "5"
    results = [m["content"] for m in model.shown[-1][0] if m["role"] == "tool"]
    assert results[0] == "5"
    assert results[1].startswith("error: add failed: McpError:") and "a" in results[1] and "b" in results[1]
    assert results[2].startswith("error: fail failed: McpError:")
    assert {t["function"]["name"] for t in model.shown[0][1]} >= {"add", "own_bump"}


def test_a_shared_server_keeps_its_state_and_one_per_rollout_starts_fresh_and_stops(counting):
    tools = type(counting).tools
    before = servers()
    seen = []
    for _ in range(2):
        with ToolSet.named(tools).open({}) as rollout:
            assert servers() == before + 1, "this rollout's own server runs beside the shared one"
            seen.append((rollout.call("bump", {}), rollout.call("own_bump", {})))
        assert servers() == before, "the rollout's server is stopped after it"
    shared, own = zip(*seen)
    assert int(shared[1].split()[1]) == int(shared[0].split()[1]) + 1, "the shared server counts on"
    assert own == ("count 1", "count 1"), "each rollout's server starts at nothing"


def test_references_find_the_same_tools_in_another_process(counting):
    references = offered_tools({"tools": ["add", "own_bump"]}, type(counting).tools)
    assert references == [f"{TASKS}:Counter#add", f"{TASKS}:OwnCounter#own_bump"]
    child = ("import sys, json\nfrom rollwire.producers.tools import ToolSet\n"
             "with ToolSet.named(json.loads(sys.argv[1])).open({}) as t:\n"
             "    print(t.call('add', {'a': 20, 'b': 22}), t.call('own_bump', {}))\n")
    done = subprocess.run([sys.executable, "-c", child, json.dumps(references)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["42", "count", "1"]


def test_a_server_that_does_not_start_names_its_command_and_what_it_printed(tmp_path):
    script = tmp_path / "broken_server.py"
    script.write_text("import sys\nprint('cannot open the database', file=sys.stderr)\nsys.exit(3)\n")

    class Broken(McpServer):
        command = [sys.executable, str(script)]
        startup_timeout_s = 30

    with pytest.raises(ConfigError, match="broken_server.py did not start.*cannot open the database"):
        Broken.tools()

    class Commandless(McpServer):
        pass

    with pytest.raises(ConfigError, match="has no command"):
        Commandless.tools()
