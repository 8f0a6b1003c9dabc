"""The chat harness's tool loop and the calculator, with a scripted model (own code path only;
the real-server checks are in tests/inference/test_harnesses.py)."""

from __future__ import annotations

from rollwire.producers.harnesses import chat_harness
from rollwire.producers.tools import calculator


class ScriptedModel:
    tool_call_format = "hermes"

    def __init__(self, replies):
        self.replies, self.seen = list(replies), []

    def chat(self, messages):
        self.seen.append([dict(m) for m in messages])
        return self.replies.pop(0)


def test_tool_calls_are_answered_as_tool_messages_until_the_model_answers():
    model = ScriptedModel(["Let me compute. CALL calculator(6*7)", "The answer is 42"])
    answer = chat_harness({"messages": [{"role": "user", "content": "6 times 7?"}]}, model)
    assert answer == "The answer is 42"
    assert model.seen[1][-2:] == [{"role": "assistant", "content": "Let me compute. CALL calculator(6*7)"},
                                  {"role": "tool", "content": "42"}]


def test_unknown_tools_and_bad_expressions_answer_with_an_error_the_model_can_read():
    model = ScriptedModel(["CALL search(cats)", "CALL calculator(import os)", "done"])
    assert chat_harness({"messages": [{"role": "user", "content": "?"}]}, model) == "done"
    assert model.seen[1][-1]["content"].startswith("error: no tool 'search'")
    assert model.seen[2][-1]["content"].startswith("error:")
    assert calculator("(1+2)*4/3") == "4" and calculator("1/0").startswith("error")


def test_the_loop_stops_after_max_turns():
    model = ScriptedModel(["CALL calculator(1)"] * 5)
    assert chat_harness({"messages": []}, model, max_turns=3) == "CALL calculator(1)" and len(model.seen) == 3
