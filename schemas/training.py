"""Events of the trainer: a completed step, and rollouts dropped with a reason.

Together with `ScoredRollout`, these make every rollout accountable exactly once: trained (listed
in a `TrainStepCompleted`) or dropped (listed in a `RolloutsDropped` with its reason).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rollwire.schemas.base import Event, Part, now_ms

DropReason = Literal["stale", "invalid", "group_timeout", "errored", "duplicate", "unjoinable", "overflow"]
"""Why rollouts were dropped (`RolloutsDropped.reason`)."""


class Staleness(Part):
    """Policy-version lag of a batch: trainer version minus each sample's oldest sampling version,
    and what the lag does to which rollouts are trained."""

    min: int = Field(ge=0)
    """Smallest lag in the batch."""
    mean: float = Field(ge=0.0)
    """Mean lag over the batch's rollouts."""
    max: int = Field(ge=0)
    """Largest lag in the batch (never above `max_off_policy`)."""
    token_mean: float | None = Field(default=None, ge=0.0)
    """Mean lag over the batch's completion tokens, each token's from the version that sampled it
    (a rollout a reload split is partly fresher than its oldest token says)."""
    split_share: float | None = Field(default=None, ge=0.0, le=1.0)
    """Share of the batch's rollouts sampled across more than one version (a reload mid-rollout)."""
    completion_tokens_mean: float | None = Field(default=None, ge=0.0)
    """Mean completion length of the batch's rollouts."""
    stale_completion_tokens_mean: float | None = Field(default=None, ge=0.0)
    """Mean completion length of the rollouts dropped as stale since the previous step; None when
    none were. Above `completion_tokens_mean`, dropping stale work is starving the long rollouts
    (they take longest to sample, so they are the likeliest to fall behind)."""


class TrainStepCompleted(Event):
    """One optimizer step and what it trained on.

    Produced by the trainer on `train` (key: policy name); consumed by the dispatcher (to pace
    work against `max_off_policy`), the run display and metrics writers.
    """

    type: Literal["train.step_completed"] = "train.step_completed"
    policy: str = "policy"
    """Name of the policy being trained."""
    step: int = Field(ge=0)
    """Optimizer step number, starting at 1 for the first step."""
    policy_version: int = Field(ge=0)
    """Weight version the step produced."""
    rollout_ids: list[str] = Field(default_factory=list)
    """Every rollout trained in this step."""
    loss: float | None = None
    """Loss of the step; None when the step was skipped."""
    reward_mean: float = 0.0
    """Mean final reward of the step's environment rollouts (of all its samples when it had none)."""
    num_tokens: int = Field(default=0, ge=0)
    """Trained (loss-masked) tokens in the step."""
    tokens_per_s: float = Field(default=0.0, ge=0.0)
    """Trained tokens per second of step time."""
    grad_norm: float | None = None
    """Gradient norm before clipping; None when skipped."""
    staleness: Staleness | None = None
    """Version lag of the batch; None for an empty batch."""
    drops: dict[str, int] = Field(default_factory=dict)
    """Rollouts dropped since the previous step, by reason."""
    rewards_mean: dict[str, float] = Field(default_factory=dict)
    """Mean of each named reward (the environment's and the group rewards) over the step's rollouts."""
    metrics_mean: dict[str, float] = Field(default_factory=dict)
    """Mean of each environment metric (e.g. `completion_tokens`) over the step's rollouts."""
    loss_metrics: dict[str, float] = Field(default_factory=dict)
    """What the loss measured over the step's trained tokens: `clip_fraction` (share of tokens whose
    ratio was clipped), `ratio_mean` (mean pi_theta / pi_sampler), `masked_fraction` (dppo_mask's
    tokens left out), ... by loss."""
    samples: dict[str, int] = Field(default_factory=dict)
    """The step's samples by objective (`policy_gradient`, `sft`, `preference`), and under `production`
    how many of them were made from production feedback."""
    skipped_reason: str | None = None
    """Why the optimizer did not step (e.g. a NaN loss); None when it stepped."""
    wait_s: float = Field(default=0.0, ge=0.0)
    """Seconds the trainer waited for this step's batch after finishing the previous step (for the
    first step of a process: since it started). Over a run, the trainer's idle time."""
    completed_at_ms: int = Field(default_factory=now_ms)
    """When the step finished (epoch ms)."""


class RolloutsDropped(Event):
    """Rollouts that will never be trained, and why.

    Produced by the group scorer and the trainer on `drops` (key: group id); consumed by
    accounting and the run display.
    """

    SCHEMA_VERSION: ClassVar[int] = 3
    """2 added the feedback joiner's reason `unjoinable` and stage `feedback joiner`; 3 added
    `production` and the reason `overflow` (past a resource bound). Older payloads are valid as they are."""

    type: Literal["rollouts.dropped"] = "rollouts.dropped"
    rollout_ids: list[str]
    """The dropped rollouts (for feedback: the feedback ids)."""
    group_id: str | None = None
    """Their group, when all belong to one; None otherwise."""
    reason: DropReason
    """Why they were dropped."""
    stage: Literal["scorer", "trainer", "feedback joiner"]
    """Which component dropped them."""
    detail: str = ""
    """Specifics, e.g. `lag 5 > max_off_policy 4`."""
    production: bool = False
    """The dropped samples came from production feedback, not from the dispatcher's tasks (which
    counts back only its own)."""
