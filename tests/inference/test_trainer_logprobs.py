"""Token fidelity: on the same weights, the trainer's log-probabilities for a rollout's exact token
ids equal what the vLLM sampler reported."""

from __future__ import annotations

import pytest
import torch
from reference import sampled_rollout

from rollwire.trainer.model import ModelSettings, layout, load_policy, token_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_trainer_logprobs_match_the_samplers_on_the_same_weights(vllm_server, tiny_models, version_base):
    weights = tiny_models.version(seed=41)
    vllm_server.control.swap_full_weights(str(weights), str(version_base))
    rollouts = []
    for i, prompt in enumerate(([1, 47, 26, 20, 16], [1, 30, 31, 32, 33, 34, 35, 36], [1, 60])):
        choice = vllm_server.control.generate(prompt, max_tokens=24, seed=i, ignore_eos=True)["choices"][0]
        rollouts.append(sampled_rollout(prompt, choice, version_base, i))

    model = load_policy(ModelSettings(path=str(weights), device="cpu", dtype="float32"))
    with torch.no_grad():
        ours = token_logprobs(model, layout(rollouts, torch.device("cpu")))  # one padded batch

    for i, rollout in enumerate(rollouts):
        n = len(rollout.completion_token_ids)
        assert ours[i, :n].tolist() == pytest.approx(rollout.completion_logprobs, abs=1e-3)
