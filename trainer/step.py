"""One optimizer step over a batch of scored rollouts, blind to the algorithm that scored them.

    for each objective:     policy_gradient (the trainer's loss), sft (nll), preference (dpo)
      for each micro-batch: layout -> token logprobs [B, C] -> off-policy corrections (policy
                            gradient only: `rollwire.trainer.corrections`) -> loss (normalised by the objective's
                            trained tokens, or pairs, in the step) x weight -> backward
                                                                        (gradient accumulation)
    under torchrun:         each rank the micro-batches of its share; gradients summed over ranks
    non-finite loss?        drop the gradients, skip the step, say so
    clip the gradient norm, optimizer step (held when the gradient is exactly zero: `no_signal`)
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout, TokenSequence
from rollwire.trainer import corrections, losses
from rollwire.trainer.corrections import CorrectionSpec
from rollwire.trainer.distributed import Shard
from rollwire.trainer.losses import Loss, LossInputs
from rollwire.trainer.model import layout, token_logprobs
from rollwire.trainer.settings import TrainerSettings


@dataclass
class StepResult:
    loss: float | None
    grad_norm: float | None
    num_tokens: int
    seconds: float
    skipped_reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """What the loss measured over the step's trained tokens (`clip_fraction`, `ratio_mean`, ...), and
    `no_signal`: 1 when the gradient was exactly zero (every advantage 0, as in a group whose rollouts all
    scored the same) and the optimizer was not stepped. Stepping Adam on a zero gradient decays its
    second moment towards nothing, so the next real gradient, however small, moves every weight it
    touches by about 3 x lr: a converged run's reward collapsed that way after 110 minutes of such
    steps (92% of them; bench/RESULTS.md). Held, the optimizer's state and the weights stay as they were."""


def advantages_of(scored: ScoredRollout) -> list[float]:
    """Per-token advantages, shape [C]: the token advantages, or the sequence advantage repeated."""
    if scored.token_advantages is not None:
        return list(scored.token_advantages)
    assert scored.advantage is not None, "a ScoredRollout carries advantage or token_advantages"
    return [scored.advantage] * len(scored.rollout.completion_token_ids)


@dataclass
class Objectives:
    """The loss each kind of sample (`ScoredRollout.objective`) is trained with, and its weight in
    the step's loss. Each objective's loss is a mean over its own share of the step (trained tokens,
    or pairs), so a weight of 1 gives production feedback the same pull per token as a rollout."""

    policy_gradient: Loss
    sft: Loss | None = None
    """Default: `nll`."""
    sft_weight: float = 1.0
    preference: Loss | None = None
    """Default: `dpo` with its default beta."""
    preference_weight: float = 1.0
    corrections: Sequence[CorrectionSpec] = ()
    """Off-policy corrections of policy-gradient samples, before their loss."""

    def __post_init__(self) -> None:
        self.sft = self.sft or losses.build("nll")
        self.preference = self.preference or losses.build("dpo")

    @classmethod
    def from_settings(cls, settings: TrainerSettings) -> Objectives:
        feedback = settings.feedback
        return cls(losses.build(settings.loss, **settings.loss_params), sft_weight=feedback.sft_weight,
                   preference=losses.build(feedback.preference_loss, **feedback.preference_params),
                   preference_weight=feedback.preference_weight, corrections=settings.corrections)

    def loss(self, objective: str) -> tuple[Loss, float]:
        assert self.sft is not None and self.preference is not None  # set by __post_init__
        losses_by_objective: dict[str, tuple[Loss, float]] = {
            "policy_gradient": (self.policy_gradient, 1.0), "sft": (self.sft, self.sft_weight),
            "preference": (self.preference, self.preference_weight)}
        return losses_by_objective[objective]


METRIC_PREFIX = {"policy_gradient": "", "sft": "sft_", "preference": ""}
"""Before each objective's loss metrics in the step's metrics (dpo's already say `dpo_`)."""


def _rows(scored: ScoredRollout) -> list[RolloutCompleted | TokenSequence]:
    """The sequences a sample trains: a preference's chosen then rejected response, else its rollout
    and the rollout's other lines (`RolloutCompleted.branches`)."""
    if scored.rejected is not None:
        return [scored.rollout, scored.rejected]
    return [scored.rollout, *scored.rollout.branches]


def _row_advantages(scored: ScoredRollout) -> list[list[float]]:
    """Per-token advantages of each of a policy-gradient sample's rows: the rollout's own, and for
    each other line the rollout's advantage on every token (token advantages' mean, where only
    those were given: a teacher's are for the main line's tokens)."""
    main = advantages_of(scored)
    if not scored.rollout.branches:
        return [main]
    whole = scored.advantage if scored.advantage is not None else (sum(main) / len(main) if main else 0.0)
    return [main, *([whole] * len(b.completion_token_ids) for b in scored.rollout.branches)]


def _padded(rows: Sequence[Sequence[float]], width: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32, device=device)


def train_step(model, optimizer, objectives: Loss | Objectives, batch: Sequence[ScoredRollout], *, micro_batch: int,
               max_grad_norm: float, device: torch.device, shard: Shard | None = None) -> StepResult:
    """One optimizer step over `batch`: each sample's objective trained with its loss (`objectives`;
    a bare `Loss` trains policy-gradient samples only), gradients accumulated over micro-batches of
    `micro_batch` samples, then clipped to `max_grad_norm`. With a `shard` (torchrun), this rank
    trains its share of each objective's samples, normalised by the whole batch's counts, and the
    gradients, losses and metrics are summed over the ranks: the step is the one-process step."""
    started = time.perf_counter()
    if not isinstance(objectives, Objectives):
        objectives = Objectives(objectives)
    by_objective: dict[str, list[ScoredRollout]] = {}
    for scored in batch:
        by_objective.setdefault(scored.objective, []).append(scored)
    trained = {name: int(sum(sum(r.loss_mask) for s in samples for r in _rows(s))) for name, samples in by_objective.items()}
    num_tokens = sum(trained.values())
    optimizer.zero_grad(set_to_none=True)
    total, metrics = 0.0, dict[str, float]()
    bad_loss: float | None = None
    for objective, samples in by_objective.items():
        loss_fn, weight = objectives.loss(objective)
        mine = shard.mine(samples) if shard else samples
        for start in range(0, len(mine), micro_batch):
            chunk = mine[start: start + micro_batch]
            rows = [r for s in chunk for r in _rows(s)]
            tokens = layout(rows, device)
            width = tokens.targets.size(1)
            sampler = _padded([r.completion_logprobs for r in rows], width, device)
            advantages = _padded([a for s in chunk for a in (
                _row_advantages(s) if objective == "policy_gradient" else [[0.0] * width for _ in _rows(s)])],
                width, device)
            logprobs = token_logprobs(model, tokens)
            inputs = LossInputs(logprobs=logprobs, sampler_logprobs=sampler, advantages=advantages, mask=tokens.mask,
                                num_tokens=trained[objective], num_pairs=len(samples))
            corrected: dict[str, float] = {}
            if objective == "policy_gradient":
                inputs, corrected = corrections.apply(objectives.corrections, inputs)
            loss, chunk_metrics = loss_fn(inputs)
            chunk_metrics = {**chunk_metrics, **corrected}
            loss = loss * weight
            if not torch.isfinite(loss):
                bad_loss = loss.item()
                break
            loss.backward()
            total += loss.item()
            for k, v in chunk_metrics.items():  # means over the objective's tokens or pairs: the chunks' shares add up
                key = METRIC_PREFIX[objective] + k
                metrics[key] = metrics.get(key, 0.0) + v
        if bad_loss is not None:
            break
    if shard is not None:  # every rank takes part in the sums, even one whose loss was not finite
        sums = shard.sum_scalars({**metrics, "loss": total, "bad": float(bad_loss is not None)})
        bad_loss = float("nan") if sums.pop("bad") and bad_loss is None else bad_loss
        total, metrics = sums.pop("loss"), sums
        shard.sum_gradients(model)
    if bad_loss is not None:
        optimizer.zero_grad(set_to_none=True)
        return StepResult(None, None, num_tokens, time.perf_counter() - started,
                          skipped_reason=f"the loss was {bad_loss}: step skipped, weights unchanged")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).item()
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(total, None, num_tokens, time.perf_counter() - started,
                          skipped_reason=f"the gradient norm was {grad_norm}: step skipped, weights unchanged")
    metrics["no_signal"] = float(grad_norm == 0.0)
    if grad_norm != 0.0:
        optimizer.step()
    return StepResult(total, grad_norm, num_tokens, time.perf_counter() - started, metrics=metrics)
