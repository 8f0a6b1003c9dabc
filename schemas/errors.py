"""Errors of the event contract: bytes that are not an event this reader can use.

Consumers catch `SchemaError` at their process boundary and send the record to the dead-letter
topic with the error (see `rollwire.core.bus.events.EventConsumer`).
"""

from rollwire.core.errors import RollwireError


class SchemaError(RollwireError):
    """The bytes or fields are not a valid event for this version of rollwire."""


class CorruptEventError(SchemaError):
    """The bytes are not a msgpack envelope (truncated, wrong format, or not produced by rollwire)."""


class UnknownEventTypeError(SchemaError):
    """The envelope names an event type this reader does not know."""


class SchemaVersionTooNewError(SchemaError):
    """The event was written with a newer schema version than this reader understands."""


class InvalidEventError(SchemaError):
    """The envelope is sound but the payload fails validation (missing or ill-typed fields)."""


class EventTooLargeError(SchemaError):
    """The encoded event is over the configured size limit."""
