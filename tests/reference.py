"""Reference computations that tests compare rollwire's results against."""

from __future__ import annotations

from pathlib import Path


def transformers_logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> list[float]:
    """Log-probability of each completion token under the model in `model_dir` (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, :-1]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def sampled_rollout(prompt: list[int], choice: dict, version: int, index: int = 0):
    """A rollout of one `/inference/v1/generate` choice on `prompt`: every sampled token trained, all
    of it sampled by `version`, the sampler's logprobs as served (for comparing the trainer's)."""
    from rollwire.schemas import RolloutCompleted, WeightVersionSpan
    n = len(choice["token_ids"])
    return RolloutCompleted(
        group_id="g", task_id="t", environment="e", algorithm="grpo", group_size=3, sample_index=index,
        prompt_token_ids=prompt, completion_token_ids=choice["token_ids"],
        completion_logprobs=[c["logprob"] for c in choice["logprobs"]["content"]], loss_mask=[1] * n,
        weight_versions=[WeightVersionSpan(version=version, start=0, end=n)])
