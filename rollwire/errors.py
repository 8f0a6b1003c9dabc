"""The root of every exception rollwire raises on purpose.

    RollwireError
    ├── SchemaError            rollwire.schemas.errors — bytes or fields that are not a valid event
    │   ├── CorruptEventError
    │   ├── UnknownEventTypeError
    │   ├── SchemaVersionTooNewError
    │   ├── InvalidEventError
    │   └── EventTooLargeError
    ├── ConfigError            a setting that cannot work; the message names the setting
    └── BusError               rollwire.bus.errors — the event log refused or failed an operation
        ├── TopicError
        ├── DeliveryError
        └── CommitFailedError

Each area adds its own subclasses; messages say what to change, not only what went wrong.
"""


class RollwireError(Exception):
    """Base class for errors raised by rollwire itself."""


class ConfigError(RollwireError, ValueError):
    """A setting or argument that cannot work; the message names it and what to change."""
