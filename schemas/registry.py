"""Every event type, once: the discriminated union and the lookup from type tag to model."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rollwire.schemas.base import Event
from rollwire.schemas.deadletter import DeadLetter
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, PartnerRecord, SourceBaseline
from rollwire.schemas.rollout import RolloutCompleted, SamplingStarted, ScoredRollout, TaskAssigned, TraceRecorded
from rollwire.schemas.scorer import ScorerGroupRollout, ScorerGroupState, ScorerTick
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.training import RolloutsDropped, TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus, ServingDecision, WeightsPublished

AnyEvent = Annotated[
    TaskAssigned | RolloutCompleted | TraceRecorded | ScoredRollout | WeightsPublished | ReplicaStatus
    | TrainStepCompleted | RolloutsDropped | FeedbackReceived | ResponseServed | DeadLetter | ScorerGroupState
    | ScorerGroupRollout | ScorerTick | FeedbackJoinState | SourceBaseline | PartnerRecord | ServingDecision
    | SamplingStarted,
    Field(discriminator="type"),
]
"""Any rollwire event, discriminated on its `type` tag."""

EVENT_TYPES: dict[str, type[Event]] = {
    cls.model_fields["type"].default: cls
    for cls in AnyEvent.__origin__.__args__  # type: ignore[attr-defined]
}
"""Event model by type tag, e.g. `EVENT_TYPES["rollout.completed"] is RolloutCompleted`."""


def type_tag(event_cls: type[Event]) -> str:
    """The `type` tag of an event model."""
    return event_cls.model_fields["type"].default
