"""The feedback joiner's logic, free of any transport: production feedback joined with the response it
judges, by receipt, into training samples. One pure step per event or tick, as `GroupScorer`.

    served   (response.served, key: receipt) ──▶ on_served(state, served)    ─┐
    feedback (feedback.received)             ──▶ on_feedback(state, item)   ─┼─▶ new state
    ticks                                    ──▶ on_tick(state)             ─┘   + samples on `scored`
                                                                                 + drops with a reason

State is kept per receipt (`FeedbackJoinState`): the served record once it arrived, feedback that
came first and waits for it (at most `window_s`), and the feedback ids already turned into samples
(a resend is recognised and ignored). A rating becomes a `ScoredRollout`: the served call as the
rollout (prompt and sampled ids, the sampler's logprobs and weight-version spans, as recorded, so
the trainer corrects for the version that served it), reward = the rating, advantage = the rating
less its source's baseline (`baselines`, by name). Corrections and preferences are refused with a
reason until the SFT and preference paths exist.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rollwire.registry import Registry
from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, SourceBaseline
from rollwire.schemas.rollout import RolloutCompleted, ScoredRollout
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.training import RolloutsDropped

BaselineFn = Callable[[float, int, float], float]
"""`(running mean of the source's ratings, ratings counted, this rating) -> baseline`."""

BASELINES: Registry[BaselineFn] = Registry("feedback baseline")
"""How a rating's advantage is centred, by name: `advantage = rating - baseline`."""


@BASELINES.register("none")
def _no_baseline(mean: float, count: int, rating: float) -> float:
    """Advantage = the rating itself."""
    return 0.0


@BASELINES.register("source_mean")
def _source_mean(mean: float, count: int, rating: float) -> float:
    """The mean of the source's earlier ratings (0 before the first)."""
    return mean if count else 0.0


class FeedbackJoinSettings(BaseModel):
    """Settings of the feedback joiner."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    window_s: float = Field(default=3600.0, gt=0)
    """How long feedback waits for its served record before it is dropped as unjoinable."""
    served_retention_s: float = Field(default=7 * 86400.0, gt=0)
    """How long a served record is kept for feedback to arrive."""
    baseline: Annotated[str, AfterValidator(BASELINES.check)] = "source_mean"
    """Per-source baseline a rating's advantage is measured from (`BASELINES`)."""
    algorithm: str = "feedback"
    """The algorithm name the samples carry (the trainer's loss does not depend on it)."""


@dataclass
class JoinStep:
    """What one call produced."""

    state: FeedbackJoinState | None
    """The receipt's new state; None forgets it."""
    events: list[Event] = field(default_factory=list)
    """`ScoredRollout` samples and `RolloutsDropped`."""
    baselines: dict[str, SourceBaseline] = field(default_factory=dict)
    """Sources whose baseline changed, to store."""
    duplicate: bool = False


class FeedbackJoiner:
    """Holds no data itself: drivers pass each receipt's state (and the sources' baselines) in."""

    def __init__(self, settings: FeedbackJoinSettings) -> None:
        self.settings = settings
        self._baseline = BASELINES.get(settings.baseline)

    def on_served(self, state: FeedbackJoinState | None, served: ResponseServed,
                  baselines: dict[str, SourceBaseline], now: int | None = None) -> JoinStep:
        now = now_ms() if now is None else now
        if state is not None and state.served is not None:
            return JoinStep(state, duplicate=True)
        state = (state or FeedbackJoinState(response_id=served.response_id, first_seen_ms=now))
        state = state.model_copy(update={"served": served})
        step = JoinStep(state)
        for item in state.waiting:
            self._join(step, item, baselines)
        step.state = step.state.model_copy(update={"waiting": []}) if step.state else None
        return step

    def on_feedback(self, state: FeedbackJoinState | None, item: FeedbackReceived,
                    baselines: dict[str, SourceBaseline], now: int | None = None) -> JoinStep:
        now = now_ms() if now is None else now
        receipt = item.response_id
        if receipt is None:
            return JoinStep(state, [self._drop(item, "unjoinable", "it names no receipt (response_id): only "
                                               "responses served by `rollwire serve` can train yet")])
        if state is not None and (item.feedback_id in state.joined
                                  or any(w.feedback_id == item.feedback_id for w in state.waiting)):
            return JoinStep(state, duplicate=True)
        state = state or FeedbackJoinState(response_id=receipt, first_seen_ms=now)
        if item.kind != "rating":
            step = JoinStep(state.model_copy(update={"joined": [*state.joined, item.feedback_id]}))
            step.events.append(self._drop(item, "invalid", f"{item.kind} feedback cannot train yet: only ratings"))
            return step
        if state.served is None:
            return JoinStep(state.model_copy(update={"waiting": [*state.waiting, item]}))
        step = JoinStep(state)
        self._join(step, item, baselines)
        return step

    def on_tick(self, state: FeedbackJoinState, now: int | None = None) -> JoinStep:
        """Drops feedback that waited past `window_s`; forgets a receipt past `served_retention_s`."""
        now = now_ms() if now is None else now
        window = self.settings.window_s * 1000
        late = [w for w in state.waiting if now - w.received_at_ms >= window]
        events: list[Event] = [self._drop(w, "unjoinable", f"no served record of {state.response_id} arrived "
                                                           f"within {self.settings.window_s:g} s") for w in late]
        if late:
            state = state.model_copy(update={"waiting": [w for w in state.waiting if w not in late],
                                             "joined": [*state.joined, *(w.feedback_id for w in late)]})
        served_at = state.served.served_at_ms if state.served is not None else state.first_seen_ms
        if not state.waiting and now - served_at >= self.settings.served_retention_s * 1000:
            return JoinStep(None, events)
        return JoinStep(state, events)

    def _join(self, step: JoinStep, item: FeedbackReceived, baselines: dict[str, SourceBaseline]) -> None:
        assert step.state is not None and step.state.served is not None
        served, rating = step.state.served, float(item.rating or 0.0)
        current = step.baselines.get(item.source) or baselines.get(item.source) or SourceBaseline(source=item.source)
        baseline = self._baseline(current.mean, current.count, rating)
        call = served.call
        rollout = RolloutCompleted(
            rollout_id=item.feedback_id, group_id=f"feedback-{served.response_id}", task_id=served.response_id,
            environment=f"feedback/{item.source}", algorithm=self.settings.algorithm, group_size=1, sample_index=0,
            prompt_token_ids=call.prompt_token_ids, completion_token_ids=call.completion_token_ids,
            completion_logprobs=call.completion_logprobs, loss_mask=[1] * len(call.completion_token_ids),
            weight_versions=call.weight_versions, rewards={"rating": rating}, reward=rating,
            traceparent=served.traceparent)
        step.events.append(ScoredRollout(rollout=rollout, algorithm=self.settings.algorithm, reward=rating,
                                         advantage=rating - baseline, group_reward_mean=baseline))
        count = current.count + 1
        step.baselines[item.source] = SourceBaseline(source=item.source, count=count,
                                                     mean=current.mean + (rating - current.mean) / count)
        step.state = step.state.model_copy(update={"joined": [*step.state.joined, item.feedback_id]})

    @staticmethod
    def _drop(item: FeedbackReceived, reason: str, detail: str) -> RolloutsDropped:
        return RolloutsDropped(rollout_ids=[item.feedback_id], group_id=item.response_id or item.feedback_id,
                               reason=reason, stage="feedback joiner", detail=detail)
