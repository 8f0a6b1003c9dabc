"""An environment as a package of its own (`rollwire env init NAME`): a folder a user can
`pip install -e`, whose taskset rollwire finds through the `rollwire.environments` entry point, so
that adding a dataset or a reward never means editing rollwire.

    NAME/
      pyproject.toml              the package, and its entry point: NAME = "MODULE.taskset:CLASS"
      README.md                   how to install, check, train and evaluate it
      src/MODULE/__init__.py
      src/MODULE/taskset.py       the taskset: rows, a reward, a metric, a scripted teacher
      tests/test_taskset.py       its reward, tested on hand-written answers (pytest)

The taskset written is a small working one (add two numbers, exact match) for the user to replace.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from rollwire.core.errors import ConfigError

NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def module_name(name: str) -> str:
    return name.replace("-", "_")


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def check_name(name: str) -> None:
    if not NAME.match(name) or keyword.iskeyword(module_name(name)):
        raise ConfigError(f"environment name {name!r}: use lowercase letters, digits and single dashes, starting "
                          "with a letter (e.g. `sorting` or `code-review`); it names the taskset, the package and "
                          "its module")


def write_package(name: str, folder: Path) -> list[Path]:
    """Writes the package for environment `name` into `folder` (which must not exist or be empty);
    returns the files written."""
    check_name(name)
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} exists and is not empty: choose another --dir, or remove it")
    module, cls = module_name(name), class_name(name)
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"src/{module}/__init__.py": INIT,
        f"src/{module}/taskset.py": TASKSET,
        "tests/test_taskset.py": TEST,
    }
    written = []
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(name=name, module=module, cls=cls))
        written.append(path)
    return written


PYPROJECT = '''\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{name}: an environment for rollwire"
requires-python = ">=3.11"
dependencies = ["rollwire"]

# How rollwire finds the taskset once this package is installed: `name = "{name}"` in a recipe's
# [[environments]], or `rollwire eval {name}`.
[project.entry-points."rollwire.environments"]
{name} = "{module}.taskset:{cls}"

[tool.setuptools.packages.find]
where = ["src"]
'''

INIT = '''\
from {module}.taskset import {cls}

__all__ = ["{cls}"]
'''

TASKSET = '''\
"""{name}: add two numbers. A working example to replace with your task.

    prompt  "<|bos|>12+7="      answer "19", then end-of-sequence

Each row is a dict with a stable `task_id` and a `prompt` (the `completion` harness sends it as
raw text) or `messages` (the `chat` harness). Rewards and metrics are methods taking a
`RolloutView` (the task row, the completion, the messages, the token count, the finish reason);
the rollout's reward is the weighted sum of its rewards. A reward that raises makes that rollout
errored, with the exception as its reason: it is never trained on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from rollwire.producers.tasksets import RolloutView, Taskset, metric, reward


class {cls}(Taskset):
    name = "{name}"
    harness = "completion"
    group_rewards = [{{"name": "shortest_correct", "bonus": 0.1, "correct": "exact_match"}}]
    """Applied by the scorer to each group of rollouts of one task (rollwire.streams.group_rewards)."""

    def __init__(self, *, seed: int = 0, count: int = 10_000, largest: int = 20, bos: str = "<|bos|>") -> None:
        """Options, set in a recipe as `options = {{ seed = 1, largest = 50 }}`: checked when it loads."""
        self.seed, self.count, self.largest, self.bos = seed, count, largest, bos

    def rows(self) -> Iterator[dict]:
        rng = random.Random(self.seed)
        for i in range(self.count):
            a, b = rng.randint(0, self.largest), rng.randint(0, self.largest)
            yield {{"task_id": f"{name}-{{self.seed}}-{{i}}", "prompt": f"{{self.bos}}{{a}}+{{b}}=", "answer": str(a + b)}}

    def demonstration(self, row: dict, rng: random.Random) -> str:
        """A scripted teacher's answer, for a supervised warm start (`[warm_start]` in a recipe)."""
        return row["answer"]

    @reward("exact_match", weight=1.0)
    def exact_match(self, r: RolloutView) -> float:
        return float(r.finish_reason in (None, "stop") and r.completion.strip() == r.task["answer"])

    @metric("completion_tokens")
    def completion_tokens(self, r: RolloutView) -> float:
        return float(r.completion_tokens)
'''

TEST = '''\
"""The reward, on answers written by hand: run with `pytest` in this folder."""

from rollwire.producers.tasksets import RolloutView, load_taskset


def test_the_exact_sum_earns_the_reward_and_anything_else_none():
    taskset = load_taskset("{name}", seed=1)
    row = next(iter(taskset.rows()))
    right = taskset.judge(RolloutView(task=row, completion=row["answer"], finish_reason="stop"))
    wrong = taskset.judge(RolloutView(task=row, completion=row["answer"] + "1", finish_reason="stop"))
    cut = taskset.judge(RolloutView(task=row, completion=row["answer"], finish_reason="length"))
    assert (right.reward, wrong.reward, cut.reward) == (1.0, 0.0, 0.0)
'''

README = '''\
# {name}

An environment for rollwire: the taskset is `src/{module}/taskset.py`.

```bash
pip install -e .                                   # rollwire finds it by its entry point
pytest                                             # its reward, on hand-written answers
rollwire env check {name} --base-url http://127.0.0.1:8000/v1 --model policy   # a few rollouts
rollwire eval {name} --base-url http://127.0.0.1:8000/v1 --model policy -n 100
```

In a run's recipe:

```toml
[[environments]]
name = "{name}"
options = {{ seed = 1 }}
```
'''
