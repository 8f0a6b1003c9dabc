"""The feedback joiner's state machine: a rating joined with the response it judges, whichever
arrives first, becomes one training sample with the served tokens and logprobs; resends,
unsupported kinds and feedback whose response never comes are accounted for with a reason."""

from __future__ import annotations

import pytest
from builders import served
from pydantic import ValidationError

from rollwire.schemas import FeedbackReceived, RolloutsDropped, ScoredRollout
from rollwire.streams.feedback_join import FeedbackJoiner, FeedbackJoinSettings, SourceBaseline

T0 = 1_790_000_000_000


def rating(feedback_id: str, value: float, receipt: str = "resp-1", source: str = "chat-app", at: int = T0):
    return FeedbackReceived(feedback_id=feedback_id, kind="rating", rating=value, response_id=receipt, source=source,
                            received_at_ms=at)


def test_a_rating_after_its_response_becomes_a_sample_of_the_served_tokens():
    joiner = FeedbackJoiner(FeedbackJoinSettings(baseline="none"))
    response = served()
    step = joiner.on_served(None, response, {}, now=T0)
    assert step.events == [] and step.state.served == response
    step = joiner.on_feedback(step.state, rating("fb-1", 0.5), {}, now=T0 + 5)
    [sample] = step.events
    assert isinstance(sample, ScoredRollout) and (sample.reward, sample.advantage) == (0.5, 0.5)
    rollout = sample.rollout
    assert rollout.rollout_id == "fb-1" and rollout.environment == "feedback/chat-app"
    assert rollout.prompt_token_ids == response.call.prompt_token_ids
    assert rollout.completion_token_ids == response.call.completion_token_ids
    assert rollout.completion_logprobs == response.call.completion_logprobs  # the sampler's, for off-policy correction
    assert rollout.weight_versions == response.call.weight_versions and rollout.loss_mask == [1, 1, 1]
    again = joiner.on_feedback(step.state, rating("fb-1", -1.0), {}, now=T0 + 9)
    assert again.duplicate and again.events == []


def test_feedback_that_comes_first_waits_for_its_response():
    joiner = FeedbackJoiner(FeedbackJoinSettings(baseline="none"))
    step = joiner.on_feedback(None, rating("fb-1", 1.0), {}, now=T0)
    step = joiner.on_feedback(step.state, rating("fb-2", -1.0), {}, now=T0 + 1)
    assert step.events == [] and [w.feedback_id for w in step.state.waiting] == ["fb-1", "fb-2"]
    joined = joiner.on_served(step.state, served(), {}, now=T0 + 2)
    assert [(e.rollout.rollout_id, e.reward) for e in joined.events] == [("fb-1", 1.0), ("fb-2", -1.0)]
    assert joined.state.waiting == [] and joined.state.joined == ["fb-1", "fb-2"]
    assert joiner.on_served(joined.state, served(), {}, now=T0 + 3).duplicate


def test_the_source_baseline_centres_ratings_per_source():
    joiner = FeedbackJoiner(FeedbackJoinSettings(baseline="source_mean"))
    baselines: dict[str, SourceBaseline] = {}
    state = joiner.on_served(None, served(), baselines, now=T0).state
    advantages = []
    for i, (value, source) in enumerate([(1.0, "a"), (0.0, "a"), (0.5, "b"), (-1.0, "a")]):
        step = joiner.on_feedback(state, rating(f"fb-{i}", value, source=source), baselines, now=T0 + i)
        state = step.state
        baselines.update(step.baselines)
        advantages.append(step.events[0].advantage)
    assert advantages == [1.0, 0.0 - 1.0, 0.5, -1.0 - 0.5]
    assert baselines["a"].count == 3 and baselines["a"].mean == pytest.approx(0.0)


def test_late_unsupported_and_receiptless_feedback_is_dropped_with_a_reason():
    joiner = FeedbackJoiner(FeedbackJoinSettings(window_s=60, served_retention_s=600))
    waiting = joiner.on_feedback(None, rating("fb-late", 1.0), {}, now=T0).state
    assert joiner.on_tick(waiting, now=T0 + 59_000).events == []
    expired = joiner.on_tick(waiting, now=T0 + 60_000)
    [drop] = expired.events
    assert isinstance(drop, RolloutsDropped) and (drop.reason, drop.stage) == ("unjoinable", "feedback joiner")
    assert "within 60 s" in drop.detail and expired.state.waiting == []
    assert joiner.on_feedback(expired.state, rating("fb-late", 1.0), {}).duplicate  # a resend stays dropped

    correction = FeedbackReceived(feedback_id="fb-c", kind="correction", correction="21", response_id="resp-1",
                                  source="chat-app")
    refused = joiner.on_feedback(None, correction, {}, now=T0)
    assert [(d.reason, d.rollout_ids) for d in refused.events] == [("invalid", ["fb-c"])]
    elsewhere = FeedbackReceived(feedback_id="fb-e", kind="rating", rating=1, source="chat-app",
                                 messages=[{"role": "user", "content": "hi"}])
    assert joiner.on_feedback(None, elsewhere, {}).events[0].reason == "unjoinable"
    kept = joiner.on_served(None, served(served_at_ms=T0), {}, now=T0).state
    assert joiner.on_tick(kept, now=T0 + 599_000).state is not None
    assert joiner.on_tick(kept, now=T0 + 600_000).state is None  # forgotten after served_retention_s


def test_an_unknown_baseline_is_refused_when_the_settings_load():
    with pytest.raises(ValidationError, match="source_mean"):
        FeedbackJoinSettings(baseline="sourcemean")
