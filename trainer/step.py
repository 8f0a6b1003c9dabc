"""One optimizer step over a batch of scored rollouts, blind to the algorithm that scored them.

    for each micro-batch:   layout -> token logprobs [B, C] -> loss (token-level, normalised by the
                            step's trained tokens) -> backward          (gradient accumulation)
    non-finite loss?        drop the gradients, skip the step, say so
    clip the gradient norm, optimizer step
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollwire.schemas.rollout import ScoredRollout
from rollwire.trainer.losses import Loss, LossInputs
from rollwire.trainer.model import layout, token_logprobs


@dataclass
class StepResult:
    loss: float | None
    grad_norm: float | None
    num_tokens: int
    seconds: float
    skipped_reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """What the loss measured over the step's trained tokens (`clip_fraction`, `ratio_mean`, ...)."""


def advantages_of(scored: ScoredRollout) -> list[float]:
    """Per-token advantages, shape [C]: the token advantages, or the sequence advantage repeated."""
    if scored.token_advantages is not None:
        return list(scored.token_advantages)
    return [scored.advantage] * len(scored.rollout.completion_token_ids)


def train_step(model, optimizer, loss_fn: Loss, batch: Sequence[ScoredRollout], *, micro_batch: int,
               max_grad_norm: float, device: torch.device) -> StepResult:
    started = time.perf_counter()
    num_tokens = int(sum(sum(s.rollout.loss_mask) for s in batch))
    optimizer.zero_grad(set_to_none=True)
    total, metrics = 0.0, dict[str, float]()
    for start in range(0, len(batch), micro_batch):
        chunk = batch[start: start + micro_batch]
        tokens = layout([s.rollout for s in chunk], device)
        width = tokens.targets.size(1)
        sampler = torch.tensor([s.rollout.completion_logprobs + [0.0] * (width - len(s.rollout.completion_logprobs))
                                for s in chunk], dtype=torch.float32, device=device)
        advantages = torch.tensor([advantages_of(s) + [0.0] * (width - len(s.rollout.completion_token_ids))
                                   for s in chunk], dtype=torch.float32, device=device)
        logprobs = token_logprobs(model, tokens)
        loss, chunk_metrics = loss_fn(LossInputs(logprobs=logprobs, sampler_logprobs=sampler, advantages=advantages,
                                                 mask=tokens.mask, num_tokens=num_tokens))
        if not torch.isfinite(loss):
            optimizer.zero_grad(set_to_none=True)
            return StepResult(None, None, num_tokens, time.perf_counter() - started,
                              skipped_reason=f"the loss was {loss.item()}: step skipped, weights unchanged")
        loss.backward()
        total += loss.item()
        for k, v in chunk_metrics.items():  # token means over the step's tokens: the chunks' shares add up
            metrics[k] = metrics.get(k, 0.0) + v
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).item()
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(total, None, num_tokens, time.perf_counter() - started,
                          skipped_reason=f"the gradient norm was {grad_norm}: step skipped, weights unchanged")
    optimizer.step()
    return StepResult(total, grad_norm, num_tokens, time.perf_counter() - started, metrics=metrics)
