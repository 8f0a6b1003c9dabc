"""The feedback joiner's state machine: a rating joined with the response it judges, whichever
arrives first, becomes one training sample with the served tokens and logprobs; resends,
unsupported kinds and feedback whose response never comes are accounted for with a reason."""

from __future__ import annotations

import pytest
from builders import served
from pydantic import ValidationError

from rollwire.schemas import FeedbackReceived, InferenceCall, PartnerRecord, RolloutsDropped, ScoredRollout
from rollwire.streams.feedback_join import ChatTemplateRenderer, FeedbackJoiner, FeedbackJoinSettings, SourceBaseline

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
    refused = joiner.on_feedback(joiner.on_served(None, served(), {}).state, correction, {}, now=T0)
    assert [(d.reason, d.rollout_ids) for d in refused.events] == [("invalid", ["fb-c"])]
    assert "tokenizer" in refused.events[0].detail  # no renderer: corrections cannot be tokenized
    elsewhere = FeedbackReceived(feedback_id="fb-e", kind="rating", rating=1, source="chat-app",
                                 messages=[{"role": "user", "content": "hi"}])
    assert joiner.on_feedback(None, elsewhere, {}).events[0].reason == "unjoinable"
    kept = joiner.on_served(None, served(served_at_ms=T0), {}, now=T0).state
    assert joiner.on_tick(kept, now=T0 + 599_000).state is not None
    assert joiner.on_tick(kept, now=T0 + 600_000).state is None  # forgotten after served_retention_s


def test_an_unknown_baseline_is_refused_when_the_settings_load():
    with pytest.raises(ValidationError, match="source_mean"):
        FeedbackJoinSettings(baseline="sourcemean")


@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
    """A directory holding the tiny character tokenizer and its ChatML template."""
    from rollwire.trainer.tiny import build_char_tokenizer
    folder = tmp_path_factory.mktemp("tokenizer")
    build_char_tokenizer().save_pretrained(folder)
    return folder


def chat_served(tokenizer, receipt: str, messages, answer: str, *, at: int = T0, version: int = 3):
    """A served chat response as vLLM would record it: the prompt rendered by the template, then the answer."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    completion = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    call = InferenceCall(prompt_token_ids=prompt, completion_token_ids=completion,
                         completion_logprobs=[-0.5] * len(completion),
                         weight_versions=[{"version": version, "start": 0, "end": len(completion)}])
    return served(response_id=receipt, messages=messages, call=call, completion=answer, served_at_ms=at)


def test_a_correction_becomes_an_sft_sample_rendered_with_the_served_chat_template(char_model):
    renderer = ChatTemplateRenderer(str(char_model))
    tokenizer = renderer.tokenizer
    joiner = FeedbackJoiner(FeedbackJoinSettings(tokenizer=str(char_model)), renderer)
    conversation = [{"role": "user", "content": "R:123>"}]
    response = chat_served(tokenizer, "resp-1", conversation, "312")
    item = FeedbackReceived(feedback_id="fb-c", kind="correction", correction="321", response_id="resp-1",
                            source="chat-app", received_at_ms=T0 + 50)
    waiting = joiner.on_feedback(None, item, {}, now=T0)  # before its response: it waits
    assert waiting.events == [] and waiting.state.waiting == [item]
    [sample] = joiner.on_served(waiting.state, response, {}, now=T0 + 1).events
    assert isinstance(sample, ScoredRollout) and sample.objective == "sft" and sample.advantage is None
    rollout = sample.rollout
    assert rollout.prompt_token_ids == response.call.prompt_token_ids  # the served prompt, not trained
    assert tokenizer.decode(rollout.completion_token_ids) == "321<|im_end|>"  # the template's turn, to its end token
    assert rollout.loss_mask == [1] * 4 and rollout.completion_logprobs == [0.0] * 4 and rollout.weight_versions == []
    assert sample.production.served_at_ms == T0 and sample.production.response_ids == ["resp-1"]

    # served elsewhere: the conversation the app sent is rendered the same way, nothing to wait for
    elsewhere = item.model_copy(update={"feedback_id": "fb-e", "response_id": None, "messages": conversation})
    [direct] = joiner.on_feedback(None, elsewhere, {}, now=T0).events
    assert direct.rollout.completion_token_ids == rollout.completion_token_ids and direct.production.response_ids == []
    # a plain completion: the corrected text, then end of sequence
    completion = response.model_copy(update={"endpoint": "completion", "messages": [], "prompt": "R:123>",
                                              "response_id": "resp-2"})
    text = item.model_copy(update={"feedback_id": "fb-t", "response_id": "resp-2"})
    [plain] = joiner.on_served(joiner.on_feedback(None, text, {}).state, completion, {}).events
    assert tokenizer.decode(plain.rollout.completion_token_ids) == "321<|eos|>"
    # a template that does not give back the served prompt (another model's tokenizer): refused, not mis-trained
    other = response.model_copy(update={"response_id": "resp-3", "call": response.call.model_copy(
        update={"prompt_token_ids": [1, *response.call.prompt_token_ids]})})
    wrong = item.model_copy(update={"feedback_id": "fb-w", "response_id": "resp-3"})
    [drop] = joiner.on_served(joiner.on_feedback(None, wrong, {}).state, other, {}).events
    assert drop.reason == "invalid" and "does not reproduce the served prompt" in drop.detail


def test_a_preference_waits_for_both_responses_in_either_order_and_pairs_them_chosen_first(char_model):
    tokenizer = ChatTemplateRenderer(str(char_model)).tokenizer
    joiner = FeedbackJoiner(FeedbackJoinSettings())
    conversation = [{"role": "user", "content": "R:12>"}]
    first = chat_served(tokenizer, "resp-a", conversation, "21", at=T0)
    second = chat_served(tokenizer, "resp-b", conversation, "2", at=T0 + 5, version=4)
    pick_b = FeedbackReceived(feedback_id="fb-p", kind="preference", response_ids=["resp-a", "resp-b"],
                              preferred_index=1, source="chat-app")

    # the first response, then the preference: it waits at resp-a and asks resp-b for its record
    at_a = joiner.on_served(None, first, {}).state
    step = joiner.on_feedback(at_a, pick_b, {})
    assert step.events == [] and step.messages == [PartnerRecord(to="resp-b", sender="resp-a")]
    at_b = joiner.on_partner(None, step.messages[0], {}).state  # resp-b not served yet: it remembers who asked
    assert at_b.partners == ["resp-a"] and joiner.on_partner(at_b, step.messages[0], {}).duplicate
    arrived = joiner.on_served(at_b, second, {})  # ... and sends its record when it comes
    assert arrived.messages == [PartnerRecord(to="resp-a", sender="resp-b", served=second)]
    assert arrived.state.partners == []
    [pair] = joiner.on_partner(step.state, arrived.messages[0], {}).events
    assert pair.objective == "preference" and pair.rollout.completion_token_ids == second.call.completion_token_ids
    assert pair.rejected.completion_token_ids == first.call.completion_token_ids
    assert pair.rollout.completion_logprobs == second.call.completion_logprobs  # the reference
    assert pair.production.response_ids == ["resp-a", "resp-b"] and pair.production.served_at_ms == T0

    # the other order: resp-b served before the question, it answers at once
    question = joiner.on_feedback(None, pick_b.model_copy(update={"feedback_id": "fb-q"}), {})
    [answer] = joiner.on_partner(arrived.state, question.messages[0], {}).messages
    assert answer.served == second and answer.to == "resp-a"
    holding = joiner.on_partner(question.state, answer, {})  # resp-a's own record is still to come
    assert holding.events == [] and holding.state.partner_served == [second]
    [again] = joiner.on_served(holding.state, first, {}).events
    assert again.rejected.rollout_id == "fb-q-rejected"

    # different prompts, one receipt twice, texts served elsewhere: refused with the reason
    other_prompt = chat_served(tokenizer, "resp-c", [{"role": "user", "content": "R:9>"}], "9")
    mixed = pick_b.model_copy(update={"feedback_id": "fb-m", "response_ids": ["resp-a", "resp-c"]})
    waiting = joiner.on_feedback(at_a, mixed, {}).state
    [drop] = joiner.on_partner(waiting, PartnerRecord(to="resp-a", sender="resp-c", served=other_prompt), {}).events
    assert "different prompts" in drop.detail
    same = pick_b.model_copy(update={"feedback_id": "fb-s", "response_ids": ["resp-a", "resp-a"]})
    assert "two different responses" in joiner.on_feedback(at_a, same, {}).events[0].detail
    texts = FeedbackReceived(feedback_id="fb-t", kind="preference", candidates=["21", "2"], preferred_index=0,
                             source="chat-app", messages=conversation)
    [drop] = joiner.on_feedback(None, texts, {}).events
    assert drop.reason == "unjoinable" and "sampler logprobs" in drop.detail
