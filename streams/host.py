"""What a stream processor's host hands its driver: the events to send.

A host (`scorer_host.py`, `joiner_host.py`) holds a processor's state between events and is free of
any transport; its drivers (in-process over any event log, faust on Kafka) feed it records, send
the `Output`s it returns, and store the changelog writes it gathers before committing offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollwire.schemas.base import Event


@dataclass(frozen=True)
class Output:
    """One event to send: to catalog topic `topic` (short name), keyed by `key`."""

    topic: str
    event: Event
    key: str
    made_by: Event | None = None
    """The state that made it, for its span's links (the joiner's receipt); None when none."""


@dataclass
class Applied:
    """What one input record produced."""

    outputs: list[Output] = field(default_factory=list)
    rejected: str | None = None
    """Why the input is unusable: the driver dead-letters its record with this reason."""
