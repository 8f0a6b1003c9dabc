"""Every setting of the trainer, in one module that imports no torch: a recipe is parsed and
checked (loss names and parameters included) by processes that never load a model.

    TrainerSettings   the trainer (`[trainer]` of a recipe, `rollwire train --config`)
    ├── ModelSettings   which weights, device, dtype, LoRA      (`[trainer.model]`)
    ├── BatchSettings   batching and staleness                   (`[trainer.batch]`, also the
    │                   dispatcher's budget: it is derived from these, never typed twice)
    └── FeedbackTrainingSettings  production feedback in batches, and its losses (`[trainer.feedback]`)
    WarmStartSettings  the supervised warm start before RL      (`[warm_start]`)
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwire.trainer import losses
from rollwire.trainer.corrections import CorrectionSpec


class BatchSettings(BaseModel):
    """How the trainer's batches are formed."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    max_off_policy: int = Field(default=2, ge=0)
    """Most policy versions a rollout's oldest token may lag the trainer; older ones are dropped."""
    batch_rollouts: int | None = Field(default=64, ge=1)
    """Rollouts per step; None to pack by tokens only."""
    batch_tokens: int | None = Field(default=None, ge=1)
    """Most prompt plus completion tokens per step; None to pack by rollouts only."""
    waiting_rollouts: int | None = Field(default=None, ge=0)
    """Rollouts the dispatcher may have issued that have not made their first generation request
    yet (waiting on their environment, or on a free env-worker slot) without counting them against
    the off-policy budget: a rollout's tokens get their version when it samples, not when its task
    is issued. None: `max_off_policy` x `batch_rollouts` (0 for the synchronous loop, which stays
    one batch at a time). Past the allowance a waiting rollout counts as if sampling."""
    stale_drop_target: float = Field(default=0.1, gt=0, le=1)
    """The share of rollouts dropped as stale that the dispatcher tolerates: above it (smoothed
    over about five steps) the waiting allowance halves each step, and below half of it the
    allowance grows back over 50 steps (`producers.dispatcher.WaitingAllowance`). 1: it never narrows."""
    dedupe_window: int = Field(default=200_000, ge=1)
    """Rollout ids remembered to recognise redeliveries."""

    @model_validator(mode="after")
    def _some_limit(self) -> BatchSettings:
        if self.batch_rollouts is None and self.batch_tokens is None:
            raise ValueError("set trainer.batch.batch_rollouts or trainer.batch.batch_tokens (or both)")
        return self


class ProductionMix(BaseModel):
    """How samples made from production feedback (`ScoredRollout.production`) join the batches.

    They were served by whatever version production ran, often many versions behind the trainer,
    so `max_off_policy` does not apply to them: they are bounded by age instead, and the losses'
    importance ratio against the served logprobs corrects for the version gap.
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    share: float = Field(default=0.25, ge=0.0, le=1.0)
    """Most of a batch (in samples) production feedback may fill; environment rollouts fill the
    rest. 0 trains none (they are held until `max_age_s`, then dropped); 1 may train on them alone."""
    max_age_s: float = Field(default=7 * 86400.0, gt=0)
    """Production samples served longer ago than this are dropped as stale."""
    max_pending: int = Field(default=10_000, ge=1)
    """Most production samples held waiting for room in a batch (environment rollouts are bounded
    by the dispatcher's budget; feedback arrives at the rate users give it): past it the oldest
    are dropped (`overflow`) rather than memory growing without bound."""

    def cap(self, batch_rollouts: int | None) -> int | None:
        """Most production samples in one batch; None: no cap by count (batches packed by tokens)."""
        return None if batch_rollouts is None else int(self.share * batch_rollouts)


class LoraSettings(BaseModel):
    """Train a LoRA adapter instead of the full weights (needs the `lora` extra: peft)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    rank: int = Field(default=8, ge=1)
    """Adapter rank."""
    alpha: float = Field(default=16.0, gt=0)
    """Scaling numerator (scale = alpha / rank)."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names the adapter wraps."""


class ModelSettings(BaseModel):
    """Which model the trainer loads, and where it runs."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    path: str = ""
    """Local directory or hub name of the starting weights (version 0); a run fills it in from its
    `[model]` table."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` takes CUDA when present."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """`auto`: bfloat16 on CUDA, float32 on CPU (deterministic)."""
    lora: LoraSettings | None = None
    """Train a LoRA adapter; None trains every weight."""


class FeedbackTrainingSettings(ProductionMix):
    """Samples made from production feedback (`rollwire join`): how many a batch takes and how old
    (`ProductionMix`), and the losses of the kinds only feedback makes."""

    sft_weight: float = Field(default=1.0, ge=0)
    """Weight of corrections (SFT samples, trained by negative log-likelihood) in the step's loss."""
    preference_loss: str = "dpo"
    """Registered pairwise loss for preferences (`rollwire.trainer.losses`): dpo."""
    preference_params: dict[str, float] = Field(default_factory=dict)
    """Its parameters, e.g. `{beta = 0.1}`."""
    preference_weight: float = Field(default=1.0, ge=0)
    """Weight of preference pairs in the step's loss."""

    @model_validator(mode="after")
    def _loss_exists(self) -> FeedbackTrainingSettings:
        losses.check(self.preference_loss, self.preference_params, pairwise=True)
        return self


class RetentionSettings(BaseModel):
    """`[trainer.retention]`: which published versions the store keeps (unset: every one)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    keep_last: int | None = Field(default=None, ge=1)
    """Keep the newest this many versions; None keeps every version (no pruning at all)."""
    keep_every: int = Field(default=0, ge=0)
    """Also keep every version that is a multiple of this, for good (0: none)."""

    def keeps(self, version: int, newest: int) -> bool:
        """Whether the policy alone keeps `version` when `newest` is the newest published."""
        if self.keep_last is None or version > newest - self.keep_last:
            return True
        return bool(self.keep_every) and version % self.keep_every == 0


class DirectSettings(BaseModel):
    """Serving each new version to the replicas straight from the trainer's memory over gloo
    (`rollwire.core.weight_transfer`); the object store stays the record and the fallback."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = False
    """Offer every full version directly (`WeightsPublished.direct`); it holds one more copy of the
    published weights in the trainer's host memory. Replicas take the offer unless told not to
    (`[inference] direct_weights`)."""
    host: str = "127.0.0.1"
    """Address the replicas' engines reach the trainer at (this host's address on the cluster network
    when they run elsewhere). The exchange is unauthenticated: keep it on a private network."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of the rendezvous store; 0 picks a free one (the event carries it)."""
    timeout_s: float = Field(default=60.0, gt=0)
    """A transfer that stalls this long is given up; the replica fetches from the store."""


class TrainerSettings(BaseModel):
    """Everything the trainer needs besides the log and the store."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: ModelSettings = Field(default_factory=ModelSettings)
    """The policy model."""
    batch: BatchSettings = Field(default_factory=BatchSettings)
    """Batching and staleness."""
    feedback: FeedbackTrainingSettings = Field(default_factory=FeedbackTrainingSettings)
    """Production feedback samples: their share of a batch, their age, their losses."""
    policy: str = "policy"
    """Policy name: the weights topic key and the store prefix."""
    processes: int = Field(default=1, ge=1)
    """Data-parallel ranks (`rollwire.trainer.distributed`): `rollwire run` starts the trainer under
    `torchrun --nproc-per-node N` (gloo on CPU, NCCL on CUDA); each rank trains its share of every
    batch. Outside a run, start `rollwire train` with torchrun yourself."""
    loss: str = "ppo_clip"
    """Registered loss of policy-gradient samples (`rollwire.trainer.losses`): ppo_clip, dppo_mask, ipo, reinforce,
    nll, reverse_kl."""
    loss_params: dict[str, float] = Field(default_factory=dict)
    """Parameters of the loss, e.g. `{eps_low = 0.2}`; checked against the loss when loaded."""
    corrections: list[CorrectionSpec] = Field(default_factory=list)
    """Off-policy corrections before the loss, in order, their weights multiplied
    (`rollwire.trainer.corrections`): token_tis, sequence_mis, geo_rs, icepop, measure; e.g.
    `[{ name = "token_tis", cap = 2.0 }]`. Each reports what it capped or masked."""
    lr: float = Field(default=3e-4, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(default=1.0, gt=0)
    """Gradient-norm clip."""
    micro_batch_rollouts: int = Field(default=16, ge=1)
    """Rollouts per forward/backward (gradient accumulation over the batch)."""
    publish_every: int = Field(default=1, ge=1)
    """Publish weights every this many versions."""
    snapshot_every: int = Field(default=10, ge=1)
    """Store every this-many-th published version whole (a snapshot) and those between as deltas: the
    elements whose bits changed since the previous one (`rollwire.core.weight_deltas`), a few percent
    of a bfloat16 version at fine-tuning learning rates. A replica that missed one rebuilds from the
    snapshot before it. 1: every version whole. LoRA adapters are always whole; so is the first
    version a trainer process publishes."""
    direct: DirectSettings = Field(default_factory=DirectSettings)
    """Also send each version to the replicas directly, with no object-store read (off by default)."""
    checkpoint_dir: Path = Path("runs/default/trainer")
    """Where the trainer's checkpoints go (local disk)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """The newest checkpoints kept (a restart needs only the last)."""
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    """Which published weight versions the object store keeps (`rollwire.trainer.retention`; default: all)."""
    keep_checkpoint_every: int = Field(default=0, ge=0)
    """Also keep the checkpoint of every N-th step for good (0: none): the starting points
    `rollwire replay train --from-step` can retrain from."""
    seed: int = 0
    """Torch seed: the CPU path is deterministic for a given seed and batch order."""

    @model_validator(mode="after")
    def _loss_exists(self) -> TrainerSettings:
        losses.check(self.loss, self.loss_params)
        return self

    @model_validator(mode="after")
    def _replicas_can_keep_up(self) -> TrainerSettings:
        if self.publish_every - 1 > self.batch.max_off_policy:
            raise ValueError(f"publish_every = {self.publish_every} with batch.max_off_policy = "
                             f"{self.batch.max_off_policy}: replicas only get every {self.publish_every}th version, "
                             f"so every rollout would lag up to {self.publish_every - 1} versions and be dropped; "
                             f"raise max_off_policy to {self.publish_every - 1} or lower publish_every")
        return self


class WarmStartSettings(BaseModel):
    """The supervised warm start; `steps = 0` skips it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    steps: int = Field(default=500, ge=0)
    """Optimizer steps."""
    batch: int = Field(default=64, ge=1)
    """Teacher examples per step."""
    lr: float = Field(default=3e-3, gt=0)
    """AdamW learning rate."""
    seed: int = 0
    """Seed of the teacher's noise and of torch."""
