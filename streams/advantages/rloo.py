"""RLOO (Ahmadian et al., 2024): REINFORCE with a leave-one-out baseline.

    A_i = r_i - (sum_j r_j - r_i) / (n - 1)   =   n / (n - 1) * (r_i - mean(r))

A group of one has no baseline: its advantage is 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwire.streams.advantages import AdvantageEstimator, GroupSample, register


@register
class Rloo(AdvantageEstimator):
    name = "rloo"

    def __call__(self, group: Sequence[GroupSample]) -> list[float]:
        n = len(group)
        if n < 2:
            return [0.0] * n
        total = sum(s.reward for s in group)
        return [s.reward - (total - s.reward) / (n - 1) for s in group]
