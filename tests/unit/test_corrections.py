"""Off-policy corrections (`rollwire.trainer.corrections`), each against a hand computation on two
sequences whose token ratios pi_theta / pi_sampler are chosen: A = (3, 0.5, 1), B = (1.2, 1.1) and a
padding token. Five trained tokens; sequence ratios R_A = 1.5, R_B = 1.32; geometric means
1.5^(1/3) = 1.1447 and 1.32^(1/2) = 1.1489."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollwire.trainer import corrections, losses
from rollwire.trainer.corrections import CorrectionSpec
from rollwire.trainer.losses import LossInputs

RATIOS = [[3.0, 0.5, 1.0], [1.2, 1.1, 1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def inputs() -> LossInputs:
    sampler = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
    logprobs = (sampler + torch.tensor(RATIOS).log()).requires_grad_()
    advantages = torch.tensor([[1.0] * 3, [-1.0] * 3])
    return LossInputs(logprobs=logprobs, sampler_logprobs=sampler, advantages=advantages, mask=torch.tensor(MASK),
                      num_tokens=5)


def corrected(*specs: dict) -> tuple[list[float], dict[str, float]]:
    """The corrected mask, flattened, and the metrics."""
    x, metrics = corrections.apply([CorrectionSpec(**s) for s in specs], inputs())
    return x.mask.flatten().tolist(), metrics


def test_token_tis_caps_each_tokens_ratio():
    mask, metrics = corrected({"name": "token_tis", "cap": 2.0})
    assert mask == pytest.approx([2.0, 0.5, 1.0, 1.2, 1.1, 0.0])
    assert metrics["tis_capped"] == pytest.approx(1 / 5)  # the 3
    assert metrics["tis_weight"] == pytest.approx((2 + 0.5 + 1 + 1.2 + 1.1) / 5)


def test_sequence_mis_weights_a_sequence_by_its_ratio_and_masks_one_over_the_cap():
    mask, metrics = corrected({"name": "sequence_mis", "cap": 2.0})
    assert mask == pytest.approx([1.5, 1.5, 1.5, 1.32, 1.32, 0.0])
    assert metrics["mis_masked"] == 0
    mask, metrics = corrected({"name": "sequence_mis", "cap": 1.4})
    assert mask == pytest.approx([0.0, 0.0, 0.0, 1.32, 1.32, 0.0])
    assert metrics["mis_masked"] == pytest.approx(3 / 5)


def test_geo_rs_rejects_a_sequence_by_its_geometric_mean_ratio():
    assert math.isclose(1.5 ** (1 / 3), 1.1447, abs_tol=1e-4) and math.isclose(1.32 ** 0.5, 1.1489, abs_tol=1e-4)
    mask, metrics = corrected({"name": "geo_rs", "lower": 0.8, "upper": 1.147})
    assert mask == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert metrics["geo_rs_masked"] == pytest.approx(2 / 5)
    mask, _ = corrected({"name": "geo_rs", "lower": 1.146, "upper": 1.2})
    assert mask == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def test_icepop_masks_tokens_outside_both_bounds():
    mask, metrics = corrected({"name": "icepop", "lower": 0.6, "upper": 2.5})
    assert mask == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert metrics["icepop_masked"] == pytest.approx(2 / 5)


def test_measure_changes_nothing_and_reports_the_ratios():
    mask, metrics = corrected({"name": "measure"})
    assert mask == [v for row in MASK for v in row]
    assert metrics["ratio_mean"] == pytest.approx((3 + 0.5 + 1 + 1.2 + 1.1) / 5)
    assert metrics["ratio_outside_half_to_2"] == pytest.approx(1 / 5)  # 0.5 is inside
    assert metrics["ratio_geometric_mean"] == pytest.approx((3 * 1.5 ** (1 / 3) + 2 * 1.32 ** 0.5) / 5)


def test_corrections_compose_by_multiplying_and_any_loss_trains_under_them():
    mask, metrics = corrected({"name": "token_tis", "cap": 2.0}, {"name": "icepop", "lower": 0.6, "upper": 2.5})
    assert mask == pytest.approx([0.0, 0.0, 1.0, 1.2, 1.1, 0.0])
    assert {"tis_capped", "icepop_masked"} <= metrics.keys()
    # reinforce under token_tis: -sum(A * w * log pi) / 5, the weights not differentiated
    x, _ = corrections.apply([CorrectionSpec(name="token_tis", cap=2.0)], inputs())
    loss, _ = losses.build("reinforce")(x)
    loss.backward()
    expected = [-2.0 / 5, -0.5 / 5, -1.0 / 5, 1.2 / 5, 1.1 / 5, 0.0]
    assert x.logprobs.grad.flatten().tolist() == pytest.approx(expected)


@pytest.mark.parametrize("spec, message", [
    ({"name": "token_tiss"}, "unknown off-policy correction 'token_tiss'.*did you mean 'token_tis'"),
    ({"name": "icepop", "uper": 2}, "off-policy correction icepop has no option 'uper' \\(did you mean 'upper'\\?\\)"),
    ({"name": "token_tis", "cap": "big"}, "off-policy correction token_tis option 'cap'"),
])
def test_a_bad_correction_says_what_to_change(spec, message):
    with pytest.raises(ValidationError, match=message):  # a recipe says it as `trainer.corrections.0: ...`
        CorrectionSpec(**spec)
