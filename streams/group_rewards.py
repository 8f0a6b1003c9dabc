"""Group reward functions: rewards that depend on the whole group, applied before advantages.

A group reward sees every usable rollout of a group and returns one bonus per rollout; the
scorer adds it to the rollout's own reward under the function's name. Each function is
registered by name and configured per environment in the scorer settings:

    [scorer.group_rewards]
    reverse-digits = [{ name = "shortest_correct", bonus = 0.2, correct = "exact_match" }]
    essays = [{ name = "pairwise_judge", bonus = 1.0, judge = { base_url = "http://127.0.0.1:8001/v1", model = "judge" } }]

A group reward that raises (a judge that gives no verdict) drops the group's rollouts with the
reason (`invalid`, "scoring failed: ..."): never a silent 0.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import ClassVar

from rollwire.core.errors import ConfigError
from rollwire.core.registry import NamedSpec, Registry
from rollwire.producers.judges import JudgeSettings, LlmJudge
from rollwire.schemas.rollout import RolloutCompleted

GroupReward = Callable[..., list[float]]
"""`fn(group: Sequence[RolloutCompleted], **params) -> list[float]`, one bonus per rollout."""

GROUP_REWARDS: Registry[GroupReward] = Registry("group reward")


def group_reward(name: str) -> Callable[[GroupReward], GroupReward]:
    """Decorator: registers a group reward function under `name`."""
    return GROUP_REWARDS.register(name)


class GroupRewardSpec(NamedSpec):
    """One group reward applied to an environment: its registered name (e.g. `shortest_correct`)
    and options, checked against the function's keyword parameters when the settings load."""

    kind: ClassVar[str] = "group reward"
    registry: ClassVar[Registry] = GROUP_REWARDS


def resolve(spec: GroupRewardSpec) -> Callable[[Sequence[RolloutCompleted]], list[float]]:
    """The configured function, parameters bound."""
    fn = spec.function()
    params = spec.options()
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


PAIRWISE_RUBRIC = """You compare two answers to the same task. Task:
{question}

Answer A:
{answer_a}

Answer B:
{answer_b}

Which answer is better? Reply with one line: Score: N, where N is 10 if A is clearly better, 0 if B
is clearly better, and 5 if they are equally good."""


@group_reward("pairwise_judge")
def pairwise_judge(group: Sequence[RolloutCompleted], *, judge: JudgeSettings, bonus: float = 1.0,
                   both_orders: bool = False, concurrency: int = 8) -> list[float]:
    """An LLM judge compares every pair of the group's answers (`RolloutCompleted.answer`, on the
    task's `question`); each rollout gets `bonus` times its share of wins over the others (a tie is
    half a win). The judge's rubric has `{question}`, `{answer_a}` and `{answer_b}` and its score
    is A's preference, 0 (B wins) to `scale` (A wins); without a rubric of its own, `PAIRWISE_RUBRIC`.
    A pair is shown in one order, alternating which member comes first, or in both (`both_orders`,
    averaged: judges favour a position). Calls run at once, up to `concurrency`; a pair the judge
    gives no score for (after its retries) fails the group with every reason."""
    if len(group) < 2:
        return [0.0] * len(group)
    missing = [r.rollout_id for r in group if r.answer is None]
    if missing:
        raise ConfigError(f"pairwise_judge needs each rollout's answer; {', '.join(missing)} carry none "
                          "(env workers from before rollwire recorded answers)")
    grader = _judge(JudgeSettings.model_validate(judge))
    pairs = [(a, b) if (a + b) % 2 == 0 else (b, a) for a, b in itertools.combinations(range(len(group)), 2)]
    if both_orders:
        pairs += [(b, a) for a, b in pairs]

    def prefer_first(pair: tuple[int, int]) -> float:
        first, second = group[pair[0]], group[pair[1]]
        return grader.score(question=first.question or "", answer_a=first.answer, answer_b=second.answer)

    wins = [0.0] * len(group)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(concurrency, len(pairs)))) as pool:
        for (first, second), preference in zip(pairs, pool.map(prefer_first, pairs)):
            wins[first] += preference
            wins[second] += 1.0 - preference
    comparisons = (len(group) - 1) * (2 if both_orders else 1)
    return [bonus * w / comparisons for w in wins]


@functools.lru_cache(maxsize=16)
def _judge_for(settings_json: str) -> LlmJudge:
    settings = JudgeSettings.model_validate_json(settings_json)
    return LlmJudge(settings)


def _judge(settings: JudgeSettings) -> LlmJudge:
    """One judge (one pool of connections) per settings, shared by every group; the pairwise rubric
    unless the settings give their own."""
    if "rubric" not in settings.model_fields_set:
        settings = settings.model_copy(update={"rubric": PAIRWISE_RUBRIC})
    return _judge_for(settings.model_dump_json())
