"""The feedback joiner's own records: what it holds per receipt and per source (its changelog),
so a restarted joiner rebuilds exactly what it held, pending feedback included."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.serving import ResponseServed


class FeedbackJoinState(Event):
    """What the joiner holds for one receipt.

    Version 2 added `partners` and `partner_served` (the joiner's own state: an older joiner
    cannot hold it).

    Produced by the feedback joiner on `joiner-state` (compacted; key: the receipt) whenever it
    changes, tombstoned when forgotten; consumed by the feedback joiner when it restores.
    """

    SCHEMA_VERSION: ClassVar[int] = 2

    type: Literal["feedback.join_state"] = "feedback.join_state"
    response_id: str
    """The receipt this state is about."""
    served: ResponseServed | None = None
    """The served record, once it arrived."""
    waiting: list[FeedbackReceived] = Field(default_factory=list)
    """Feedback that arrived before its served record, oldest first."""
    joined: list[str] = Field(default_factory=list)
    """Feedback ids already turned into samples or dropped: a resend of one is ignored."""
    partners: list[str] = Field(default_factory=list)
    """Receipts holding preferences that also need this receipt's served record: it is sent to them
    (`PartnerRecord`) when it arrives."""
    partner_served: list[ResponseServed] = Field(default_factory=list)
    """Served records of other receipts that preferences waiting here compare this one with."""
    first_seen_ms: int = Field(default_factory=now_ms)
    """When the joiner first heard of the receipt (epoch ms)."""


class SourceBaseline(Event):
    """Running mean of one source's ratings: the baseline its ratings' advantages are measured from.

    Produced by the feedback joiner on `joiner-state` (key: NUL, then the source); consumed by it
    when it restores.
    """

    type: Literal["feedback.source_baseline"] = "feedback.source_baseline"
    source: str
    """The application the ratings come from."""
    count: int = Field(default=0, ge=0)
    """Ratings counted."""
    mean: float = 0.0
    """Their mean."""


class PartnerRecord(Event):
    """One receipt's message to another about a preference that compares the two: a request for the
    addressee's served record (`served` None), or the sender's served record.

    A preference waits at its first receipt; the second may live on another partition, so the two
    talk through messages keyed by the addressee. Produced and consumed by the feedback joiner: on
    `joiner-in` (key: `to`) by the faust driver, applied at once by the in-process one.
    """

    type: Literal["feedback.partner_record"] = "feedback.partner_record"
    to: str
    """The receipt addressed."""
    sender: str
    """The receipt that sends."""
    served: ResponseServed | None = None
    """The sender's served record; None asks for the addressee's."""
