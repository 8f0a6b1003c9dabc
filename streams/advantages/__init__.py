"""Advantage estimators: one module per algorithm, registered by name, built once.

    @register                                   # in streams/advantages/<name>.py
    class Rloo(AdvantageEstimator):
        name = "rloo"
        def __call__(self, group): ...

Every module in this package is imported on first lookup (`rollwire.core.registry`), so adding an
algorithm is adding one module; no other file changes. Estimators are pure: plain numbers in, plain numbers out, no
Kafka, torch or network. The scorer looks one up by the name each task carries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rollwire.core.registry import Registry, UnknownNameError


class UnknownAlgorithmError(UnknownNameError):
    """No advantage estimator is registered under the requested name."""


@dataclass(frozen=True)
class GroupSample:
    """What an estimator sees of one rollout of a group."""

    reward: float
    """Final reward: the rollout's reward plus its group rewards."""
    sampler_logprobs: Sequence[float] = ()
    """Log-probability of each completion token under the sampling policy. Shape [C]."""
    loss_mask: Sequence[int] = ()
    """1 for trained tokens, 0 for environment tokens. Shape [C]."""
    teacher_logprobs: Sequence[float] | None = None
    """Teacher log-probability of each completion token, shape [C]; None unless the estimator
    declares `needs_teacher`."""


Advantage = float | list[float]
"""A sequence-level advantage, or per-token advantages of shape [C]."""


class AdvantageEstimator(ABC):
    """Turns one group's samples into one advantage per sample."""

    name: ClassVar[str]
    per_token: ClassVar[bool] = False
    """True when `__call__` returns a list of per-token advantages for each sample."""
    needs_teacher: ClassVar[bool] = False
    """True when samples must carry `teacher_logprobs`."""

    @abstractmethod
    def __call__(self, group: Sequence[GroupSample]) -> Sequence[Advantage]:
        """One advantage per sample of `group`, in order."""


ALGORITHMS: Registry[type[AdvantageEstimator]] = Registry("advantage algorithm", package=__name__,
                                                         error=UnknownAlgorithmError)


def register(cls: type[AdvantageEstimator]) -> type[AdvantageEstimator]:
    """Class decorator: makes `cls` available under `cls.name`."""
    return ALGORITHMS.add(cls.name, cls)


def names() -> list[str]:
    """Every registered algorithm name."""
    return ALGORITHMS.names()


def build(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`; raises `UnknownAlgorithmError` naming the valid ones."""
    return ALGORITHMS.get(name)()


def centered(rewards: Sequence[float]) -> list[float]:
    """Rewards minus their group mean."""
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]
