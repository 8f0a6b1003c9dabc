"""Policy-gradient losses over sampled tokens.

    ppo_clip     the default: importance-corrected and clipped (PPO's trust region, per token)
                 loss_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t),  r_t = pi_theta / pi_sampler
    dppo_mask    tokens whose ratio leaves [1 - eps_low, 1 + eps_high] are masked out instead of
                 clipped (DPPO-style trust region by token masking); the others get r_t A_t
    ipo          tokens whose trainer and sampler *probabilities* differ by more than `max_prob_gap`
                 are masked out (after prime-rl's IPO: a gap in probability, unlike a ratio, does not
                 flag rare tokens whose tiny probabilities merely doubled); the others get r_t A_t
    reinforce    plain REINFORCE on sampled tokens: -A_t log pi_theta (no correction; on-policy only)
    nll          negative log-likelihood, for SFT samples (advantage ignored)
    reverse_kl   on-policy distillation: the scorer's per-token advantages are
                 log p_teacher - log p_sampler; the importance-weighted gradient of r_t A_t
                 descends the reverse KL to the teacher

The ratio uses the sampler's logprobs, so off-policy samples (up to `max_off_policy` versions
old) are corrected rather than trusted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollwire.trainer.losses import Loss, LossInputs, register, token_mean

if TYPE_CHECKING:
    import torch


def _ratio(x: LossInputs) -> torch.Tensor:
    return (x.logprobs - x.sampler_logprobs).clamp(-20.0, 20.0).exp()


@register
class PpoClip(Loss):
    name = "ppo_clip"

    @classmethod
    def defaults(cls) -> dict[str, float]:
        return {"eps_low": 0.2, "eps_high": 0.2}

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        ratio = _ratio(x)
        clipped = ratio.clamp(1 - self.params["eps_low"], 1 + self.params["eps_high"])
        per_token = -(ratio * x.advantages).minimum(clipped * x.advantages)
        was_clipped = ((ratio * x.advantages) > (clipped * x.advantages)).float()
        return token_mean(per_token, x), {"clip_fraction": token_mean(was_clipped, x).item(),
                                          "ratio_mean": token_mean(ratio.detach(), x).item()}


@register
class DppoMask(Loss):
    name = "dppo_mask"

    @classmethod
    def defaults(cls) -> dict[str, float]:
        return {"eps_low": 0.2, "eps_high": 0.28}

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        ratio = _ratio(x)
        inside = ((ratio >= 1 - self.params["eps_low"]) & (ratio <= 1 + self.params["eps_high"])).float()
        per_token = -(ratio * x.advantages) * inside
        return token_mean(per_token, x), {"masked_fraction": token_mean(1.0 - inside, x).item(),
                                          "ratio_mean": token_mean(ratio.detach(), x).item()}


@register
class Ipo(Loss):
    name = "ipo"

    @classmethod
    def defaults(cls) -> dict[str, float]:
        return {"max_prob_gap": 0.2}

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        ratio = _ratio(x)
        gap = (x.logprobs.detach().exp() - x.sampler_logprobs.exp()).abs()
        keep = (gap <= self.params["max_prob_gap"]).float()
        per_token = -(ratio * x.advantages) * keep
        return token_mean(per_token, x), {"masked_fraction": token_mean(1.0 - keep, x).item(),
                                          "prob_gap_mean": token_mean(gap, x).item(),
                                          "ratio_mean": token_mean(ratio.detach(), x).item()}


@register
class Reinforce(Loss):
    name = "reinforce"

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        return token_mean(-x.advantages * x.logprobs, x), {}


@register
class Nll(Loss):
    name = "nll"

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        loss = token_mean(-x.logprobs, x)
        return loss, {"nll": loss.item()}


@register
class ReverseKl(Loss):
    name = "reverse_kl"

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        ratio = _ratio(x)
        return token_mean(-ratio * x.advantages, x), {
            "reverse_kl": token_mean(-x.advantages, x).item()}
