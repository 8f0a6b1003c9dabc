"""Group reward functions: rewards that depend on the whole group, applied before advantages.

A group reward sees every usable rollout of a group and returns one bonus per rollout; the
scorer adds it to the rollout's own reward under the function's name. Each function is
registered by name and configured per environment in the scorer settings:

    [scorer.group_rewards]
    reverse-digits = [{ name = "shortest_correct", bonus = 0.2, correct = "exact_match" }]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from rollwire.core.registry import Registry, check_options
from rollwire.schemas.rollout import RolloutCompleted

GroupReward = Callable[..., list[float]]
"""`fn(group: Sequence[RolloutCompleted], **params) -> list[float]`, one bonus per rollout."""

GROUP_REWARDS: Registry[GroupReward] = Registry("group reward")


def group_reward(name: str) -> Callable[[GroupReward], GroupReward]:
    """Decorator: registers a group reward function under `name`."""
    return GROUP_REWARDS.register(name)


class GroupRewardSpec(BaseModel):
    """One group reward applied to an environment: its registered name and options, checked against
    the function's keyword parameters when the settings load."""

    model_config = ConfigDict(extra="allow")

    name: str
    """Registered group reward name, e.g. `shortest_correct`."""

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _known(self) -> GroupRewardSpec:
        check_options(f"group reward {self.name}", GROUP_REWARDS.get(self.name), self.params(), skip=1)
        return self


def resolve(spec: GroupRewardSpec) -> Callable[[Sequence[RolloutCompleted]], list[float]]:
    """The configured function, parameters bound."""
    fn = GROUP_REWARDS.get(spec.name)
    params = spec.params()
    return lambda group: fn(group, **params)


@group_reward("shortest_correct")
def shortest_correct(group: Sequence[RolloutCompleted], *, bonus: float = 0.2,
                     correct: str = "exact_match", threshold: float = 1.0) -> list[float]:
    """`bonus` to the correct rollouts with the fewest completion tokens (ties all get it).

    A rollout is correct when `rewards[correct] >= threshold`. Groups without a correct rollout
    get no bonus.
    """
    lengths = [len(r.completion_token_ids) for r in group if r.rewards.get(correct, 0.0) >= threshold]
    if not lengths:
        return [0.0] * len(group)
    shortest = min(lengths)
    return [bonus if r.rewards.get(correct, 0.0) >= threshold and len(r.completion_token_ids) == shortest
            else 0.0 for r in group]
