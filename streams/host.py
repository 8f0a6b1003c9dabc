"""What a stream processor's host hands its driver: the events to send.

A host (`scorer_host.py`, `joiner_host.py`) holds a processor's state between events and is free of
any transport; its drivers (in-process over any event log, faust on Kafka) feed it records, send
the `Output`s it returns, and store the changelog writes it gathers before committing offsets.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas.base import Event
from rollwire.streams.group_changelog import PendingWrites, Write


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


S = TypeVar("S")


class Held(Generic[S]):
    """The states a host holds, by key, each read from the driver's store the first time it is
    needed; None marks a key known absent, or forgotten until its tombstone is written."""

    def __init__(self, load: Callable[[str], S | None]) -> None:
        self._load = load
        self._states: dict[str, S | None] = {}

    def get(self, key: str) -> S | None:
        if key not in self._states:
            self._states[key] = self._load(key)
        return self._states[key]

    def put(self, key: str, state: S | None) -> None:
        self._states[key] = state

    def keys(self) -> list[str]:
        return list(self._states)

    def alive(self) -> dict[str, S]:
        """Every state read or made so far and not forgotten."""
        return {k: s for k, s in self._states.items() if s is not None}

    def written(self, writes: Iterable[tuple[str, object]]) -> None:
        """After `writes` reached the store: keys whose tombstone is among them leave memory."""
        for key, record in writes:
            if record is None and key in self._states and self._states[key] is None:
                del self._states[key]


class StateHost(Generic[S]):
    """What the processors' hosts share: the states held by key (`Held`, set by each host's `reset`
    from its store), the changelog writes pending, the partitions keys hash to, and the counts."""

    _held: Held[S]

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.stats: collections.Counter[str] = collections.Counter()
        self._pending = PendingWrites()

    def writes(self) -> list[Write]:
        """The changelog writes since the last call, coalesced per key, in order: the driver stores
        them before it commits the input's offsets. States forgotten leave memory now."""
        out = self._pending.drain()
        self._held.written(out)
        return out

    def state(self, key: str) -> S | None:
        """The state under `key` as held now (read from the store the first time)."""
        return self._held.get(key)

    def held(self) -> dict[str, S]:
        """Every state read or made so far and not forgotten."""
        return self._held.alive()

    def partition_of(self, key: str) -> int:
        return partition_for(key.encode(), self.partitions)

    def _keys_in(self, partition: int, stored: Iterable[str]) -> list[str]:
        """The keys of `partition`: those stored and those held since (a dict keeps them unique, in order)."""
        keys = dict.fromkeys(stored)
        keys.update(dict.fromkeys(k for k in self._held.keys() if self.partition_of(k) == partition))
        return list(keys)
