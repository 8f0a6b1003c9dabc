"""A tiny policy and synthetic scored rollouts on its vocabulary."""

from __future__ import annotations

import random

import pytest

from rollwire.schemas import RolloutCompleted, ScoredRollout, WeightVersionSpan


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory):
    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("policy") / "base", build_char_tokenizer(), seed=0)


def scored(i: int, *, version: int = 0, advantage: float = 1.0, prompt=None, completion=None,
           logprobs=None, mask=None) -> ScoredRollout:
    rng = random.Random(i)
    prompt = prompt or [1] + [rng.randrange(5, 80) for _ in range(6)]
    completion = completion or [rng.randrange(5, 80) for _ in range(rng.randrange(3, 8))]
    rollout = RolloutCompleted(
        rollout_id=f"r{i}", group_id=f"g{i // 4}", task_id="t", environment="env", algorithm="grpo", group_size=4,
        sample_index=i % 4, prompt_token_ids=prompt, completion_token_ids=completion,
        completion_logprobs=logprobs or [-2.0] * len(completion), loss_mask=mask or [1] * len(completion),
        weight_versions=[WeightVersionSpan(version=version, start=0, end=len(completion))],
        rewards={"r": 1.0}, reward=1.0)
    return ScoredRollout(rollout=rollout, algorithm="grpo", reward=1.0, advantage=advantage)
