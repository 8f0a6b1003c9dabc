"""Each environment of a recipe chooses its harness and runtime; pairs that cannot work are refused
when the recipe loads, each with the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rollwire.producers.environment import EnvironmentSetup
from rollwire.run.recipe import EnvironmentRecipe


def test_an_entry_chooses_its_harness_and_runtime_and_leaves_the_rest_to_the_defaults():
    calculator = EnvironmentRecipe(name="calculator", runtime="subprocess", options={"seed": 2})
    assert calculator.setup() == EnvironmentSetup(runtime="subprocess")
    assert EnvironmentRecipe(name="reverse-digits").setup().is_default()
    agent = EnvironmentRecipe(name="math-word", agent_command=["python3", "/agents/solve.py"], runtime="container",
                              container={"image": "local/python:3.11", "mounts": ["/tmp:/agents"]},
                              options={"path": __file__})
    assert agent.setup().container.mounts == ["/tmp:/agents"] and agent.setup().agent_command[0] == "python3"


def test_a_mounts_relative_host_path_is_taken_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "agents").mkdir()
    monkeypatch.chdir(tmp_path)
    entry = EnvironmentRecipe(name="math-word", agent_command=["python3", "/agents/solve.py"], runtime="container",
                              container={"mounts": ["agents:/agents"]}, options={"path": __file__})
    assert entry.container.mounts == [f"{tmp_path / 'agents'}:/agents"]
    with pytest.raises(ValidationError, match=f"{tmp_path / 'agent'} does not exist here"):
        EnvironmentRecipe(name="math-word", agent_command=["a"], runtime="container",
                          container={"mounts": ["agent:/agents"]}, options={"path": __file__})
    with pytest.raises(ValidationError, match="write it as host/path:/container/path"):
        EnvironmentRecipe(name="math-word", agent_command=["a"], runtime="container",
                          container={"mounts": ["agents"]}, options={"path": __file__})


@pytest.mark.parametrize(("entry", "message"), [
    ({"name": "reverse-digits", "harness": "chat"},
     "the chat harness reads each row's `messages`, but taskset 'reverse-digits' writes rows for the completion "
     "harness .* use harness = \"completion\""),
    ({"name": "calculator", "harness": "chat", "agent_command": ["a"]}, "give a harness or an agent_command, not both"),
    ({"name": "calculator", "container": {"image": "x"}}, "container settings need runtime = \"container\""),
    ({"name": "calculator", "harness": "chatt"}, "unknown harness 'chatt'.*did you mean 'chat'"),
    ({"name": "calculator", "harness": "no_such_module:run"}, "cannot import harness 'no_such_module:run'"),
    ({"name": "calculator", "agent_command": []}, "agent_command is empty"),
    ({"name": "calculator", "runtime": "docker"}, "runtime\n  Input should be 'in-process', 'subprocess' or 'container'"),
])
def test_a_pair_that_cannot_work_is_refused_with_the_fix(entry, message):
    with pytest.raises(ValidationError, match=message):
        EnvironmentRecipe(**entry)
