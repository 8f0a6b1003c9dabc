"""GRPO (Shao et al., 2024, DeepSeekMath): group-relative advantages.

    A_i = (r_i - mean(r)) / (std(r) + eps)        "grpo"
    A_i =  r_i - mean(r)                          "grpo-nostd"

Departures from the paper: `std` is the population standard deviation (ddof = 0), and a group
whose rewards are all equal (to rounding) gets advantages of exactly 0 (no signal) rather than 0/eps noise.
Outcome supervision only: one advantage per sequence, applied to every trained token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rollwire.streams.advantages import AdvantageEstimator, GroupSample, centered, register

EPS = 1e-6
EQUAL_REWARDS_STD = 1e-9
"""Below this std the rewards differ only by rounding: the group carries no signal."""


@register
class Grpo(AdvantageEstimator):
    name = "grpo"

    def __call__(self, group: Sequence[GroupSample]) -> list[float]:
        diffs = centered([s.reward for s in group])
        std = math.sqrt(sum(d * d for d in diffs) / len(diffs))
        if std < EQUAL_REWARDS_STD:
            return [0.0] * len(group)
        return [d / (std + EPS) for d in diffs]


@register
class GrpoNoStd(AdvantageEstimator):
    name = "grpo-nostd"

    def __call__(self, group: Sequence[GroupSample]) -> list[float]:
        return centered([s.reward for s in group])
