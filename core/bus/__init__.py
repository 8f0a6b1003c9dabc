"""The event log: one interface (`base`), two backends (`embedded`, `kafka`), and the typed event
layer every component uses (`events`)."""

from rollwire.core.bus.base import (
    AtOffsets,
    AtTime,
    Beginning,
    Consumer,
    EventLog,
    Producer,
    Record,
    StartAt,
    TopicConfig,
)
from rollwire.core.bus.errors import BusError, CommitFailedError, DeliveryError, TopicError
from rollwire.core.bus.events import (
    DeadLetters,
    Delivery,
    EventConsumer,
    EventProducer,
    Follower,
    HeldDeadLetters,
    read_to_end,
    records_to_end,
)
from rollwire.core.bus.settings import (
    BusSettings,
    EmbeddedBusSettings,
    KafkaBusSettings,
    catalog_topics,
    open_log,
)

__all__ = [
    "AtOffsets", "AtTime", "Beginning", "BusError", "CommitFailedError", "Consumer", "DeadLetters", "HeldDeadLetters",
    "BusSettings", "Delivery", "DeliveryError", "EmbeddedBusSettings", "EventConsumer", "EventLog",
    "EventProducer", "Follower", "KafkaBusSettings", "Producer", "Record", "StartAt", "TopicConfig", "TopicError",
    "catalog_topics", "open_log", "read_to_end", "records_to_end",
]
