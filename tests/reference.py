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
