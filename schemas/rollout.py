"""Events of the rollout path: a task handed out, a rollout finished, its trace, its score.

    dispatcher ──TaskAssigned──▶ env worker ──RolloutCompleted, TraceRecorded──▶ group scorer
    group scorer ──ScoredRollout──▶ trainer          (topics: see `rollwire.schemas.topics`)

Token sequences are the ids the inference server sampled; nothing downstream re-tokenizes.
Completion-aligned lists (`completion_logprobs`, `loss_mask`, per-token advantages) all have
length `len(completion_token_ids)`; validators enforce it.
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rollwire.schemas.base import BlobPointer, Event, Part, new_id, now_ms


class SamplingParams(Part):
    """Sampling settings the interception endpoint enforces on every inference call."""

    temperature: float = Field(default=1.0, ge=0.0)
    """Softmax temperature; 1.0 samples from the policy itself (required for on-policy maths)."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus mass; 1.0 disables nucleus filtering."""
    max_tokens: int = Field(default=256, ge=1)
    """Most completion tokens per inference call."""
    stop: tuple[str, ...] = ()
    """Extra stop strings, besides the model's end-of-sequence token."""


class TaskAssigned(Event):
    """One task for one group of rollouts.

    Produced by the dispatcher on `tasks` (key: group id); consumed by env workers (one consumer
    group). The worker runs `group_size` rollouts of this task.
    """

    type: Literal["task.assigned"] = "task.assigned"
    task_id: str
    """Identifies the task row within its environment (stable across runs)."""
    group_id: str = Field(default_factory=new_id)
    """Identifies the group of rollouts sampled for this task in this run."""
    environment: str
    """Registered environment name, e.g. `reverse-digits`."""
    algorithm: str
    """Registered advantage algorithm for this group, e.g. `grpo`."""
    group_size: int = Field(ge=1)
    """Rollouts to sample for the group."""
    task: dict[str, object] = Field(default_factory=dict)
    """The task row as the environment's taskset defines it (prompt, answer, …)."""
    sampling: SamplingParams = SamplingParams()
    """Sampling settings for every inference call of these rollouts."""
    policy_version: int = Field(ge=0)
    """Newest weight version the dispatcher knew of when it issued the task."""
    issued_at_ms: int = Field(default_factory=now_ms)
    """When the dispatcher issued the task (epoch ms)."""


class SamplingStarted(Event):
    """A rollout made its first generation request: from here its tokens are sampled by the fleet's
    weights, so it counts against the dispatcher's off-policy budget; before, it waited on its
    environment (`BatchSettings.waiting_rollouts`).

    Produced by env workers on `sampling` (key: group id), once per rollout: at its first
    generation request, or with its result when it never made one (an environment that failed
    first). Consumed by the dispatcher.
    """

    type: Literal["sampling.started"] = "sampling.started"
    group_id: str
    sample_index: int = Field(ge=0)
    worker: str
    """The env worker running the rollout."""
    sampled: bool = True
    """False: the rollout ended without a generation request (sent with its result)."""


class WeightVersionSpan(Part):
    """Completion tokens `[start, end)` were sampled by weight version `version`."""

    version: int = Field(ge=0)
    """Weight version that produced these tokens."""
    start: int = Field(ge=0)
    """First completion-token index of the span."""
    end: int = Field(ge=0)
    """One past the last completion-token index of the span."""


class TokenSequence(Part):
    """One more token sequence of a rollout, trained with its advantage: calls that could not extend
    the rollout's main sequence (a chat template rewrote what was sampled before) and extend each
    other. Shapes as `RolloutCompleted`'s."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    loss_mask: list[int]
    weight_versions: list[WeightVersionSpan] = Field(default_factory=list)

    @model_validator(mode="after")
    def _aligned(self) -> TokenSequence:
        n = len(self.completion_token_ids)
        if len(self.completion_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(f"a branch's completion_logprobs ({len(self.completion_logprobs)}) and loss_mask "
                             f"({len(self.loss_mask)}) must have one entry per completion token ({n})")
        return self


class RolloutTimings(Part):
    """Wall-clock durations of one rollout, in seconds."""

    queued_s: float = Field(default=0.0, ge=0.0)
    """From the task's issue to the rollout's start."""
    inference_s: float = Field(default=0.0, ge=0.0)
    """Time spent waiting on inference calls."""
    environment_s: float = Field(default=0.0, ge=0.0)
    """Time spent in the harness and tools outside inference."""
    scoring_s: float = Field(default=0.0, ge=0.0)
    """Time spent computing rewards and metrics."""


ErrorKind = Literal["harness_crash", "timeout", "inference", "reward", "invalid_task", "abandoned", "too_long",
                    "resource_limit"]
"""What failed in a rollout (`RolloutError.kind`)."""

class RolloutError(Part):
    """Why a rollout has no usable result. Errored rollouts are published, counted, never trained."""

    kind: ErrorKind
    """What failed; `abandoned`: the env worker stopped before the rollout finished; `too_long`: a call
    would have passed the env worker's `max_rollout_tokens`; `resource_limit`: the harness's container
    hit its memory or process limit."""
    message: str
    """Human-readable reason, e.g. the exception text or the exit code."""


class RolloutCompleted(Event):
    """One finished rollout with exact token provenance.

    Produced by env workers on `rollouts` (key: group id); consumed by the group scorer.
    """

    type: Literal["rollout.completed"] = "rollout.completed"
    rollout_id: str = Field(default_factory=new_id)
    """Unique per rollout; consumers dedupe on it."""
    group_id: str
    """The group this rollout belongs to (from its `TaskAssigned`)."""
    task_id: str
    """The task row this rollout worked on."""
    environment: str
    """Registered environment name."""
    algorithm: str
    """Advantage algorithm the scorer applies to this group."""
    group_size: int = Field(ge=1)
    """Declared number of rollouts in the group."""
    sample_index: int = Field(ge=0)
    """Position of this rollout within its group, `0 <= sample_index < group_size`."""
    prompt_token_ids: list[int] = Field(default_factory=list)
    """Token ids of the first prompt, as the server tokenized it. Shape [P]."""
    completion_token_ids: list[int] = Field(default_factory=list)
    """Every token after the prompt: sampled tokens and, in multi-turn rollouts, environment and
    tool tokens between calls. Shape [C]."""
    completion_logprobs: list[float] = Field(default_factory=list)
    """Sampler log-probability of each completion token; 0.0 where `loss_mask` is 0. Shape [C]."""
    loss_mask: list[int] = Field(default_factory=list)
    """1 where the token was sampled by the policy and is trained on, 0 for environment or tool
    tokens. Shape [C]."""
    weight_versions: list[WeightVersionSpan] = Field(default_factory=list)
    """Which weight version sampled which completion tokens; empty when `error` is set."""
    rewards: dict[str, float] = Field(default_factory=dict)
    """Each reward function's value by name, before weighting."""
    reward: float = 0.0
    """Weighted sum of `rewards` (the environment's weights); group rewards come later."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Logged-only measurements by name (never used as reward)."""
    timings: RolloutTimings = RolloutTimings()
    """Where the rollout's time went."""
    error: RolloutError | None = None
    """Why the rollout failed; None for a usable rollout."""
    trace: BlobPointer | None = None
    """Where the full trace is stored when it was too large for `TraceRecorded`; None otherwise."""
    traceparent: str | None = None
    """W3C trace context of the rollout's span, so that scoring (which may happen long after, in
    another process, from stored group state) continues the rollout's trace; None when untraced."""
    question: str | None = None
    """What the task asked, as text (`Taskset.task_text`), for group rewards that read it (a
    pairwise judge); None when errored, or from env workers before it."""
    answer: str | None = None
    """The harness's final answer text (what the rewards judged), for group rewards that compare
    answers; None when errored, or from env workers before it."""
    branches: list[TokenSequence] = Field(default_factory=list)
    """The rollout's other token sequences, trained with its advantage like the main one: calls that
    branched off it (a template that rewrote history), kept where the environment says `branches =
    "all"`; empty otherwise (they are in the trace, and counted in `metrics`)."""

    def _spans(self) -> list[WeightVersionSpan]:
        return [*self.weight_versions, *(span for branch in self.branches for span in branch.weight_versions)]

    @property
    def min_version(self) -> int | None:
        """Oldest weight version that sampled any trained token (branches too); None when nothing was sampled."""
        return min((s.version for s in self._spans()), default=None)

    @property
    def max_version(self) -> int | None:
        """Newest weight version that sampled any trained token (branches too); None when nothing was sampled."""
        return max((s.version for s in self._spans()), default=None)

    @model_validator(mode="after")
    def _aligned(self) -> RolloutCompleted:
        n = len(self.completion_token_ids)
        if len(self.completion_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"completion_logprobs ({len(self.completion_logprobs)}) and loss_mask "
                f"({len(self.loss_mask)}) must have one entry per completion token ({n})")
        if self.sample_index >= self.group_size:
            raise ValueError(f"sample_index {self.sample_index} must be < group_size {self.group_size}")
        for span in self.weight_versions:
            if not 0 <= span.start <= span.end <= n:
                raise ValueError(f"weight-version span [{span.start}, {span.end}) lies outside "
                                 f"the {n} completion tokens")
        return self


class InferenceCall(Part):
    """One chat-completions call the interception endpoint forwarded and recorded."""

    prompt_token_ids: list[int]
    """The prompt exactly as the server received it, after chat templating. Shape [P]."""
    completion_token_ids: list[int]
    """The tokens the server sampled. Shape [C]."""
    completion_logprobs: list[float]
    """Sampler log-probability of each sampled token. Shape [C]."""
    weight_versions: list[WeightVersionSpan] = Field(default_factory=list)
    """Which weight version sampled which of this call's tokens."""
    finish_reason: str | None = None
    """`stop`, `length`, `tool_calls` …; None if the server gave none."""
    latency_s: float = Field(default=0.0, ge=0.0)
    """Wall-clock time of the call."""


class TraceNode(Part):
    """One node of a rollout's message graph."""

    node_id: int = Field(ge=0)
    """Index of this node within the trace."""
    parent_id: int | None = None
    """The node this one follows; None for a root."""
    branch: int = Field(default=0, ge=0)
    """0 on the main line; a new number where the conversation forks (sub-agent, or a context that
    re-rendering would not reproduce token for token)."""
    kind: Literal["message", "llm_call", "tool_call", "tool_result"]
    """What this node records."""
    role: str | None = None
    """Chat role for messages (`system`, `user`, `assistant`, `tool`); None for other kinds."""
    content: str = ""
    """Message or tool text."""
    call: InferenceCall | None = None
    """Token-level record for `llm_call` nodes; None for other kinds."""


class TraceRecorded(Event):
    """The message graph of one rollout, with per-call token ids.

    Produced by env workers on `traces` (key: group id); consumed by debugging and replay tools.
    """

    type: Literal["trace.recorded"] = "trace.recorded"
    rollout_id: str
    """The rollout this trace belongs to."""
    group_id: str
    """The rollout's group."""
    nodes: list[TraceNode] = Field(default_factory=list)
    """The graph, in creation order; empty when `blob` holds it."""
    blob: BlobPointer | None = None
    """Where the graph is stored when it is too large for a message; None when `nodes` holds it."""
    completion: str = ""
    """The answer the harness returned: the text the reward functions judged (replay judges it again)."""
    finish_reason: str | None = None
    """Why the rollout's last inference call stopped (`stop`, `length`, …); None without a call."""


class ProductionOrigin(Part):
    """Where a training sample made from production feedback came from."""

    source: str
    """The application that collected the feedback."""
    feedback_id: str
    """The feedback that made the sample."""
    response_ids: list[str] = Field(default_factory=list)
    """The receipts of the responses it judges (two for a preference); empty when served elsewhere."""
    served_at_ms: int
    """When the (first) judged response was served, or the feedback received when that is unknown
    (epoch ms): the trainer's `feedback.max_age_s` counts from it."""


class ScoredRollout(Event):
    """A training sample: a rollout with its group rewards applied and its advantage computed, or a
    supervised or preference sample made from production feedback.

    Produced by the group scorer and the feedback joiner on `scored` (key: group id); consumed by
    the trainer. By `objective`:

        policy_gradient  exactly one of `advantage` (per sequence) and `token_advantages` (per
                         token) is set; the trainer's `loss` trains it
        sft              `rollout` holds a target response (its tokens are not sampled: logprobs 0);
                         trained by negative log-likelihood; no advantage
        preference       `rollout` is the chosen response, `rejected` the other, both as sampled
                         (their logprobs, recorded at sampling, are the reference); no advantage
    """

    SCHEMA_VERSION: ClassVar[int] = 2
    """2: `objective`, `rejected`, `production` (a v1 reader would train an SFT sample as a rollout)."""

    type: Literal["rollout.scored"] = "rollout.scored"
    rollout: RolloutCompleted
    """The rollout as the env worker published it (for a preference: the chosen response)."""
    objective: Literal["policy_gradient", "sft", "preference"] = "policy_gradient"
    """How the trainer learns from the sample (see the class docstring)."""
    rejected: RolloutCompleted | None = None
    """For `preference`: the response not chosen; None otherwise."""
    production: ProductionOrigin | None = None
    """For samples made from production feedback: where they came from; None for environment rollouts."""
    algorithm: str
    """Advantage algorithm that produced the advantage."""
    group_rewards: dict[str, float] = Field(default_factory=dict)
    """Group reward functions' contributions by name (e.g. a conciseness bonus)."""
    reward: float
    """Final reward: the rollout's reward plus the sum of `group_rewards`."""
    advantage: float | None = None
    """Sequence-level advantage applied to every trained token; None when per-token."""
    token_advantages: list[float] | None = None
    """Per-token advantages, shape [C]; None when sequence-level."""
    group_reward_mean: float = 0.0
    """Mean final reward over the scored group, for metrics."""

    @model_validator(mode="after")
    def _one_advantage(self) -> ScoredRollout:
        if (self.rejected is None) == (self.objective == "preference"):
            raise ValueError("a preference sample needs `rejected` (the response not chosen); no other sample has one")
        if self.objective != "policy_gradient":
            if self.advantage is not None or self.token_advantages is not None:
                raise ValueError(f"an {self.objective} sample has no advantage: leave advantage and token_advantages "
                                 "unset")
            if not math.isfinite(self.reward):
                raise ValueError("reward must be a finite number")
            return self
        if (self.advantage is None) == (self.token_advantages is None):
            raise ValueError("set exactly one of advantage (per sequence) and token_advantages (per token)")
        values = self.token_advantages if self.token_advantages is not None else [self.advantage]
        if self.token_advantages is not None and len(values) != len(self.rollout.completion_token_ids):
            raise ValueError(f"token_advantages has {len(values)} entries for "
                             f"{len(self.rollout.completion_token_ids)} completion tokens")
        if not all(v is not None and math.isfinite(v) for v in values) or not math.isfinite(self.reward):
            raise ValueError("advantages and reward must be finite numbers")
        return self
