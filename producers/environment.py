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
from rollwire.producers.harnesses import HarnessError, script_harness
from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.runtimes import RUNTIMES, Runtime, resolve_harness
from rollwire.producers.sandbox import Container, ContainerSettings
from rollwire.producers.tasksets import Taskset
from rollwire.producers.tools import offered_tools

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
    branches: Literal["main", "all"] = "main"
    """Which of a rollout's token sequences are trained when its calls do not all extend one sequence
    (a chat template that rewrites history: Qwen3 drops earlier reasoning): `main`, the first call's
    line only; `all`, every line, each with the rollout's advantage (`producers/assembly.py`). Either
    way the rollout's metrics count the calls off the main line and the tokens left untrained."""

    def is_default(self) -> bool:
        return self == EnvironmentSetup()

    @property
    def trains_branches(self) -> bool:
        return self.branches == "all"

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


RolloutRunner = Callable[[dict, Any, float], str]
"""`(row, interceptor, timeout_s) -> answer`: one rollout of an environment, as its setup says. The
interceptor is a rollout's `Interceptor` in training, an `EvalClient` in `rollwire eval`."""


class Runners:
    """How each environment's rollouts run, from its setup over defaults: the harness in its
    runtime, or an agent program (a subprocess, or in a container). Env workers and `rollwire
    eval` both run rollouts through this, so an evaluation runs the environment training runs.
    Runtimes are made when an environment first needs one, one per distinct setting, and held
    until `close`."""

    def __init__(self, *, runtime: RuntimeName = "in-process", container: ContainerSettings | None = None,
                 timeout_s: float = 300.0) -> None:
        self.runtime, self.container, self.timeout_s = runtime, container or ContainerSettings(), timeout_s
        self._runtimes: dict[str, Runtime] = {}
        self._agent_server: InterceptionServer | None = None

    def runtime_for(self, name: RuntimeName, container: ContainerSettings | None = None) -> Runtime:
        container = container or self.container
        key = name + (container.model_dump_json() if name == "container" else "")
        if key not in self._runtimes:
            self._runtimes[key] = Container(container) if name == "container" else RUNTIMES[name]()
        return self._runtimes[key]

    def runner(self, taskset: Taskset, setup: EnvironmentSetup | None = None) -> tuple[RolloutRunner, float]:
        """`taskset`'s rollouts as `setup` says; with how long past a rollout's time limit its runtime
        may take to end it itself (the caller's watchdog waits that much longer)."""
        setup = setup or EnvironmentSetup()
        runtime_name = setup.runtime or self.runtime
        container = setup.container or self.container
        if setup.agent_command and runtime_name != "container":
            if self._agent_server is None:
                self._agent_server = InterceptionServer()
            agent = script_harness(setup.agent_command, self._agent_server, timeout_s=self.timeout_s)
            return (lambda row, interceptor, timeout_s: agent(row, interceptor)), 0.0
        if setup.agent_command:  # the agent program runs in each rollout's container
            container = container.model_copy(update={"command": setup.agent_command})
        runtime = self.runtime_for(runtime_name, container)
        harness, options, offered = setup.harness or taskset.harness, setup.options_for(type(taskset)), type(taskset).tools

        def run(row: dict, interceptor: Any, timeout_s: float) -> str:
            task = {**row, "tools": offered_tools(row, offered)} if offered else row
            return runtime.run(harness, task, interceptor, timeout_s=timeout_s, options=options)
        return run, runtime.watchdog_grace_s

    def close(self) -> None:
        for runtime in self._runtimes.values():
            runtime.close()
        self._runtimes.clear()
        if self._agent_server is not None:
            self._agent_server.shutdown()
            self._agent_server = None
