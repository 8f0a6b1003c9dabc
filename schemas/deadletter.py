"""The dead letter: a record some component could not use, kept with everything needed to replay it.

Produced by any consumer (through `rollwire.core.bus.events.DeadLetters`) on `deadletter` (key: the
source topic); consumed by operators and replay tools.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwire.schemas.base import Event

RAW_BYTES_KEPT = 256 * 1024
"""The most bytes of the original record a dead letter carries (larger records are truncated)."""


DeadLetterStage = Literal["decode", "process"]
"""Where a record failed: decoding it, or processing the event it holds."""

class DeadLetter(Event):
    """A record that failed decoding, validation or processing, with where it came from and why."""

    type: Literal["dead_letter"] = "dead_letter"
    source_topic: str
    """Topic the record was read from."""
    partition: int = Field(ge=0)
    """Partition of the record."""
    offset: int = Field(ge=0)
    """Offset of the record in its partition; with topic and partition, where to replay it from."""
    key: bytes | None = None
    """The record's key; None when it had none."""
    raw: bytes = b""
    """The record's value, truncated to `RAW_BYTES_KEPT` bytes."""
    raw_size: int = Field(default=0, ge=0)
    """The value's full size; larger than `len(raw)` when truncated."""
    stage: DeadLetterStage
    """`decode`: not a valid event; `process`: a valid event the component could not use."""
    error_type: str
    """Class name of the error, e.g. `SchemaVersionTooNewError`."""
    error: str
    """The error's message, which says what to do."""
    component: str
    """The component that gave up on the record, e.g. `scorer`."""
