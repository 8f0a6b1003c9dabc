"""Memory bounds: what a long-running component keeps about the past, and what it forgets first.

A run lasts for days, so every map a component fills as events pass has a bound, and passing the
bound is visible rather than silent:

    bound hit ──▶ RecentKeys / the scorer's closed groups forget their oldest entry
              ──▶ noted(name, n): `rollwire.bound.forgotten{rollwire.bound=name}` += n, the
                  component's `forgotten` count += n, and one warning per bound per process

`RecentKeys` is the shape most of them share: the keys of the last `limit` items seen, to
recognise a redelivery. It keeps each key's 64-bit digest (`digest`, stable across processes, so
a checkpoint can hold them: `pack`), never the key or its event, so a dedupe window costs the same
whatever the ids look like (`BYTES_PER_KEY`, measured in `tests/unit/test_bounds.py`). A key is
new when its digest is: two keys of one digest (about one chance in 10^7 among a million keys
held) make the second look like a redelivery.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import logging
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rollwire.core import metrics

logger = logging.getLogger(__name__)

BYTES_PER_KEY = 100
"""About what one key of a `RecentKeys` costs (its hash in a set and in the order kept): the
figure the settings' docstrings quote. The test holds the real cost under it."""

Key = str | tuple[str | int, ...]
"""A rollout id, or a tuple of ids and numbers (a group id and a sample index; a topic, partition, offset)."""

_warned: set[str] = set()
_counter = None


def noted(name: str, forgotten: int = 1, *, what: str = "") -> None:
    """`forgotten` entries left bound `name` because it was full: counted, and warned about once."""
    global _counter
    if _counter is None:
        _counter = metrics.meter().create_counter(
            "rollwire.bound.forgotten", unit="{entry}",
            description="entries a component forgot before their time because a memory bound was full, per bound")
    _counter.add(forgotten, {"rollwire.bound": name})
    if name not in _warned:
        _warned.add(name)
        logger.warning("%s is full: the oldest entries are forgotten from now on%s (counted in "
                       "rollwire.bound.forgotten{rollwire.bound=%s}; this is said once)", name, what, name)


def digest(key: Key) -> int:
    """A key's 64-bit digest, the same in every process (Python's `hash` of a str is not)."""
    text = key if isinstance(key, str) else "\x00".join(map(str, key))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def pack(digests: Iterable[int]) -> str:
    """Digests as one compact string (8 bytes each, base64), for a checkpoint."""
    packed = array("Q", digests)
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode()


def unpack(text: str) -> list[int]:
    packed = array("Q", base64.b64decode(text))
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


class RecentKeys:
    """The last `limit` keys added, for recognising redeliveries in bounded memory."""

    def __init__(self, limit: int, name: str, *, digests: Iterable[int] = (), what: str = "") -> None:
        self.limit, self.name, self.what = limit, name, what
        self.forgotten = 0
        """Keys pushed out by newer ones since the start."""
        self._digests: set[int] = set()
        self._order: collections.deque[int] = collections.deque()
        for d in digests:
            self._remember(d)

    def add(self, key: Key) -> bool:
        """Remembers `key`; False when it was already remembered (a redelivery)."""
        d = digest(key)
        if d in self._digests:
            return False
        self._remember(d)
        return True

    def digests(self) -> list[int]:
        """What is remembered, oldest first (`RecentKeys(..., digests=...)` takes it back)."""
        return list(self._order)

    def _remember(self, d: int) -> None:
        if d in self._digests:
            return
        self._digests.add(d)
        self._order.append(d)
        if len(self._order) > self.limit:
            self._digests.discard(self._order.popleft())
            self.forgotten += 1
            noted(self.name, what=self.what)

    def __contains__(self, key: Key) -> bool:
        return digest(key) in self._digests

    def __len__(self) -> int:
        return len(self._order)


@dataclass
class Points:
    """A series (a curve's points) of at most `limit` points: past it, every other point is dropped (the curve
    keeps its shape at half the resolution)."""

    limit: int
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) > self.limit:
            self.rows = self.rows[::2]
