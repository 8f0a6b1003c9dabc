"""Advantage estimators against values computed by hand."""

from __future__ import annotations

import math

import pytest

from rollwire.streams import advantages
from rollwire.streams.advantages import GroupSample, UnknownAlgorithmError


def group(*rewards: float) -> list[GroupSample]:
    return [GroupSample(reward=r) for r in rewards]


def test_grpo_normalises_by_the_population_std():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +-1
    assert advantages.build("grpo")(group(1, 0, 0, 1)) == pytest.approx([1, -1, -1, 1], abs=1e-5)
    # rewards 3, 1, 2: mean 2, std sqrt(2/3) -> +-1.2247
    assert advantages.build("grpo")(group(3, 1, 2)) == pytest.approx([1.224744, -1.224744, 0], abs=1e-5)


def test_grpo_gives_no_signal_when_every_reward_is_equal():
    assert advantages.build("grpo")(group(0.7, 0.7, 0.7)) == [0.0, 0.0, 0.0]


def test_grpo_without_std_and_dr_grpo_are_mean_centred():
    for name in ("grpo-nostd", "dr-grpo"):
        assert advantages.build(name)(group(3, 1, 2)) == pytest.approx([1, -1, 0])


def test_rloo_uses_the_mean_of_the_others():
    # 4 - (1+1)/2 = 3; 1 - (4+1)/2 = -1.5
    assert advantages.build("rloo")(group(4, 1, 1)) == pytest.approx([3, -1.5, -1.5])
    assert advantages.build("rloo")(group(5)) == [0.0]


def test_sft_gives_advantage_one():
    assert advantages.build("sft")(group(0, 0.3)) == [1.0, 1.0]


def test_distillation_gives_teacher_minus_student_per_trained_token():
    sample = GroupSample(reward=0.0, sampler_logprobs=[-1.0, -0.5, -2.0], loss_mask=[1, 0, 1],
                         teacher_logprobs=[-0.25, -3.0, -2.5])
    estimator = advantages.build("distill")
    assert estimator.per_token and estimator.needs_teacher
    assert estimator([sample]) == [[0.75, 0.0, -0.5]]
    with pytest.raises(ValueError, match="one teacher logprob per completion token"):
        estimator([GroupSample(reward=0, sampler_logprobs=[-1.0], loss_mask=[1], teacher_logprobs=[])])


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UnknownAlgorithmError, match="valid: distill, dr-grpo, grpo, grpo-nostd, rloo, sft"):
        advantages.build("ppo")
    with pytest.raises(UnknownAlgorithmError, match="did you mean 'grpo'"):
        advantages.build("grpoo")


def test_every_estimator_returns_finite_values_for_mixed_groups():
    samples = [GroupSample(reward=r, sampler_logprobs=[-1.0], loss_mask=[1], teacher_logprobs=[-0.5])
               for r in (0.0, 1.0, 1.2, 0.0)]
    for name in advantages.names():
        values = advantages.build(name)(samples)
        flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
        assert len(values) == 4 and all(math.isfinite(x) for x in flat), name
