"""Runtimes run the same harness in process or in a subprocess; failures come back as harness errors.

The model here is a scripted interceptor (own code path only); the subprocess reaches it through
the real interception server over HTTP. The real-server check is in tests/inference/test_harnesses.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollwire.producers.harnesses import HarnessError, HarnessTimeout
from rollwire.producers.runtimes import InProcess, Subprocess, resolve_harness

DATA = Path(__file__).resolve().parent.parent / "data"


class ScriptedInterceptor:
    """Answers from a script and records what it was asked."""

    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    """What the interception server reports for each call."""
    tool_call_format = "hermes"

    def __init__(self, replies):
        self.replies, self.asked, self.finish_reason = list(replies), [], "stop"

    def _reply(self, asked):
        self.asked.append(asked)
        return self.replies.pop(0)

    def chat(self, messages):
        return self._reply([dict(m) for m in messages])

    def complete(self, prompt):
        return self._reply(prompt)


@pytest.fixture
def subprocess_runtime(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(DATA))
    runtime = Subprocess()
    yield runtime
    runtime.close()


def test_the_chat_harness_runs_unchanged_in_a_subprocess(subprocess_runtime):
    row = {"messages": [{"role": "user", "content": "6 times 7?"}]}
    model = ScriptedInterceptor(["CALL calculator(6*7)", "42"])
    assert subprocess_runtime.run("chat", row, model, timeout_s=60) == "42"
    assert model.asked[1][-2:] == [{"role": "assistant", "content": "CALL calculator(6*7)"},
                                   {"role": "tool", "content": "42"}]  # the tool ran in the child
    in_process = ScriptedInterceptor(["CALL calculator(6*7)", "42"])
    assert InProcess().run("chat", row, in_process, timeout_s=60) == "42" and in_process.asked == model.asked


def test_completions_reach_the_interceptor_through_the_endpoint(subprocess_runtime):
    model = ScriptedInterceptor(["abc"])
    assert subprocess_runtime.run("harnesses:echoes_completion", {"prompt": "<|bos|>r:123>"}, model,
                                  timeout_s=60) == "ABC"
    assert model.asked == ["<|bos|>r:123>"]


def test_a_hanging_harness_is_killed_and_a_raising_one_is_reported(subprocess_runtime):
    with pytest.raises(HarnessTimeout, match="ran past 2 s"):
        subprocess_runtime.run("harnesses:sleeps", {"seconds": 60}, ScriptedInterceptor([]), timeout_s=2)
    with pytest.raises(HarnessError, match="ValueError: the environment is broken"):
        subprocess_runtime.run("harnesses:raises", {}, ScriptedInterceptor([]), timeout_s=60)


def test_unknown_harness_references_say_what_is_accepted():
    with pytest.raises(HarnessError, match="completion"):
        resolve_harness("nope")
    with pytest.raises(HarnessError, match="cannot import"):
        resolve_harness("no_such_module:run")


def test_a_harness_subprocess_gets_none_of_our_credentials(subprocess_runtime, monkeypatch):
    secrets = ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "ROLLWIRE_FEEDBACK_TOKENS", "KAFKA_SASL_PASSWORD",
               "S3_SECRET_KEY_FILE", "HF_TOKEN"]
    for name in secrets + ["TOOL_SETTING"]:
        monkeypatch.setenv(name, "set-by-the-test")
    seen = subprocess_runtime.run("harnesses:sees_variables", {"names": [*secrets, "TOOL_SETTING", "PATH"]},
                                  ScriptedInterceptor([]), timeout_s=60)
    assert seen == "TOOL_SETTING,PATH"  # the agent's own settings pass, credentials do not


def test_the_container_runtime_without_a_docker_client_says_what_to_install():
    from rollwire.core.errors import ConfigError
    from rollwire.producers.sandbox import Container, ContainerSettings
    with pytest.raises(ConfigError, match="install Docker, or set \\[env_workers.container\\] docker"):
        Container(ContainerSettings(docker="no-such-docker-client"))
