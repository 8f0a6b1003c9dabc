"""Tools a taskset brings (`rollwire.producers.tools`): schemas written from signatures and
docstrings, typed multi-argument calls, errors the model reads, per-rollout toolbox state that
never reaches the model, `max_turns` as a harness option, and the same tools found by a harness in
a subprocess. The model is scripted (own code path); a model calling a tool on a real vLLM server
through the env worker is tests/inference/test_env_worker.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollwire.core.errors import ConfigError
from rollwire.producers.environment import EnvironmentSetup
from rollwire.producers.harnesses import chat_harness
from rollwire.producers.runtimes import InProcess, Subprocess
from rollwire.producers.tasksets import check_taskset, load_taskset
from rollwire.producers.tools import TOOLS, Tool, Toolbox, ToolSet, offered_tools, tool

SHOP = str(Path(__file__).resolve().parents[2] / "examples" / "environments" / "shop.py")


class ScriptedModel:
    """Answers from a script; records each call's messages and the tool schemas it was shown."""

    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    tool_call_format = "hermes"
    """What the interception server reports for each call."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.seen, self.shown, self.finish_reason = list(replies), [], [], "stop"

    def chat(self, messages, tools=None):
        self.seen.append([dict(m) for m in messages])
        self.shown.append(tools)
        return self.replies.pop(0)


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def test_the_schema_is_written_from_the_signature_and_the_docstring():
    def search(query: str, limit: int = 3, tags: list[str] | None = None, exact: bool = False) -> str:
        """Searches the catalogue for products.

        Args:
            query: words to look for,
                any number of them
            limit (int): how many results
        """
        return query

    schema = Tool.of(search).schema["function"]
    assert schema["name"] == "search" and schema["description"] == "Searches the catalogue for products."
    properties = schema["parameters"]["properties"]
    assert properties["query"] == {"type": "string", "description": "words to look for, any number of them"}
    assert properties["limit"] == {"type": "integer", "default": 3, "description": "how many results"}
    assert properties["tags"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert properties["exact"] == {"type": "boolean", "default": False}
    assert schema["parameters"]["required"] == ["query"]


def test_arguments_are_converted_and_a_wrong_call_or_a_failing_tool_is_an_error_the_model_reads():
    def repeat(text: str, times: int) -> list[str]:
        """Repeats a text."""
        if times > 3:
            raise ValueError("at most 3 times")
        return [text] * times

    tools = ToolSet([Tool.of(repeat)])
    assert tools.call("repeat", {"text": "a", "times": "2"}) == '["a", "a"]'  # "2" converted; a list sent as JSON
    assert tools.call("repeat", {"text": "a"}) == "error: repeat: needs argument 'times' (it takes text, times)"
    assert tools.call("repeat", {"text": "a", "times": "x"}).startswith("error: repeat: argument 'times': Input should")
    assert tools.call("repeat", {"text": "a", "times": 1, "loud": True}).startswith("error: repeat: has no argument 'loud'")
    assert tools.call("repeat", {"text": "a", "times": 9}) == "error: repeat failed: ValueError: at most 3 times"
    assert tools.call("search", {}) == "error: no tool 'search'; the tools are repeat"
    assert tools.call("repeat", "abc").startswith("error: repeat: needs argument 'times'")  # CALL repeat(abc)
    assert tools.call("calculator", "6*7") == "42"  # a built-in is callable wherever a prompt teaches CALL


def test_a_toolbox_keeps_each_rollouts_state_apart_hides_it_from_the_model_and_is_torn_down():
    closed = []

    class Notes(Toolbox):
        def setup(self, row: dict) -> None:
            self.owner, self.notes = row["task_id"], []

        def teardown(self) -> None:
            closed.append((self.owner, self.notes))

        @tool
        def note(self, text: str) -> str:
            """Keeps a note."""
            self.notes.append(text)
            return f"{len(self.notes)} notes"

    (schema,) = ToolSet.named([Notes]).schemas()
    assert schema["function"]["parameters"]["properties"] == {"text": {"type": "string"}}  # no `self`, no state
    first, second = ToolSet.named([Notes]).open({"task_id": "a"}), ToolSet.named([Notes]).open({"task_id": "b"})
    assert first.call("note", {"text": "x"}) == "1 notes" and first.call("note", {"text": "y"}) == "2 notes"
    assert second.call("note", {"text": "z"}) == "1 notes"
    first.close(), second.close()
    assert closed == [("a", ["x", "y"]), ("b", ["z"])]

    model = ScriptedModel([call("note", text="q")])
    model.chat = lambda messages, tools=None: (_ for _ in ()).throw(RuntimeError("the model went away"))
    with pytest.raises(RuntimeError, match="went away"):  # torn down even when the rollout fails
        chat_harness({"task_id": "c", "messages": [], "tools": [Notes]}, model)
    assert closed[-1] == ("c", [])


def test_the_chat_harness_calls_tools_with_several_arguments_and_stops_at_max_turns():
    def add(a: int, b: int) -> int:
        """Adds two numbers."""
        return a + b

    model = ScriptedModel([call("add", a=2, b="40"), "42"])
    assert chat_harness({"messages": [{"role": "user", "content": "2+40?"}], "tools": [add]}, model) == "42"
    assert model.seen[1][-1] == {"role": "tool", "content": "42"}
    assert model.shown[0] == [Tool.of(add).schema]

    looping = ScriptedModel([call("add", a=1, b=1)] * 9)
    assert chat_harness({"messages": [], "tools": [add]}, looping, max_turns=6).startswith("<tool_call>")
    assert len(looping.seen) == 6


def test_a_tasksets_tools_are_offered_as_references_each_row_its_own():
    shop = load_taskset(f"{SHOP}:Shop")
    every, only_price = (offered_tools(row, type(shop).tools) for row in shop.rows())
    assert every == [f"{SHOP}:price", f"{SHOP}:Cart#add", f"{SHOP}:Cart#total"]
    assert only_price == [f"{SHOP}:price"]
    assert [t.name for t in ToolSet.named(every).tools.values()] == ["price", "add", "total"]
    assert offered_tools({"tools": ["calculator"]}, [shop.tools[0]]) == ["calculator"]  # a built-in by name
    with pytest.raises(ConfigError, match="toolbox .* has no tool 'pay'; it has add, total"):
        ToolSet.named([f"{SHOP}:Cart#pay"])
    with pytest.raises(ConfigError, match="unknown tool 'calculater'.*did you mean 'calculator'"):
        ToolSet.named(["calculater"])
    assert "calculator" in TOOLS


def test_a_harness_in_a_subprocess_finds_the_tasksets_tools_and_keeps_each_carts_state(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("SHOP_LEDGER", str(ledger))
    shop = load_taskset(f"{SHOP}:Shop")
    row = next(iter(shop.rows()))
    row = {**row, "tools": offered_tools(row, type(shop).tools)}
    replies = [call("add", item="pear", quantity=2), call("total"), call("price", item="kiwi"), "1.5"]
    runtime = Subprocess()
    try:
        model = ScriptedModel(list(replies))
        assert runtime.run("chat", row, model, timeout_s=60, options={"max_turns": 5}) == "1.5"
    finally:
        runtime.close()
    tool_messages = [m["content"] for m in model.seen[-1] if m["role"] == "tool"]
    assert tool_messages == ["2 items in the cart", "1.5",
                             "error: price failed: KeyError: \"no 'kiwi' in the shop; it sells apple, pear, melon\""]
    assert [t["function"]["name"] for t in model.shown[0]] == ["price", "add", "total"]  # rendered in the child too
    in_process = ScriptedModel(list(replies))
    assert InProcess().run("chat", row, in_process, timeout_s=60, options={"max_turns": 5}) == "1.5"
    assert in_process.seen == model.seen
    carts = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert carts == [{"owner": "shop-0", "items": ["pear", "pear"]}] * 2  # torn down in each process


def test_harness_options_are_checked_against_the_harness_when_the_recipe_loads():
    shop = type(load_taskset(f"{SHOP}:Shop"))
    EnvironmentSetup(harness_options={"max_turns": 8}).check(shop, "shop")
    with pytest.raises(ConfigError, match="harness 'chat' has no option 'max_turn' \\(did you mean 'max_turns'\\?\\)"):
        EnvironmentSetup(harness_options={"max_turn": 8}).check(shop, "shop")
    with pytest.raises(ConfigError, match="option 'max_turns'"):
        EnvironmentSetup(harness_options={"max_turns": "many"}).check(shop, "shop")
    with pytest.raises(ConfigError, match="harness_options are for a harness"):
        EnvironmentSetup(agent_command=["python3", "agent.py"], harness_options={"max_turns": 2}).check(shop, "shop")


def test_a_tasksets_tools_are_checked_when_it_loads(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("from rollwire.producers.tasksets import Taskset\n\n"
                      "class Broken(Taskset):\n    name = 'broken'\n    harness = 'chat'\n"
                      "    tools = ['calculater']\n\n    def rows(self):\n        return iter(())\n")
    with pytest.raises(ConfigError, match="taskset .*broken.py:Broken: its tools: unknown tool 'calculater'"):
        check_taskset(f"{broken}:Broken", {})
