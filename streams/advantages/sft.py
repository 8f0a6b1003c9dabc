"""SFT as RL data: every sample is a teacher demonstration with advantage 1, so the policy-gradient
loss reduces to the negative log-likelihood of its trained tokens."""

from __future__ import annotations

from collections.abc import Sequence

from rollwire.streams.advantages import AdvantageEstimator, GroupSample, register


@register
class Sft(AdvantageEstimator):
    name = "sft"

    def __call__(self, group: Sequence[GroupSample]) -> list[float]:
        return [1.0] * len(group)
