"""One environment of a run: a taskset, the harness its rollouts run, and where they run. A recipe
chooses them per environment, so that one run mixes environments with different harnesses and
runtimes; what an entry leaves out is the taskset's harness and the env worker's runtime.

    [[environments]]
    name = "calculator"
    harness = "chat"                      # completion, chat, or package.module:function
    harness_options = { max_turns = 8 }   # keyword options of the harness
    runtime = "subprocess"                # in-process, subprocess, container

    [[environments]]
    name = "math-word"
    agent_command = ["python3", "/agents/solve.py"]   # an agent program instead of a harness
    runtime = "container"
    container = { image = "local/python:3.11", mounts = ["/srv/agents:/agents"] }

Pairs that cannot work are refused when the recipe loads, with the reason (`EnvironmentSetup.check`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwire.core.errors import ConfigError
from rollwire.core.registry import check_options
from rollwire.producers.harnesses import HarnessError
from rollwire.producers.runtimes import resolve_harness
from rollwire.producers.sandbox import ContainerSettings
from rollwire.producers.tasksets import Taskset

RuntimeName = Literal["in-process", "subprocess", "container"]
ROW_HARNESSES = {"completion": "prompt", "chat": "messages", "conversation": "messages"}
"""Harnesses that read a field of the task row: a taskset's rows are written for one of them."""


class EnvironmentSetup(BaseModel):
    """How one environment's rollouts run; None everywhere: the taskset's harness, the worker's runtime."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    harness: str | None = None
    """`completion`, `chat`, `conversation`, or `package.module:function`; default: the taskset's own."""
    harness_options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the harness, e.g. `{ max_turns = 8 }` for chat; checked against it at load."""
    runtime: RuntimeName | None = None
    """Where its harness or agent runs; default: the env worker's (`[env_workers] runtime`)."""
    agent_command: list[str] | None = None
    """An unmodified agent program run for every rollout instead of a harness: it gets only an
    OpenAI base URL (and ROLLWIRE_TASK); the last line it prints is its answer."""
    container: ContainerSettings | None = None
    """With `runtime = "container"`: its image, mounts and limits; default: `[env_workers.container]`."""

    def is_default(self) -> bool:
        return self == EnvironmentSetup()

    def options_for(self, taskset: type[Taskset]) -> dict[str, Any]:
        """The harness's options: the taskset's own (when its harness runs) under this entry's."""
        own = taskset.harness_options if self.harness in (None, taskset.harness) else {}
        return {**own, **self.harness_options}

    def check(self, taskset: type[Taskset], name: str) -> None:
        """Raises `ConfigError` naming the fix for a pair that cannot work."""
        what = f"environment {name!r}"
        if self.harness is not None and self.agent_command is not None:
            raise ConfigError(f"{what}: give a harness or an agent_command, not both (the agent program is its harness)")
        if self.container is not None and self.runtime != "container":
            runtime = self.runtime or "left to the env worker"
            raise ConfigError(f"{what}: container settings need runtime = \"container\" (runtime is {runtime})")
        if self.agent_command is not None and not self.agent_command:
            raise ConfigError(f"{what}: agent_command is empty: give the program and its arguments")
        if self.agent_command is not None and self.harness_options:
            raise ConfigError(f"{what}: harness_options are for a harness; an agent_command takes its own arguments")
        try:
            harness = resolve_harness(self.harness or taskset.harness)
        except HarnessError as exc:
            raise ConfigError(f"{what}: {exc}") from None
        if self.options_for(taskset):
            check_options(f"{what}: harness {self.harness or taskset.harness!r}", harness, self.options_for(taskset),
                          skip=2)
        if self.harness is None:
            return
        wants, written_for = ROW_HARNESSES.get(self.harness), ROW_HARNESSES.get(taskset.harness)
        if wants and written_for and wants != written_for:
            raise ConfigError(f"{what}: the {self.harness} harness reads each row's `{wants}`, but taskset "
                              f"{taskset.name!r} writes rows for the {taskset.harness} harness (`{written_for}`): "
                              f"use harness = \"{taskset.harness}\", or a taskset with `{wants}` rows")


RolloutRunner = Callable[..., str]
"""`(row, interceptor, timeout_s) -> answer`: one rollout of an environment, as its setup says."""
