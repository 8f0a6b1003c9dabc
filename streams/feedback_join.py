"""The feedback joiner's logic, free of any transport: production feedback joined with the responses
it judges, by receipt, into training samples. One pure step per event or tick, as `GroupScorer`.

    served   (response.served)     ──▶ on_served(state, served)     ─┐
    feedback (feedback.received)   ──▶ on_feedback(state, item)    ─┤     new state
    another receipt's message      ──▶ on_partner(state, record)   ─┼─▶  + samples on `scored`
    ticks                          ──▶ on_tick(state)              ─┘    + drops with a reason
                                                                         + messages to other receipts
    (every call is about one receipt: the served record's, the feedback's `receipt_of`, `record.to`)

State is kept per receipt (`FeedbackJoinState`): the served record once it arrived, feedback that
came first and waits for it (at most `window_s`), and the feedback ids already turned into samples
(a resend is recognised and ignored). What each kind becomes (`ScoredRollout.objective`):

    rating      policy_gradient: the served call as the rollout (prompt and sampled ids, the
                sampler's logprobs and weight-version spans, as recorded, so the trainer corrects
                for the version that served it); reward = the rating, advantage = the rating less
                its source's baseline (`BASELINES`, by name)
    correction  sft: the served prompt, then the corrected response rendered with the served chat
                template (`Renderer`); prompt tokens are not trained. Without a receipt, the
                `messages` the app sent are rendered instead: nothing to join.
    preference  preference: both receipts' served calls, the chosen one first; their sampler
                logprobs are the loss's reference. It waits at its first receipt until both
                records are in. The second receipt may be another partition's, so the two talk
                by `PartnerRecord` messages keyed by the addressee (`on_partner`): the first asks
                for the second's record; the second answers with it, at once or when it arrives.

Ratings and preferences about responses served elsewhere carry no sampler logprobs to correct or
refer to; they are dropped with that reason. A sample's `traceparent` is its feedback's (the
ingestion API's span): the driver sends it in that trace, linked to the served responses' traces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from rollwire.core import telemetry
from rollwire.core.registry import Registry
from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.feedback import PRODUCTION_GROUP_PREFIX, FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, PartnerRecord, SourceBaseline
from rollwire.schemas.rollout import ProductionOrigin, RolloutCompleted, ScoredRollout
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.training import DropReason, RolloutsDropped

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


class RenderError(ValueError):
    """A correction cannot be rendered in the served tokens; the message says why."""


class Renderer(Protocol):
    """Renders corrected responses in the policy's own tokens (`ChatTemplateRenderer`)."""

    def chat(self, messages: list[dict[str, str]], correction: str) -> tuple[list[int], list[int]]:
        """`(prompt ids, response ids)`: the conversation as the chat template renders it for
        generation, then the corrected assistant turn up to and including its end token."""

    def text(self, correction: str) -> list[int]:
        """The corrected text of a plain completion, then the end-of-sequence token."""


class FeedbackJoinSettings(BaseModel):
    """Settings of the feedback joiner."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    window_s: float = Field(default=3600.0, gt=0)
    """How long feedback waits for its served record(s) before it is dropped as unjoinable."""
    served_retention_s: float = Field(default=7 * 86400.0, gt=0)
    """How long a served record is kept for feedback to arrive."""
    max_receipts: int = Field(default=50_000, ge=1)
    """Most receipts one joiner process holds (a served record waiting for feedback, or feedback
    waiting for its record). Each costs about its served record: ~40 B a token as Python objects,
    so 50,000 responses of 500 tokens take ~1 GB. Past it the oldest receipt is forgotten before
    `served_retention_s` (counted): feedback on it arriving later is dropped as `unjoinable`, and
    feedback it held waiting is dropped now as `overflow`."""
    baseline: Annotated[str, AfterValidator(BASELINES.check)] = "source_mean"
    """Per-source baseline a rating's advantage is measured from (`BASELINES`)."""
    algorithm: str = "feedback"
    """The algorithm name the samples carry (the trainer's loss does not depend on it)."""
    tokenizer: str = ""
    """The served model's tokenizer (a directory or hub name), to render corrections with its chat
    template; empty: corrections are dropped with that reason. `rollwire run` fills in the model's."""


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
    messages: list[PartnerRecord] = field(default_factory=list)
    """Messages to other receipts (`PartnerRecord.to`): the driver applies them there (`on_partner`)."""


class FeedbackJoiner:
    """Holds no data itself: drivers pass each receipt's state (and the sources' baselines) in."""

    def __init__(self, settings: FeedbackJoinSettings, renderer: Renderer | None = None) -> None:
        self.settings, self.renderer = settings, renderer
        self._baseline = BASELINES.get(settings.baseline)

    @classmethod
    def from_settings(cls, settings: FeedbackJoinSettings) -> FeedbackJoiner:
        """A joiner that renders corrections with `settings.tokenizer`'s chat template, when one is set."""
        return cls(settings, ChatTemplateRenderer(settings.tokenizer) if settings.tokenizer else None)

    # -- events ------------------------------------------------------------------------------

    def on_served(self, state: FeedbackJoinState | None, served: ResponseServed,
                  baselines: dict[str, SourceBaseline], now: int | None = None) -> JoinStep:
        now = now_ms() if now is None else now
        if state is not None and state.served is not None:
            return JoinStep(state, duplicate=True)
        state = (state or FeedbackJoinState(response_id=served.response_id, first_seen_ms=now))
        step = JoinStep(state.model_copy(update={"served": served, "partners": []}))
        step.messages = [PartnerRecord(to=partner, sender=served.response_id, served=served)
                         for partner in state.partners]
        self._join_waiting(step, baselines)
        return step

    def on_feedback(self, state: FeedbackJoinState | None, item: FeedbackReceived,
                    baselines: dict[str, SourceBaseline], now: int | None = None) -> JoinStep:
        """`state` is that of `receipt_of(item)`."""
        now = now_ms() if now is None else now
        receipt = receipt_of(item)
        if receipt is None:
            return JoinStep(state, [self._elsewhere(item)])
        if state is not None and (item.feedback_id in state.joined
                                  or any(w.feedback_id == item.feedback_id for w in state.waiting)):
            return JoinStep(state, duplicate=True)
        state = state or FeedbackJoinState(response_id=receipt, first_seen_ms=now)
        step = JoinStep(state)
        if item.kind == "preference" and item.response_ids[0] == item.response_ids[1]:
            step.events.append(self._drop(item, "invalid", "a preference compares two different responses; both "
                                                           f"receipts are {receipt}"))
            step.state = state.model_copy(update={"joined": [*state.joined, item.feedback_id]})
        elif not self._try(step, item, baselines):
            step.state = state.model_copy(update={"waiting": [*state.waiting, item]})
            other = item.response_ids[1] if item.kind == "preference" else None
            if other is not None and _partner(state, other) is None:
                step.messages.append(PartnerRecord(to=other, sender=receipt))
        return step

    def on_partner(self, state: FeedbackJoinState | None, record: PartnerRecord,
                   baselines: dict[str, SourceBaseline], now: int | None = None) -> JoinStep:
        """A message from another receipt (`state` is that of `record.to`): a request for this
        receipt's served record, answered now or when it arrives; or the sender's record, which
        preferences waiting here may need."""
        now = now_ms() if now is None else now
        state = state or FeedbackJoinState(response_id=record.to, first_seen_ms=now)
        if record.served is None:
            if state.served is not None:
                return JoinStep(state, messages=[PartnerRecord(to=record.sender, sender=record.to, served=state.served)])
            if record.sender in state.partners:
                return JoinStep(state, duplicate=True)
            return JoinStep(state.model_copy(update={"partners": [*state.partners, record.sender]}))
        if _partner(state, record.sender) is not None:
            return JoinStep(state, duplicate=True)
        step = JoinStep(state.model_copy(update={"partner_served": [*state.partner_served, record.served]}))
        self._join_waiting(step, baselines)
        return step

    def on_tick(self, state: FeedbackJoinState, now: int | None = None) -> JoinStep:
        """Drops feedback that waited past `window_s`; forgets a receipt past `served_retention_s`."""
        now = now_ms() if now is None else now
        window = self.settings.window_s * 1000
        late = [w for w in state.waiting if now - w.received_at_ms >= window]
        events: list[Event] = [self._drop(w, "unjoinable", f"no served record of {', '.join(_receipts(w))} arrived "
                                                           f"within {self.settings.window_s:g} s") for w in late]
        if late:
            state = state.model_copy(update={"waiting": [w for w in state.waiting if w not in late],
                                             "joined": [*state.joined, *(w.feedback_id for w in late)]})
        served_at = state.served.served_at_ms if state.served is not None else state.first_seen_ms
        if not state.waiting and now - served_at >= self.settings.served_retention_s * 1000:
            return JoinStep(None, events)
        return JoinStep(state, events)

    def forget(self, state: FeedbackJoinState, held: int) -> JoinStep:
        """Forgets a receipt before its time to make room (`max_receipts`): the feedback it holds
        waiting is dropped with the reason."""
        detail = (f"the joiner held {held} receipts, its max_receipts {self.settings.max_receipts}: "
                  f"the oldest was forgotten to make room")
        return JoinStep(None, [self._drop(w, "overflow", detail) for w in state.waiting])

    @staticmethod
    def due_ms(state: FeedbackJoinState, settings: FeedbackJoinSettings) -> int:
        """When `on_tick` next has something to do for `state` (epoch ms)."""
        if state.waiting:
            return state.waiting[0].received_at_ms + int(settings.window_s * 1000)
        seen = state.served.served_at_ms if state.served is not None else state.first_seen_ms
        return seen + int(settings.served_retention_s * 1000)

    # -- joining -----------------------------------------------------------------------------

    def _join_waiting(self, step: JoinStep, baselines: dict[str, SourceBaseline]) -> None:
        assert step.state is not None
        still = [item for item in step.state.waiting if not self._try(step, item, baselines)]
        step.state = step.state.model_copy(update={"waiting": still})

    def _try(self, step: JoinStep, item: FeedbackReceived, baselines: dict[str, SourceBaseline]) -> bool:
        """Turns `item` into a sample or a drop if its served record(s) are in; False: it must wait."""
        assert step.state is not None
        served = step.state.served
        if served is None:
            return False
        if item.kind == "preference":
            other = _partner(step.state, item.response_ids[1])
            if other is None:
                return False
            step.events.append(self._preference(item, served, other))
        elif item.kind == "correction":
            step.events.append(self._correction(item, served))
        else:
            self._rating(step, item, served, baselines)
        step.state = step.state.model_copy(update={"joined": [*step.state.joined, item.feedback_id]})
        return True

    def _rating(self, step: JoinStep, item: FeedbackReceived, served: ResponseServed,
                baselines: dict[str, SourceBaseline]) -> None:
        rating = float(item.rating or 0.0)
        current = step.baselines.get(item.source) or baselines.get(item.source) or SourceBaseline(source=item.source)
        baseline = self._baseline(current.mean, current.count, rating)
        rollout = self._served_rollout(item, served, item.feedback_id).model_copy(
            update={"rewards": {"rating": rating}, "reward": rating})
        step.events.append(ScoredRollout(rollout=rollout, algorithm=self.settings.algorithm, reward=rating,
                                         advantage=rating - baseline, group_reward_mean=baseline,
                                         production=_origin(item, served)))
        count = current.count + 1
        step.baselines[item.source] = SourceBaseline(source=item.source, count=count,
                                                     mean=current.mean + (rating - current.mean) / count)

    def _correction(self, item: FeedbackReceived, served: ResponseServed | None) -> Event:
        if self.renderer is None:
            return self._drop(item, "invalid", "corrections need the served model's tokenizer: set the joiner's "
                                               "tokenizer (`rollwire join --tokenizer DIR`)")
        correction = item.correction or ""
        try:
            if served is None:  # served elsewhere: the app sent the conversation
                prompt, response = self.renderer.chat(item.messages, correction)
            elif served.endpoint == "chat":
                prompt, response = self.renderer.chat(served.messages, correction)
                if prompt != served.call.prompt_token_ids:
                    raise RenderError("the chat template does not reproduce the served prompt's tokens "
                                      "(is the joiner's tokenizer the served model's?)")
            else:
                prompt, response = served.call.prompt_token_ids, self.renderer.text(correction)
        except RenderError as exc:
            return self._drop(item, "invalid", f"the correction cannot be rendered: {exc}")
        if not response:
            return self._drop(item, "invalid", "the correction renders to no tokens")
        rollout = RolloutCompleted(
            rollout_id=item.feedback_id, group_id=PRODUCTION_GROUP_PREFIX + (receipt_of(item) or item.feedback_id),
            task_id=receipt_of(item) or item.feedback_id, environment=f"feedback/{item.source}",
            algorithm=self.settings.algorithm, group_size=1, sample_index=0, prompt_token_ids=prompt,
            completion_token_ids=response, completion_logprobs=[0.0] * len(response), loss_mask=[1] * len(response),
            traceparent=item.traceparent)
        return ScoredRollout(rollout=rollout, algorithm=self.settings.algorithm, reward=0.0, objective="sft",
                             production=_origin(item, served))

    def _preference(self, item: FeedbackReceived, first: ResponseServed, second: ResponseServed) -> Event:
        if first.call.prompt_token_ids != second.call.prompt_token_ids:
            return self._drop(item, "invalid", "the two responses answer different prompts: a preference compares "
                                               "two responses to one prompt")
        chosen, rejected = (first, second) if item.preferred_index == 0 else (second, first)
        return ScoredRollout(rollout=self._served_rollout(item, chosen, item.feedback_id),
                             rejected=self._served_rollout(item, rejected, f"{item.feedback_id}-rejected"),
                             algorithm=self.settings.algorithm, reward=0.0, objective="preference",
                             production=_origin(item, first, second))

    def _served_rollout(self, item: FeedbackReceived, served: ResponseServed, rollout_id: str) -> RolloutCompleted:
        call = served.call
        return RolloutCompleted(
            rollout_id=rollout_id, group_id=PRODUCTION_GROUP_PREFIX + served.response_id, task_id=served.response_id,
            environment=f"feedback/{item.source}", algorithm=self.settings.algorithm, group_size=1, sample_index=0,
            prompt_token_ids=call.prompt_token_ids, completion_token_ids=call.completion_token_ids,
            completion_logprobs=call.completion_logprobs, loss_mask=[1] * len(call.completion_token_ids),
            weight_versions=call.weight_versions, traceparent=item.traceparent)

    def _elsewhere(self, item: FeedbackReceived) -> Event:
        """Feedback on a response rollwire did not serve."""
        if item.kind == "correction" and item.messages:
            return self._correction(item, None)
        what = {"rating": "a rating", "preference": "a preference", "correction": "a correction"}[item.kind]
        need = ("messages (the conversation to render the correction after)" if item.kind == "correction" else
                "receipts: it trains against the sampler logprobs `rollwire serve` records, which responses served "
                "elsewhere lack")
        return self._drop(item, "unjoinable", f"{what} without a receipt needs {need}")

    @staticmethod
    def _drop(item: FeedbackReceived, reason: DropReason, detail: str) -> RolloutsDropped:
        return RolloutsDropped(rollout_ids=[item.feedback_id], group_id=receipt_of(item) or item.feedback_id,
                               reason=reason, stage="feedback joiner", detail=detail, production=True)


def receipt_of(item: FeedbackReceived) -> str | None:
    """The receipt whose state holds `item`: its response's, or a preference's first."""
    if item.kind == "preference":
        return item.response_ids[0] if item.response_ids else None
    return item.response_id


def _partner(state: FeedbackJoinState, receipt: str) -> ResponseServed | None:
    """The served record of `receipt` that `state` holds for its preferences."""
    return next((s for s in state.partner_served if s.response_id == receipt), None)


def _receipts(item: FeedbackReceived) -> list[str]:
    return list(item.response_ids) if item.kind == "preference" else [item.response_id or item.feedback_id]


def _origin(item: FeedbackReceived, *served: ResponseServed | None) -> ProductionOrigin:
    times = [s.served_at_ms for s in served if s is not None]
    return ProductionOrigin(source=item.source, feedback_id=item.feedback_id, response_ids=_receipts(item)
                            if any(served) else [], served_at_ms=min(times) if times else item.received_at_ms)


def joining_span(sample: Event, state: FeedbackJoinState | None) -> AbstractContextManager[None]:
    """Around sending one output event. A sample is sent inside a `join feedback` span in its
    feedback's trace (from the ingestion API on to the trainer step that trains it), linked to
    the traces of the requests that served the responses it judges (`state`: the receipt's state
    that made it)."""
    if not isinstance(sample, ScoredRollout) or sample.production is None or not telemetry.tracing():
        return nullcontext()
    return _joining_span(sample, state)


@contextmanager
def _joining_span(sample: ScoredRollout, state: FeedbackJoinState | None) -> Iterator[None]:
    assert sample.production is not None
    served = [] if state is None else [state.served, *state.partner_served]
    links = telemetry.links_to([s.traceparent for s in served if s is not None])
    with telemetry.continued(sample.rollout.traceparent), telemetry.tracer().start_as_current_span(
            "join feedback", links=links, attributes={"rollwire.feedback_id": sample.production.feedback_id,
                                                      "rollwire.objective": sample.objective}):
        yield


class ChatTemplateRenderer:
    """Renders corrections with a tokenizer's own chat template (loaded with transformers)."""

    def __init__(self, tokenizer: str) -> None:
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self._specials = set(self.tokenizer.all_special_ids) | {
            i for i, token in self.tokenizer.added_tokens_decoder.items() if token.special}  # <|im_end|> and kin

    def _ids(self, messages: list[dict[str, str]], **kw) -> list[int]:
        out: Any = self.tokenizer.apply_chat_template(messages, tokenize=True, **kw)
        return list(out["input_ids"] if hasattr(out, "keys") else out)  # a BatchEncoding in transformers 5

    def chat(self, messages: list[dict[str, str]], correction: str) -> tuple[list[int], list[int]]:
        if not messages:
            raise RenderError("no conversation to render the correction after")
        try:
            prompt = self._ids(messages, add_generation_prompt=True)
            full = self._ids([*messages, {"role": "assistant", "content": correction}])
        except Exception as exc:  # a template raises whatever its author chose
            raise RenderError(f"the chat template failed: {exc}") from None
        if full[:len(prompt)] != prompt:
            raise RenderError("the chat template renders the conversation differently with the assistant's turn "
                              "appended, so the turn's tokens cannot be separated from the prompt")
        return prompt, self._to_end_of_turn(full[len(prompt):])

    def text(self, correction: str) -> list[int]:
        ids = list(self.tokenizer(correction, add_special_tokens=False)["input_ids"])
        return ids + ([self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else [])

    def _to_end_of_turn(self, ids: list[int]) -> list[int]:
        """Cuts what a template writes after the turn's end token (a newline between turns): the
        model never samples it, generation stops at the end token."""
        ends = [i for i, t in enumerate(ids) if t in self._specials]
        if ends and not str(self.tokenizer.decode(ids[ends[-1] + 1:])).strip():
            return ids[:ends[-1] + 1]
        return ids
