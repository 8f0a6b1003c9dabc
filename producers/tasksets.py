"""Tasksets: task rows plus the reward and metric functions that judge a rollout on them.

    class ReverseDigits(Taskset):
        name = "reverse-digits"
        def rows(self): ...                       # dicts with a stable "task_id"
        @reward("exact_match", weight=1.0)
        def exact_match(self, r: RolloutView) -> float: ...
        @metric("length")
        def length(self, r: RolloutView) -> float: ...

Rewards and metrics are plain functions of a `RolloutView`; the rollout's reward is the weighted
sum of its rewards. A function that raises does not stop the worker: `judge` reports it as the
rollout's error (`kind="reward"`), and the rollout is published errored, never trained.
Group rewards (functions of the whole group) are named here and applied by the scorer
(`rollwire.streams.group_rewards`).
"""

from __future__ import annotations

import inspect
import json
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rollwire.core.errors import ConfigError
from rollwire.core.registry import Registry, check_options
from rollwire.schemas.rollout import RolloutError


@dataclass(frozen=True)
class RolloutView:
    """What reward and metric functions see of a finished rollout."""

    task: dict[str, Any]
    """The task row."""
    completion: str
    """The final assistant text (the last message the model wrote)."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The whole conversation, as chat messages."""
    completion_tokens: int = 0
    """Tokens the model sampled over the rollout."""
    finish_reason: str | None = None
    """Why the last call stopped (`stop`, `length`, …)."""
    sandbox: dict[str, Any] | None = None
    """What the grading command in the rollout's container reported (`[env_workers.container]
    grade_command`): `returncode`, `stdout`, `stderr`, `timed_out`; None without one."""


def reward(name: str, weight: float = 1.0) -> Callable:
    """Marks a taskset method as a reward function with `weight` in the rollout's reward."""
    def mark(fn: Callable) -> Callable:
        fn.__rollwire_reward__ = (name, weight)  # type: ignore[attr-defined]
        return fn
    return mark


def metric(name: str) -> Callable:
    """Marks a taskset method as a metric: recorded, never rewarded."""
    def mark(fn: Callable) -> Callable:
        fn.__rollwire_metric__ = name  # type: ignore[attr-defined]
        return fn
    return mark


@dataclass(frozen=True)
class Judgement:
    rewards: dict[str, float]
    reward: float
    metrics: dict[str, float]
    error: RolloutError | None = None


class Taskset(ABC):
    """Task rows and how to judge rollouts on them."""

    name: ClassVar[str]
    harness: ClassVar[str] = "completion"
    """How the model works on it: `completion` (rows have `prompt`), `chat` or `conversation` (rows
    have `messages`), or a reference to a harness of its own."""
    harness_options: ClassVar[dict[str, Any]] = {}
    """Options of its own harness, e.g. `{"user": "higher-lower", "max_turns": 6}` for a conversation;
    a recipe's `harness_options` override them (and replace them when it names another harness)."""
    group_rewards: ClassVar[list[dict[str, Any]]] = []
    """Group rewards the scorer applies to this taskset's groups, e.g. `[{"name": "shortest_correct"}]`."""
    tools: ClassVar[list[Any]] = []
    """Tools its chat rollouts may call (`rollwire.producers.tools`): functions, `Toolbox` classes,
    tool names or references. A row's `tools` names which of them it offers; a row without, all."""

    @abstractmethod
    def rows(self) -> Iterator[dict[str, Any]]:
        """Task rows, each with a stable `task_id`."""

    def task_text(self, row: dict[str, Any]) -> str:
        """What `row` asks, as text, for judges that compare answers (a pairwise group reward): its
        `question`, else its last user message, else its `prompt`. Override for other rows."""
        if isinstance(row.get("question"), str):
            return row["question"]
        users = [m.get("content") for m in row.get("messages") or [] if m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
        return str(row.get("prompt", ""))

    def demonstration(self, row: dict[str, Any], rng: random.Random) -> str:
        """A scripted teacher's completion for `row` (for supervised warm starts); optional."""
        raise ConfigError(f"taskset {self.name!r} has no scripted teacher (a `demonstration` method); "
                          "it cannot be used for a warm start")

    def reward_functions(self) -> dict[str, tuple[Callable[[RolloutView], float], float]]:
        return {fn.__rollwire_reward__[0]: (fn, fn.__rollwire_reward__[1])
                for fn in self._marked("__rollwire_reward__")}

    def metric_functions(self) -> dict[str, Callable[[RolloutView], float]]:
        return {fn.__rollwire_metric__: fn for fn in self._marked("__rollwire_metric__")}

    def _marked(self, attribute: str) -> list[Any]:
        return [getattr(self, n) for n in dir(type(self)) if hasattr(getattr(type(self), n, None), attribute)]

    def judge(self, view: RolloutView) -> Judgement:
        """Runs every reward and metric; a failing or non-finite one makes the rollout errored."""
        functions = self.reward_functions()
        try:
            rewards = {name: _call(name, fn, view) for name, (fn, _) in functions.items()}
            metrics = {name: _call(name, fn, view) for name, fn in self.metric_functions().items()}
        except _FunctionFailed as exc:
            return Judgement({}, 0.0, {}, RolloutError(kind="reward", message=str(exc)))
        return Judgement(rewards, sum(functions[n][1] * v for n, v in rewards.items()), metrics)


class _FunctionFailed(Exception):
    pass


def _call(name: str, fn: Callable[[RolloutView], float], view: RolloutView) -> float:
    try:
        value = float(fn(view))
    except Exception as exc:  # a user-written function: report it on the rollout, keep working
        raise _FunctionFailed(f"{name} raised {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(value):
        raise _FunctionFailed(f"{name} returned {value}")
    return value


def _is_taskset(item: object) -> bool:
    return isinstance(item, type) and issubclass(item, Taskset) and not inspect.isabstract(item)


ENTRY_POINTS = "rollwire.environments"
"""The entry-point group an installed package declares its tasksets in (`rollwire env init` writes one)."""

TASKSETS: Registry[type[Taskset]] = Registry("taskset", package="rollwire.producers.environments",
                                             entry_points=ENTRY_POINTS, accepts=_is_taskset)
"""The bundled tasksets, those installed packages declare, and `module:Class` / `file.py` references."""


def register_taskset(cls: type[Taskset]) -> type[Taskset]:
    """Class decorator: makes a taskset loadable by its `name`."""
    return TASKSETS.add(cls.name, cls)


def read_rows(source: str | Path, *, split: str = "train", config: str | None = None,
              data_files: str | list[str] | None = None) -> Iterator[tuple[str, dict]]:
    """`(where, row)` pairs from a local `.jsonl`, `.json` (a list) or `.parquet` file (needs
    pyarrow), or from a Hugging Face dataset `hf:OWNER/NAME` (needs `datasets`; `split`, `config`
    and `data_files` are passed to `datasets.load_dataset`, so `hf:parquet` with local
    `data_files` works offline). `where` locates the row for error messages (`file:line`)."""
    text = str(source)
    if text.startswith("hf:"):
        try:
            import datasets
        except ImportError as exc:
            raise ConfigError(f"{text} needs the `datasets` package: pip install 'rollwire[datasets]'") from exc
        rows = datasets.load_dataset(text[3:], config, split=split, data_files=data_files)
        yield from ((f"{text}[{split}]#{i}", dict(row)) for i, row in enumerate(rows))
        return
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"no task file at {path}: give a .jsonl, .json or .parquet file, or hf:OWNER/NAME")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ConfigError(f"{path} needs pyarrow to read parquet: pip install pyarrow") from exc
        yield from ((f"{path}#{i}", row) for i, row in enumerate(pq.read_table(path).to_pylist()))
        return
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text())
        except ValueError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(rows, list):
            raise ConfigError(f"{path} must hold a JSON list of rows")
        yield from ((f"{path}#{i}", row) for i, row in enumerate(rows))
        return
    with open(path) as lines:
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield f"{path}:{n}", json.loads(line)
                except ValueError as exc:
                    raise ConfigError(f"{path}:{n} is not a JSON row: {exc}") from exc


def known_tasksets() -> list[str]:
    """Names of the registered tasksets (the built-in ones included)."""
    return TASKSETS.names()


def check_taskset(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Raises `ConfigError` naming the fix when `name` is not a taskset, `options` are not its
    options, or its harness or one of its tools is not known; builds nothing."""
    cls = TASKSETS.get(name)
    from rollwire.producers.harnesses import HARNESSES
    from rollwire.producers.tools import ToolSet
    if ":" not in cls.harness:
        HARNESSES.check(cls.harness)
        if cls.harness_options:
            check_options(f"taskset {name}: its harness_options for the {cls.harness} harness",
                          HARNESSES.get(cls.harness), cls.harness_options, skip=2)
    try:
        ToolSet.named(cls.tools)
    except ConfigError as exc:
        raise ConfigError(f"taskset {name}: its tools: {exc}") from None
    return check_options(f"taskset {name}", cls, options)


def load_taskset(name: str, **options: Any) -> Taskset:
    """The registered taskset `name`, built with `options` (checked first: `check_taskset`), and
    checked for attributes that hide a method of `Taskset` (`self.judge = LlmJudge(...)` would
    replace the method that runs the rewards, and every rollout would fail)."""
    check_taskset(name, options)
    taskset = TASKSETS.get(name)(**options)
    hidden = sorted(set(vars(taskset)) & {n for n, v in vars(Taskset).items() if callable(v) and not n.startswith("__")})
    if hidden:
        raise ConfigError(f"taskset {name}: its attribute{'s' if len(hidden) > 1 else ''} {', '.join(hidden)} hide"
                          f"{'' if len(hidden) > 1 else 's'} the Taskset method{'s' if len(hidden) > 1 else ''} of that "
                          "name, which rollwire calls: rename the attribute (e.g. self.grader)")
    return taskset
