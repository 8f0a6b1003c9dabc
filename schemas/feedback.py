"""Production feedback flowing back as training data.

    production app ──FeedbackReceived──▶ feedback ──▶ feedback joiner ──▶ scored / SFT samples
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rollwire.schemas.base import Event, new_id, now_ms


class FeedbackReceived(Event):
    """A user's judgement of one model response in production.

    Produced by production apps on `feedback` (key: conversation id); consumed by the feedback
    joiner, which turns it into scored or SFT samples.
    """

    type: Literal["feedback.received"] = "feedback.received"
    feedback_id: str = Field(default_factory=new_id)
    """Unique per feedback; consumers dedupe on it."""
    conversation_id: str
    """The conversation the judged response belongs to."""
    source: str
    """The application that collected the feedback."""
    kind: Literal["rating", "correction", "preference"]
    """A score, a corrected response, or a choice between two responses."""
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
        return self
