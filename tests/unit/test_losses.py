"""Every registered loss against values worked out by hand on a two-sequence batch, and the
metrics each reports; the loss names and parameters are checked before anything is built."""

from __future__ import annotations

import math

import pytest
import torch

from rollwire.core.errors import ConfigError
from rollwire.trainer import losses
from rollwire.trainer.losses import LossInputs

# Two sequences of three completion tokens; the last token of the second is padding (mask 0).
LOGPROBS = [[math.log(0.5), math.log(0.2), math.log(0.9)], [math.log(0.3), math.log(0.6), 0.0]]
SAMPLER = [[math.log(0.4), math.log(0.2), math.log(0.5)], [math.log(0.3), math.log(0.4), 0.0]]
ADVANTAGES = [[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
N = 5  # trained tokens of the step
# ratios pi_theta / pi_sampler, token by token (the padding token's is 1 and masked)
RATIOS = [0.5 / 0.4, 1.0, 0.9 / 0.5, 1.0, 0.6 / 0.4]  # 1.25, 1, 1.8, 1, 1.5
ADV = [1.0, 1.0, 1.0, -2.0, -2.0]
LOGP = [math.log(0.5), math.log(0.2), math.log(0.9), math.log(0.3), math.log(0.6)]


def inputs(requires_grad: bool = False) -> LossInputs:
    logprobs = torch.tensor(LOGPROBS, requires_grad=requires_grad)
    return LossInputs(logprobs=logprobs, sampler_logprobs=torch.tensor(SAMPLER), advantages=torch.tensor(ADVANTAGES),
                      mask=torch.tensor(MASK), num_tokens=N)


def test_ppo_clip_takes_the_pessimistic_of_the_plain_and_the_clipped_ratio():
    loss, metrics = losses.build("ppo_clip", eps_low=0.2, eps_high=0.2)(inputs())
    clipped = [min(max(r, 0.8), 1.2) for r in RATIOS]  # 1.2, 1, 1.2, 1, 1.2
    per_token = [-min(r * a, c * a) for r, c, a in zip(RATIOS, clipped, ADV)]
    # positive advantages: min(1.25, 1.2) = 1.2, 1, min(1.8, 1.2) = 1.2; negative: min(-2, -2) = -2, min(-3, -2.4) = -3
    assert per_token == pytest.approx([-1.2, -1.0, -1.2, 2.0, 3.0])
    assert loss.item() == pytest.approx(sum(per_token) / N)
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)  # tokens 1 and 3: the clipped value was the smaller
    assert metrics["ratio_mean"] == pytest.approx(sum(RATIOS) / N)


def test_dppo_mask_drops_tokens_outside_the_trust_region_instead_of_clipping_them():
    loss, metrics = losses.build("dppo_mask", eps_low=0.2, eps_high=0.28)(inputs())
    inside = [0.8 <= r <= 1.28 for r in RATIOS]  # 1.25 in, 1 in, 1.8 out, 1 in, 1.5 out
    assert inside == [True, True, False, True, False]
    expected = sum(-r * a for r, a, keep in zip(RATIOS, ADV, inside) if keep) / N  # (-1.25 - 1 + 2) / 5
    assert loss.item() == pytest.approx(expected) == pytest.approx(-0.05)
    assert metrics["masked_fraction"] == pytest.approx(2 / 5)


def test_ipo_masks_tokens_whose_probabilities_differ_by_more_than_the_gap():
    # probabilities: trainer 0.5, 0.2, 0.9, 0.3, 0.6; sampler 0.4, 0.2, 0.5, 0.3, 0.4: gaps 0.1, 0, 0.4, 0, 0.2
    x = inputs(requires_grad=True)
    loss, metrics = losses.build("ipo", max_prob_gap=0.15)(x)
    assert loss.item() == pytest.approx((-1.25 - 1.0 + 2.0) / N)  # tokens 3 (gap 0.4) and 5 (0.2) masked
    assert metrics["masked_fraction"] == pytest.approx(2 / 5)
    assert metrics["prob_gap_mean"] == pytest.approx((0.1 + 0 + 0.4 + 0 + 0.2) / N)
    loss.backward()
    assert x.logprobs.grad[0, 2].item() == 0.0 and x.logprobs.grad[1, 1].item() == 0.0  # masked: no gradient
    assert x.logprobs.grad[0, 0].item() == pytest.approx(-1.25 / N)  # d(-r A)/dlogp = -r A
    wider, _ = losses.build("ipo", max_prob_gap=0.3)(inputs())
    assert wider.item() == pytest.approx((-1.25 - 1.0 + 2.0 + 3.0) / N)  # only the 0.4 gap is masked
    # a rare token whose probability doubled (ratio 2) is kept; the ratio-based mask would drop it
    rare = LossInputs(logprobs=torch.tensor([[math.log(0.002)]]), sampler_logprobs=torch.tensor([[math.log(0.001)]]),
                      advantages=torch.tensor([[1.0]]), mask=torch.tensor([[1.0]]), num_tokens=1)
    assert losses.build("ipo")(rare)[1]["masked_fraction"] == 0.0
    assert losses.build("dppo_mask")(rare)[1]["masked_fraction"] == 1.0


def test_reinforce_is_minus_advantage_times_logprob_with_no_correction():
    loss, metrics = losses.build("reinforce")(inputs())
    assert loss.item() == pytest.approx(sum(-a * lp for a, lp in zip(ADV, LOGP)) / N)
    assert metrics == {}


def test_nll_ignores_the_advantage():
    loss, metrics = losses.build("nll")(inputs())
    assert loss.item() == pytest.approx(-sum(LOGP) / N) and metrics == {"nll": pytest.approx(loss.item())}


def test_reverse_kl_weights_the_teacher_gap_by_the_ratio_and_reports_the_divergence():
    loss, metrics = losses.build("reverse_kl")(inputs())  # advantages here: log p_teacher - log p_sampler
    assert loss.item() == pytest.approx(sum(-r * a for r, a in zip(RATIOS, ADV)) / N)
    assert metrics["reverse_kl"] == pytest.approx(-sum(ADV) / N)


def test_the_gradient_of_ppo_clip_vanishes_on_clipped_tokens():
    x = inputs(requires_grad=True)
    loss, _ = losses.build("ppo_clip", eps_low=0.2, eps_high=0.2)(x)
    loss.backward()
    grad = x.logprobs.grad
    # d/dlogp of -(r A)/N is -r A / N where the unclipped term is the minimum, 0 where the clipped one is
    assert grad[0, 0].item() == 0.0 and grad[0, 2].item() == 0.0
    assert grad[0, 1].item() == pytest.approx(-1.0 / N) and grad[1, 1].item() == pytest.approx(1.5 * 2 / N)
    assert grad[1, 2].item() == 0.0  # padding


def test_dpo_pushes_the_chosen_response_up_against_the_rejected_one_from_the_reference():
    # rows: chosen, rejected of pair 0; chosen, rejected of pair 1 (the last token of each rejected is padding)
    policy = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, 0.0], [-0.2, -0.3, -0.4], [-2.0, -0.1, 0.0]],
                          requires_grad=True)
    reference = torch.tensor([[-1.2, -2.0, -0.6], [-1.0, -1.2, 0.0], [-0.5, -0.5, -0.5], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    x = LossInputs(logprobs=policy, sampler_logprobs=reference, advantages=torch.zeros(4, 3), mask=mask,
                   num_tokens=10, num_pairs=2)
    loss, metrics = losses.build("dpo", beta=0.5)(x)
    # pair 0: chosen moved -3.5 - (-3.8) = 0.3, rejected -2.5 - (-2.2) = -0.3: margin 0.5 * 0.6 = 0.3
    # pair 1: chosen -0.9 - (-1.5) = 0.6, rejected -2.1 - (-2.0) = -0.1: margin 0.5 * 0.7 = 0.35
    margins = [0.3, 0.35]
    expected = [math.log(1 + math.exp(-m)) for m in margins]  # -log sigmoid(m)
    assert loss.item() == pytest.approx(sum(expected) / 2)
    assert metrics == pytest.approx({"dpo_accuracy": 1.0, "dpo_margin": sum(margins) / 2})
    loss.backward()
    # d/d logp(chosen token) = -beta * sigmoid(-m) / pairs; rejected: the opposite; padding: 0
    sig = [1 / (1 + math.exp(m)) for m in margins]
    assert policy.grad[0, 0].item() == pytest.approx(-0.5 * sig[0] / 2)
    assert policy.grad[1, 0].item() == pytest.approx(0.5 * sig[0] / 2)
    assert policy.grad[3, 1].item() == pytest.approx(0.5 * sig[1] / 2) and policy.grad[3, 2].item() == 0.0


def test_loss_names_and_parameters_are_checked_before_anything_is_built():
    with pytest.raises(ConfigError, match="unknown loss 'ppo'; valid: dppo_mask, ipo, nll, ppo_clip, reinforce, "
                                          "reverse_kl .did you mean 'ppo_clip'"):
        losses.check("ppo", {})
    with pytest.raises(ConfigError, match="no parameter 'eps' .*it takes eps_low, eps_high"):
        losses.check("ppo_clip", {"eps": 0.1})
    with pytest.raises(ConfigError, match="loss 'dpo' trains preference pairs; here it takes one of: dppo_mask, ipo, nll"):
        losses.check("dpo", {})
    with pytest.raises(ConfigError, match="loss 'nll' trains scored tokens; here it takes one of: dpo"):
        losses.check("nll", {}, pairwise=True)
    with pytest.raises(ConfigError, match="unknown preference loss 'dop'; valid: dpo .did you mean 'dpo'"):
        losses.check("dop", {}, pairwise=True)
