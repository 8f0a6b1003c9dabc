"""The event contract: event models, the envelope and its msgpack codec, the topic catalog."""

from rollwire.schemas.base import BlobPointer, Event, new_id, now_ms
from rollwire.schemas.deadletter import DeadLetter
from rollwire.schemas.envelope import DEFAULT_MAX_EVENT_BYTES, Codec, Envelope
from rollwire.schemas.errors import (
    CorruptEventError,
    EventTooLargeError,
    InvalidEventError,
    SchemaError,
    SchemaVersionTooNewError,
    UnknownEventTypeError,
)
from rollwire.schemas.feedback import FeedbackReceived
from rollwire.schemas.joiner import FeedbackJoinState, PartnerRecord, SourceBaseline
from rollwire.schemas.registry import EVENT_TYPES, AnyEvent
from rollwire.schemas.rollout import (
    InferenceCall,
    ProductionOrigin,
    RolloutCompleted,
    RolloutError,
    RolloutTimings,
    SamplingParams,
    SamplingStarted,
    ScoredRollout,
    TaskAssigned,
    TokenSequence,
    TraceNode,
    TraceRecorded,
    WeightVersionSpan,
)
from rollwire.schemas.scorer import ScorerGroupRollout, ScorerGroupState, ScorerTick
from rollwire.schemas.serving import ResponseServed
from rollwire.schemas.topics import CATALOG, Topics, TopicSpec
from rollwire.schemas.training import RolloutsDropped, Staleness, TrainStepCompleted
from rollwire.schemas.weights import ReplicaStatus, ServingDecision, WeightsPublished

__all__ = [
    "CATALOG", "DEFAULT_MAX_EVENT_BYTES", "EVENT_TYPES", "AnyEvent", "BlobPointer", "Codec",
    "CorruptEventError", "DeadLetter", "Envelope", "Event", "EventTooLargeError",
    "FeedbackJoinState", "FeedbackReceived", "InferenceCall", "InvalidEventError", "PartnerRecord", "ReplicaStatus",
    "ResponseServed", "RolloutCompleted", "RolloutError", "RolloutTimings", "RolloutsDropped",
    "ProductionOrigin", "SamplingParams", "SamplingStarted", "SchemaError", "SchemaVersionTooNewError", "ScoredRollout",
    "ScorerGroupRollout", "ScorerGroupState", "ScorerTick", "ServingDecision", "SourceBaseline", "Staleness",
    "TaskAssigned", "TokenSequence", "TopicSpec", "Topics", "TraceNode", "TraceRecorded", "TrainStepCompleted",
    "UnknownEventTypeError", "WeightVersionSpan", "WeightsPublished", "new_id", "now_ms",
]
