"""Production feedback flowing back as training data.

    production app ──FeedbackReceived──▶ feedback ──▶ feedback joiner ──▶ scored / SFT samples
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollwire.schemas.base import Event, new_id, now_ms

PRODUCTION_GROUP_PREFIX = "feedback-"
"""Before the receipt in the group id (and `scored` key) of a sample made from production feedback:
never the start of a group id the dispatcher issues (those are 32 hex digits)."""


class FeedbackReceived(Event):
    """A user's judgement of one model response in production.

    Produced by production apps on `feedback` (key: conversation id); consumed by the feedback
    joiner, which turns it into scored or SFT samples.
    """

    type: Literal["feedback.received"] = "feedback.received"
    feedback_id: str = Field(default_factory=new_id)
    """Unique per feedback; consumers dedupe on it."""
    conversation_id: str | None = None
    """The conversation the judged response belongs to; None when only a receipt names it."""
    source: str
    """The application that collected the feedback."""
    kind: Literal["rating", "correction", "preference"]
    """A score, a corrected response, or a choice between two responses."""
    response_id: str | None = None
    """The receipt of the judged response (the id `rollwire serve` returned with it), when it was
    served by rollwire; the joiner finds the served tokens from it."""
    response_ids: list[str] = Field(default_factory=list)
    """For `preference` between two served responses: their receipts, in order."""
    candidates: list[str] = Field(default_factory=list)
    """For `preference` between two responses served elsewhere: their texts, in order."""
    prompt_token_ids: list[int] = Field(default_factory=list)
    """The prompt as served, when the app recorded token ids; empty otherwise."""
    completion_token_ids: list[int] = Field(default_factory=list)
    """The response as served, when recorded; empty otherwise."""
    messages: list[dict[str, str]] = Field(default_factory=list)
    """The conversation as chat messages (`role`, `content`), when token ids were not recorded."""
    served_version: int | None = None
    """Weight version that produced the response; None when unknown."""
    rating: float | None = None
    """For `rating`: the score, in [-1, 1]; None for other kinds."""
    correction: str | None = None
    """For `correction`: the response the user wanted; None for other kinds."""
    preferred_index: int | None = None
    """For `preference`: which of two candidate responses the user chose (0 or 1)."""
    received_at_ms: int = Field(default_factory=now_ms)
    """When the app received the feedback (epoch ms)."""
    traceparent: str | None = None
    """W3C trace context of the span that took the item in (set by the ingestion API): the samples
    the joiner makes continue this trace, linked to the served responses' traces."""

    @model_validator(mode="after")
    def _has_judgement(self) -> FeedbackReceived:
        needed = {"rating": self.rating, "correction": self.correction,
                  "preference": self.preferred_index}[self.kind]
        if needed is None:
            field = {"rating": "rating", "correction": "correction",
                     "preference": "preferred_index"}[self.kind]
            raise ValueError(f"feedback of kind {self.kind!r} needs the field {field!r}")
        if self.rating is not None and not -1.0 <= self.rating <= 1.0:
            raise ValueError(f"rating {self.rating} must lie in [-1, 1]")
        if self.kind == "preference":
            if len(self.response_ids) != 2 and len(self.candidates) != 2:
                raise ValueError("a preference needs the two responses: response_ids (two receipts) or candidates "
                                 "(two texts)")
            if self.preferred_index not in (0, 1):
                raise ValueError(f"preferred_index {self.preferred_index} must be 0 or 1")
        elif not (self.response_id or self.messages or self.completion_token_ids):
            raise ValueError(f"a {self.kind} needs the response it judges: response_id (a receipt), messages, "
                             "or prompt_token_ids and completion_token_ids")
        return self

    @property
    def key(self) -> str:
        """The `feedback` topic key: the conversation, or the receipt when the conversation is not known."""
        return self.conversation_id or self.response_id or (self.response_ids or [self.feedback_id])[0]
