"""`rollwire eval` runs an environment as training does: the harness with the taskset's tools and
the harness options, then the taskset's judge; only the model's calls go to the endpoint. The
endpoint is scripted here (own code path); tests/inference/test_eval.py runs a real vLLM server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rollwire.producers.environment import EnvironmentSetup
from rollwire.producers.evaluate import EndpointError, evaluate
from rollwire.producers.tasksets import load_taskset

SHOP = str(Path(__file__).resolve().parents[2] / "examples" / "environments" / "shop.py")


class ScriptedEndpoint:
    """Answers each POST from a script, as an OpenAI-compatible server would; records the bodies."""

    def __init__(self, replies: list[str | Exception]) -> None:
        self.replies, self.bodies = list(replies), []

    def post(self, path: str, body: dict) -> dict:
        self.bodies.append((path, body))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        choice = {"message": {"role": "assistant", "content": reply}} if path == "/chat/completions" else {"text": reply}
        return {"choices": [{**choice, "finish_reason": "stop"}], "usage": {"completion_tokens": len(reply)}}


def call(name: str, **arguments) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def test_a_tool_environment_is_evaluated_with_its_tools_its_harness_options_and_its_judge(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOP_LEDGER", str(tmp_path / "ledger.jsonl"))
    shop = load_taskset(f"{SHOP}:Shop")
    endpoint = ScriptedEndpoint([call("add", item="pear", quantity=2), call("total"), "It costs 1.5"])
    [result] = evaluate(shop, endpoint, limit=1, max_tokens=32, setup=EnvironmentSetup(harness_options={"max_turns": 3}))

    assert result.error is None and result.completion == "It costs 1.5"
    assert result.rewards == {"said_a_number": 1.0} and result.reward == 1.0
    paths, bodies = zip(*endpoint.bodies)
    assert paths == ("/chat/completions",) * 3 and all(b["max_tokens"] == 32 for b in bodies)
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == ["price", "add", "total"]
    assert [m["content"] for m in bodies[2]["messages"] if m["role"] == "tool"] == ["2 items in the cart", "1.5"]
    assert json.loads((tmp_path / "ledger.jsonl").read_text()) == {"owner": "shop-0", "items": ["pear", "pear"]}

    capped = ScriptedEndpoint([call("total")] * 5)
    [looped] = evaluate(shop, capped, limit=1, setup=EnvironmentSetup(harness_options={"max_turns": 2}))
    assert len(capped.bodies) == 2 and looped.rewards == {"said_a_number": 0.0}


def test_an_endpoint_error_or_a_failing_harness_is_that_answers_error_and_the_rest_are_scored(tmp_path):
    rows = tmp_path / "rows.py"
    rows.write_text("from rollwire.producers.tasksets import Taskset, reward\n\n"
                    "class Echo(Taskset):\n    name = 'echo'\n\n    def rows(self):\n"
                    "        return iter([{'task_id': str(i), 'prompt': str(i)} for i in range(3)])\n\n"
                    "    @reward('echoed')\n    def echoed(self, r):\n        return float(r.completion == r.task['prompt'])\n\n"
                    "def broken(row, model):\n    raise ValueError('the harness is broken')\n")
    echo = load_taskset(f"{rows}:Echo")
    endpoint = ScriptedEndpoint(["0", EndpointError("HTTP 503: overloaded"), "2"])
    results = evaluate(echo, endpoint, limit=3, concurrency=1)
    assert [(r.task_id, r.reward, r.error) for r in results] == [("0", 1.0, None), ("1", 0.0, "HTTP 503: overloaded"),
                                                                 ("2", 1.0, None)]
    [failed] = evaluate(echo, ScriptedEndpoint([]), limit=1, setup=EnvironmentSetup(harness=f"{rows}:broken"))
    assert failed.error == "ValueError: the harness is broken"


def test_the_eval_command_takes_the_harness_and_its_options_checked_as_a_recipe_would(capsys):
    from rollwire.cli import main
    assert main(["eval", f"{SHOP}:Shop", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "-n", "1",
                 "--harness-option", "max_turn=3"]) == 2
    assert "harness 'chat' has no option 'max_turn' (did you mean 'max_turns'?)" in capsys.readouterr().err
    assert main(["eval", f"{SHOP}:Shop", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "-n", "1",
                 "--harness", "completion"]) == 2
    assert "the completion harness reads each row's `prompt`" in capsys.readouterr().err


AGENT = Path(__file__).resolve().parents[1] / "data" / "agent.py"


def test_an_agent_programs_environment_is_evaluated_by_running_the_program_against_the_endpoint(tmp_path):
    """The agent (an OpenAI client, two chat calls) runs in a subprocess, as its training rollouts
    would, and reaches the evaluated endpoint through the rollout's URL; the judge scores its answer."""
    rows = tmp_path / "asks.py"
    rows.write_text("from rollwire.producers.tasksets import Taskset, reward\n\n"
                    "class Asks(Taskset):\n    name = 'asks'\n    harness = 'chat'\n\n    def rows(self):\n"
                    "        return iter([{'task_id': 'q', 'messages': [], 'question': 'What is 6 times 7?'}])\n\n"
                    "    @reward('said_42')\n    def said_42(self, r):\n        return float('42' in r.completion)\n")
    endpoint = ScriptedEndpoint(["Let me use the tool.", "It is 42."])
    [result] = evaluate(load_taskset(f"{rows}:Asks"), endpoint, limit=1,
                        setup=EnvironmentSetup(agent_command=[sys.executable, str(AGENT)], runtime="subprocess"))
    assert result.error is None and result.completion == "It is 42." and result.rewards == {"said_42": 1.0}
    asked = [body["messages"] for _, body in endpoint.bodies]
    assert asked[0] == [{"role": "user", "content": "What is 6 times 7?"}] and asked[1][-1]["content"] == "42"


def test_a_seed_gives_each_answer_its_own_seeds_and_the_same_ones_every_time():
    echo = load_taskset("reverse-digits", count=2)

    def seeds(seed, samples=2):
        endpoint = ScriptedEndpoint(["1"] * 4)
        evaluate(echo, endpoint, limit=2, samples=samples, seed=seed, concurrency=1, temperature=1.0)
        return sorted(body["seed"] for _, body in endpoint.bodies)

    first = seeds(7)
    assert first == seeds(7) and len(set(first)) == 4  # repeatable, and no two answers share a seed
    assert set(first).isdisjoint(seeds(8))
    endpoint = ScriptedEndpoint(["1"])
    evaluate(echo, endpoint, limit=1)
    assert "seed" not in endpoint.bodies[0][1]  # unseeded unless asked
