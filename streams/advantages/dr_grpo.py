"""Dr. GRPO (Liu et al., 2025, "Understanding R1-Zero-Like Training"): GRPO done right.

    A_i = r_i - mean(r)

The paper makes two changes to GRPO: it drops the std normalisation (here) and the per-sequence
1/|o_i| length normalisation of the loss. The second lives in the trainer: its default loss
normalises by the total trained tokens of the batch, not per sequence, which removes the same
length bias. So "dr-grpo" and "grpo-nostd" give equal advantages; the name states intent.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwire.streams.advantages import AdvantageEstimator, GroupSample, centered, register


@register
class DrGrpo(AdvantageEstimator):
    name = "dr-grpo"

    def __call__(self, group: Sequence[GroupSample]) -> list[float]:
        return centered([s.reward for s in group])
