"""The versioned envelope every event travels in, and its msgpack codec.

Wire format (msgpack map, keys in this order):

    type            str    event type tag, e.g. "rollout.completed"
    schema_version  int    the payload's schema version
    event_id        str    unique per event (32 hex digits); consumers dedupe on it
    produced_at_ms  int    when the producer encoded it (epoch ms)
    producer        str    the producing component, e.g. "env-worker/host-1"
    traceparent     str?   W3C trace context of the producing span, or nil
    payload         map    the event's fields (`Event.model_dump()`)

The same traceparent also travels in the record headers, where tracing tools look for it; the
envelope copy survives when events are stored or re-published outside the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import msgpack
from pydantic import ValidationError

from rollwire.schemas.base import Event, new_id, now_ms
from rollwire.schemas.errors import (
    CorruptEventError,
    EventTooLargeError,
    InvalidEventError,
    SchemaVersionTooNewError,
    UnknownEventTypeError,
)
from rollwire.schemas.registry import EVENT_TYPES

DEFAULT_MAX_EVENT_BYTES = 1024 * 1024
"""Default size limit of one encoded event; larger payloads travel as a `BlobPointer`."""

_ENVELOPE_KEYS = ("type", "schema_version", "event_id", "produced_at_ms", "producer",
                  "traceparent", "payload")

E = TypeVar("E", bound=Event)


@dataclass(frozen=True, slots=True)
class Envelope(Generic[E]):
    """A decoded event with its envelope metadata."""

    event: E
    event_id: str
    produced_at_ms: int
    producer: str
    schema_version: int
    traceparent: str | None = None

    @property
    def type(self) -> str:
        return self.event.type


class Codec:
    """Encodes events into envelopes and back, enforcing the size limit and schema versions."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes < 1024:
            raise ValueError(f"max_event_bytes={max_event_bytes} is too small; use at least 1024")
        self.max_event_bytes = max_event_bytes

    def encode(self, event: Event, *, producer: str, event_id: str | None = None,
               traceparent: str | None = None, produced_at_ms: int | None = None) -> bytes:
        """Returns the msgpack envelope of `event`; raises `EventTooLargeError` over the limit.
        `event_id` and `produced_at_ms` default to a fresh id and the current time."""
        envelope = {
            "type": event.type,
            "schema_version": type(event).SCHEMA_VERSION,
            "event_id": event_id or new_id(),
            "produced_at_ms": produced_at_ms if produced_at_ms is not None else now_ms(),
            "producer": producer,
            "traceparent": traceparent,
            "payload": event.model_dump(mode="python"),
        }
        data = msgpack.packb(envelope, use_bin_type=True)
        if len(data) > self.max_event_bytes:
            raise EventTooLargeError(
                f"{envelope['type']} event is {len(data)} bytes, over the {self.max_event_bytes}-byte "
                "limit (the codec's max_event_bytes): put the large part in the object store and send "
                "a BlobPointer, as the env worker does with a large trace when it has a store")
        return data

    def decode(self, data: bytes) -> Envelope:
        """Returns the envelope in `data`; raises a `SchemaError` subclass saying what is wrong."""
        if len(data) > self.max_event_bytes:
            raise EventTooLargeError(
                f"record of {len(data)} bytes is over this reader's {self.max_event_bytes}-byte "
                "limit (the codec's max_event_bytes): no rollwire component sends one that large")
        raw = _unpack(data)
        tag, version = raw["type"], raw["schema_version"]
        cls = EVENT_TYPES.get(tag)
        if cls is None:
            raise UnknownEventTypeError(
                f"unknown event type {tag!r} (known: {', '.join(sorted(EVENT_TYPES))}); the "
                "producer runs a newer or different rollwire: upgrade this consumer")
        if version > cls.SCHEMA_VERSION:
            raise SchemaVersionTooNewError(
                f"{tag} schema version {version} is newer than this reader's {cls.SCHEMA_VERSION}: "
                "upgrade rollwire on this consumer, then replay the dead letters")
        payload = raw["payload"]
        if version < cls.SCHEMA_VERSION:
            payload = cls.upgrade(payload, version)
        try:
            event = cls.model_validate(payload)
        except ValidationError as exc:
            raise InvalidEventError(f"{tag} event {raw['event_id']} fails validation: "
                                    f"{_summarise(exc)}") from exc
        return Envelope(event=event, event_id=raw["event_id"], produced_at_ms=raw["produced_at_ms"],
                        producer=raw["producer"], schema_version=version,
                        traceparent=raw["traceparent"])


def _unpack(data: bytes) -> dict:
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad bytes
        raise CorruptEventError(f"not a msgpack envelope ({type(exc).__name__}: {exc}); the record "
                                "was not written by a rollwire producer, or was truncated") from exc
    if not isinstance(raw, dict) or any(k not in raw for k in _ENVELOPE_KEYS):
        missing = [k for k in _ENVELOPE_KEYS if not isinstance(raw, dict) or k not in raw]
        raise CorruptEventError(f"envelope lacks {', '.join(missing)}; the record was not written "
                                "by a rollwire producer")
    if not isinstance(raw["type"], str) or not isinstance(raw["schema_version"], int) \
            or not isinstance(raw["payload"], dict) or not isinstance(raw["event_id"], str):
        raise CorruptEventError("envelope fields have the wrong types (type str, schema_version "
                                "int, event_id str, payload map expected)")
    return raw


def _summarise(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"]) or "(event)"
        parts.append(f"{where}: {err['msg']}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
