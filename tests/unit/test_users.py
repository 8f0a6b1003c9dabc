"""The conversation harness and its simulated users, without a model server: a scripted user, a
user written in Python (the bundled higher-lower game), and a user played by a model behind a
scripted OpenAI-compatible server (`tests/scripted_server.py`). The harness against a real vLLM
server, with the user's tokens masked out of training, is in tests/inference/test_env_worker.py."""

from __future__ import annotations

import copy

import pytest
from scripted_server import ScriptedServer

from rollwire.core.errors import ConfigError
from rollwire.producers.environment import EnvironmentSetup
from rollwire.producers.environments.higher_lower import HigherLower, guess_of
from rollwire.producers.evaluate import evaluate
from rollwire.producers.harnesses import conversation_harness
from rollwire.producers.tasksets import check_taskset, load_taskset
from rollwire.producers.users import UserError


class Model:
    """Stands for the rollout's Interceptor: answers each chat call with `answer(messages)`, and keeps
    what each call was shown."""

    tool_call_format = "hermes"

    def __init__(self, answer) -> None:
        self.answer, self.shown = answer, []

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        self.shown.append([dict(m) for m in messages])
        return self.answer(messages)


class Bisecting:
    """An OpenAI-compatible endpoint (in process, as `evaluate` takes one) whose model plays
    higher-lower by bisection: it reads the user's "Higher."/"Lower." from the messages it is sent."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high, self.bodies = low, high, []

    def post(self, path: str, body: dict) -> dict:
        self.bodies.append(copy.deepcopy(body))  # as sent: the harness goes on appending to its messages
        low, high = self.low, self.high
        last_guess = None
        for m in body["messages"]:
            if m["role"] == "assistant":
                last_guess = int(m["content"])
            elif m["role"] == "user" and last_guess is not None:
                low, high = (last_guess + 1, high) if m["content"] == "Higher." else (low, last_guess - 1)
        return {"choices": [{"message": {"content": str((low + high) // 2)}, "finish_reason": "stop"}]}


def test_the_user_answers_each_guess_and_ends_the_conversation_when_it_is_right():
    taskset = load_taskset("higher-lower", seed=3, count=4)
    endpoint = Bisecting(1, 20)
    results = evaluate(taskset, endpoint, limit=4)

    assert [r.error for r in results] == [None] * 4
    assert [r.rewards["found"] for r in results] == [1.0] * 4, "bisection finds every secret"
    assert all(1 <= r.metrics["guesses"] <= 5 for r in results)
    secrets = {row["task_id"]: row["secret"] for row in taskset.rows()}
    assert [guess_of(r.completion) for r in results] == [secrets[r.task_id] for r in results]
    # the user's turns reached the model: each call after the first ends with "Higher." or "Lower."
    said = {b["messages"][-1]["content"] for b in endpoint.bodies if len(b["messages"]) > 2}
    assert said <= {"Higher.", "Lower."} and said


def test_a_wrong_reply_is_corrected_by_the_user_and_max_turns_bounds_the_conversation():
    row = next(iter(HigherLower(seed=1).rows()))
    model = Model(lambda messages: "no idea")
    answer = conversation_harness(row, model, user="higher-lower", max_turns=3)
    assert answer == "no idea" and len(model.shown) == 3
    assert model.shown[-1][-1] == {"role": "user", "content": "Reply with one whole number from 1 to 20."}


def test_the_scripted_user_says_the_rows_turns_in_order_then_ends():
    row = {"messages": [{"role": "user", "content": "Hi"}], "user_turns": ["My order is 42.", "Thanks!"]}
    model = Model(lambda messages: f"reply {sum(m['role'] == 'assistant' for m in messages) + 1}")
    assert conversation_harness(row, model, max_turns=5) == "reply 3"
    assert [m["content"] for m in model.shown[-1]] == ["Hi", "reply 1", "My order is 42.", "reply 2", "Thanks!"]
    short = Model(lambda messages: "ok")
    conversation_harness(row, short, max_turns=2)
    assert len(short.shown) == 2, "max_turns counts the model's answers"


def test_a_tool_call_inside_a_turn_is_answered_before_the_user_speaks():
    row = {"messages": [{"role": "user", "content": "What is 6*7?"}], "tools": ["calculator"],
           "user_turns": ["And doubled?"]}
    replies = iter(["CALL calculator(6*7)", "42", "CALL calculator(42*2)", "84"])
    model = Model(lambda messages: next(replies))
    assert conversation_harness(row, model, max_turns=2) == "84"
    assert [(m["role"], m["content"]) for m in model.shown[-1][1:]] == [
        ("assistant", "CALL calculator(6*7)"), ("tool", "42"), ("assistant", "42"), ("user", "And doubled?"),
        ("assistant", "CALL calculator(42*2)"), ("tool", "84")]


def test_a_model_plays_the_user_from_its_own_side_and_ends_with_the_done_marker():
    server = ScriptedServer(["Where is my order?", "Great, thanks [done]"])
    try:
        row = {"order": "A-17", "messages": [{"role": "system", "content": "You are support."},
                                             {"role": "user", "content": "Hello"}]}
        model = Model(lambda messages: "How can I help?")
        user_model = {"base_url": server.url, "model": "user", "persona": "You are a customer; order {order} is late."}
        conversation_harness(row, model, max_turns=5, user_model=user_model)
    finally:
        server.close()
    assert len(model.shown) == 2, "the second user reply said [done]: two answers"
    first = server.bodies[0]
    assert first["model"] == "user"
    assert first["messages"] == [{"role": "system", "content": "You are a customer; order A-17 is late."},
                                 {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "How can I help?"}]
    assert server.bodies[1]["messages"][-2:] == [{"role": "assistant", "content": "Where is my order?"},
                                                 {"role": "user", "content": "How can I help?"}]


def test_a_user_model_that_fails_makes_the_rollout_an_error_with_every_reason():
    server = ScriptedServer([503, 503])
    try:
        row = next(iter(HigherLower(seed=1).rows()))
        with pytest.raises(UserError, match=r"did not answer: try 1: .*503.*; try 2: .*503"):
            conversation_harness(row, Model(lambda m: "5"), user_model={"base_url": server.url, "model": "u",
                                                                          "retries": 1})
        with pytest.raises(UserError, match="the persona names 'order'"):
            conversation_harness(row, Model(lambda m: "5"), user_model={"base_url": server.url, "model": "u",
                                                                          "persona": "order {order}"})
    finally:
        server.close()


def test_options_are_checked_at_load_and_the_recipe_overrides_the_tasksets_own(tmp_path):
    with pytest.raises(ConfigError, match="unknown simulated user 'higher-lowr'.*did you mean 'higher-lower'"):
        EnvironmentSetup(harness_options={"user": "higher-lowr"}).check(HigherLower, "hl")
    with pytest.raises(ConfigError, match="needs option 'user_model.model'"):
        EnvironmentSetup(harness_options={"user_model": {"base_url": "http://x/v1"}}).check(HigherLower, "hl")
    assert EnvironmentSetup(harness_options={"max_turns": 2}).options_for(HigherLower) == {
        "user": "higher-lower", "max_turns": 2}
    assert EnvironmentSetup(harness="chat").options_for(HigherLower) == {}, "another harness: not its options"

    broken = tmp_path / "broken.py"
    broken.write_text("from rollwire.producers.environments.higher_lower import HigherLower\n\n"
                      "class Broken(HigherLower):\n    name = 'broken'\n    harness_options = {'turns': 3}\n")
    with pytest.raises(ConfigError, match="its harness_options for the conversation harness has no option 'turns'"):
        check_taskset(f"{broken}:Broken", {})
