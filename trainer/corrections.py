"""Off-policy corrections: how much each sampled token counts in the loss, from how far the policy
being trained has moved from the one that sampled it. They apply before the loss, whichever loss
it is, to policy-gradient samples (`[trainer] corrections`, in order; their weights multiply):

    [trainer]
    loss = "ppo_clip"
    corrections = [{ name = "token_tis", cap = 2.0 }, { name = "geo_rs", lower = 0.5, upper = 2.0 }]

Each sees the per-token log-ratio `log r_t = log pi_theta(t) - log pi_sampler(t)` (pi_theta
detached: a correction weighs tokens, it is not differentiated) over a sequence's trained tokens,
one row per sequence, and gives a weight per token:

    token_tis     truncated importance sampling:   w_t = min(r_t, cap)
    sequence_mis  masked importance sampling: a sequence whose ratio R = prod_t r_t exceeds `cap`
                  is masked out (w_t = 0); the others are weighted by it (w_t = R)
    geo_rs        geometric-mean rejection: a sequence whose exp(mean_t log r_t) leaves
                  [lower, upper] is masked out (length does not bias it, unlike R)
    icepop        two-sided token masking: a token whose r_t leaves [lower, upper] is masked out
    measure       every weight 1: the step only reports the ratios (`ratio_*`)

The weights multiply the loss's mask, so any loss that takes token means (`losses.token_mean`)
trains under them. Masked tokens still count in the step's normaliser (`num_tokens`): masking
takes a token's pull away, it does not hand it to the others. Each correction reports what it
did as step metrics, token means over the step so that micro-batches add up (`tis_capped`: the
share of tokens whose weight was capped; `mis_masked`, `geo_rs_masked`, `icepop_masked`: the share
masked out; `*_weight`: the mean weight given).

Nothing here imports torch when imported: a recipe's corrections are checked by processes that
never load a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from rollwire.core.registry import NamedSpec, Registry

if TYPE_CHECKING:
    import torch

    from rollwire.trainer.losses import LossInputs


@dataclass
class Ratios:
    """What a correction sees, each [B, T] over completion tokens (one row per sequence)."""

    log_ratio: torch.Tensor
    """log pi_theta - log pi_sampler, detached; 0 where `mask` is 0."""
    mask: torch.Tensor
    """1.0 for trained tokens."""
    num_tokens: int
    """Trained tokens of the whole step (the metrics' denominator)."""

    def token_mean(self, values: torch.Tensor) -> float:
        return float((values * self.mask).sum()) / max(1, self.num_tokens)

    def sequence_sum(self) -> torch.Tensor:
        """Sum of the log-ratio over each sequence's trained tokens, [B, 1]."""
        return (self.log_ratio * self.mask).sum(dim=1, keepdim=True)

    def sequence_mean(self) -> torch.Tensor:
        """Mean of the log-ratio over each sequence's trained tokens, [B, 1]."""
        return self.sequence_sum() / self.mask.sum(dim=1, keepdim=True).clamp(min=1)


Correction = Callable[..., "tuple[torch.Tensor, dict[str, float]]"]
"""`fn(ratios: Ratios, **options) -> (weights [B, T], metrics)`."""

CORRECTIONS: Registry[Correction] = Registry("off-policy correction")


@CORRECTIONS.register("token_tis")
def token_tis(x: Ratios, *, cap: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    ratio = x.log_ratio.clamp(max=20.0).exp()
    weight = ratio.clamp(max=cap)
    return weight, {"tis_capped": x.token_mean((ratio > cap).float()), "tis_weight": x.token_mean(weight)}


@CORRECTIONS.register("sequence_mis")
def sequence_mis(x: Ratios, *, cap: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    log_cap = math.log(cap)
    total = x.sequence_sum()
    kept = (total <= log_cap).float()
    weight = (total.clamp(max=log_cap).exp() * kept).expand_as(x.log_ratio)
    return weight, {"mis_masked": x.token_mean((1.0 - kept).expand_as(x.mask)), "mis_weight": x.token_mean(weight)}


@CORRECTIONS.register("geo_rs")
def geo_rs(x: Ratios, *, lower: float = 0.5, upper: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    geometric = x.sequence_mean().exp()
    kept = ((geometric >= lower) & (geometric <= upper)).float().expand_as(x.log_ratio)
    return kept, {"geo_rs_masked": x.token_mean(1.0 - kept)}


@CORRECTIONS.register("icepop")
def icepop(x: Ratios, *, lower: float = 0.5, upper: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    ratio = x.log_ratio.clamp(max=20.0).exp()
    kept = ((ratio >= lower) & (ratio <= upper)).float()
    return kept, {"icepop_masked": x.token_mean(1.0 - kept)}


@CORRECTIONS.register("measure")
def measure(x: Ratios) -> tuple[torch.Tensor, dict[str, float]]:
    ratio = x.log_ratio.clamp(max=20.0).exp()
    outside = ((ratio < 0.5) | (ratio > 2.0)).float()
    geometric = x.sequence_mean().exp().expand_as(ratio)
    return ratio.new_ones(ratio.shape), {
        "ratio_mean": x.token_mean(ratio), "ratio_outside_half_to_2": x.token_mean(outside),
        "ratio_abs_log_mean": x.token_mean(x.log_ratio.abs()), "ratio_geometric_mean": x.token_mean(geometric)}


class CorrectionSpec(NamedSpec):
    """One correction: its registered name (token_tis, sequence_mis, geo_rs, icepop, measure) and
    options, checked when the settings load."""

    kind: ClassVar[str] = "off-policy correction"
    registry: ClassVar[Registry] = CORRECTIONS


def apply(specs: Sequence[CorrectionSpec], x: LossInputs) -> tuple[LossInputs, dict[str, float]]:
    """`x` with its mask multiplied by each correction's weights, and what each did."""
    if not specs:
        return x, {}
    ratios = Ratios(log_ratio=((x.logprobs.detach() - x.sampler_logprobs) * x.mask), mask=x.mask,
                    num_tokens=x.num_tokens)
    mask, metrics = x.mask, {}
    for spec in specs:
        weight, found = spec.function()(ratios, **spec.options())
        mask = mask * weight
        metrics.update(found)
    return replace(x, mask=mask), metrics
