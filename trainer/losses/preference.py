"""Preference losses: a pair of responses to one prompt, one chosen over the other.

    dpo   Direct Preference Optimization (Rafailov et al., 2023), per pair:
          margin = beta * ((log pi(y_c) - log ref(y_c)) - (log pi(y_r) - log ref(y_r)))
          loss   = -log sigmoid(margin)
          where log pi(y) sums the response's trained tokens.

The reference: each response's logprobs as the policy that sampled it reported them (the sampler
logprobs the serving gateway recorded with the receipt). DPO needs a fixed model to measure
movement from, and the policy that produced the responses is the one the user judged; its
logprobs cost nothing to keep, where a frozen second model would double the trainer's memory.
When the two responses were served by different weight versions, each side is measured from its
own sampler (the margin then also holds the gap between those versions' sequence logprobs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollwire.trainer.losses import Loss, LossInputs, pair_mean, register

if TYPE_CHECKING:
    import torch


@register
class Dpo(Loss):
    name = "dpo"
    pairwise = True

    @classmethod
    def defaults(cls) -> dict[str, float]:
        return {"beta": 0.1}

    def __call__(self, x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        from torch.nn.functional import logsigmoid
        policy = (x.logprobs * x.mask).sum(-1).view(-1, 2)              # [P, 2]: chosen, rejected
        reference = (x.sampler_logprobs * x.mask).sum(-1).view(-1, 2)   # [P, 2]
        moved = policy - reference
        margin = self.params["beta"] * (moved[:, 0] - moved[:, 1])     # [P]
        loss = -logsigmoid(margin)
        return pair_mean(loss, x), {"dpo_accuracy": pair_mean((margin > 0).float(), x).item(),
                                    "dpo_margin": pair_mean(margin.detach(), x).item()}
