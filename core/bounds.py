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
import hashlib
import logging
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rollwire.core import metrics

logger = logging.getLogger(__name__)

BYTES_PER_KEY = 48
"""The most one key of a `RecentKeys` costs: its digest in the table (2 to 4 slots of 8 B, by how
`limit` falls between powers of two; ~21 B at 200,000) and in the order kept (8 B). The figure the
operations guide quotes; the test holds the real cost under it."""

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
    """A key's 64-bit digest, the same in every process (Python's `hash` of a str is not); never 0,
    which marks an empty slot of a `RecentKeys` table (a digest of 0 is taken as 1)."""
    text = key if isinstance(key, str) else "\x00".join(map(str, key))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1


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
    """The last `limit` keys added, for recognising redeliveries in bounded memory.

    Held as 64-bit digests in two flat arrays, never as Python objects: a hash table (open
    addressing, linear probing; at most half full) and a ring of the order they came in. Both grow
    while the window fills and are never reallocated once it is full: the table has room for
    `limit` keys from then on, and a full window forgets its oldest digest in place for each one it
    learns (a deletion shifts its probe run back, so no deleted slots pile up). A `set` beside a
    `deque` costs about three times as much, and a set that forgets as fast as it learns fills with
    deleted slots and allocates its whole table again every ~100,000 keys: 8 MB blocks at 200,000
    keys, which the allocator moved into its heap and kept two of (the dispatcher's RSS rose in
    8 MB steps an hour into a soak; `bench/dedupe_memory.py` measures both).
    """

    def __init__(self, limit: int, name: str, *, digests: Iterable[int] = (), what: str = "") -> None:
        if limit < 1:
            raise ValueError(f"{name}: a window of {limit} keys remembers nothing; set it to 1 or more")
        self.limit, self.name, self.what = limit, name, what
        self.forgotten = 0
        """Keys pushed out by newer ones since the start."""
        self._final_size = max(16, 1 << (2 * limit - 1).bit_length())
        """The table's size once the window is full: the power of two at or above twice `limit` (16 at least)."""
        self._table = array("Q", bytes(8 * 16))
        self._mask = len(self._table) - 1
        self._order = array("Q")
        self._oldest = 0
        """Where the oldest digest is in `_order` once the window is full (a ring from then on)."""
        for d in digests:
            self._remember(d or 1)  # (as `digest` would)

    def add(self, key: Key) -> bool:
        """Remembers `key`; False when it was already remembered (a redelivery)."""
        d = digest(key)
        slot, found = self._slot(d)
        if found:
            return False
        self._insert(d, slot)
        return True

    def digests(self) -> list[int]:
        """What is remembered, oldest first (`RecentKeys(..., digests=...)` takes it back)."""
        order = self._order
        return (order[self._oldest:] + order[:self._oldest]).tolist()

    def _remember(self, d: int) -> None:
        slot, found = self._slot(d)
        if not found:
            self._insert(d, slot)

    def _slot(self, d: int) -> tuple[int, bool]:
        """Where `d` is in the table (True), or the empty slot where it would go (False)."""
        table, mask = self._table, self._mask
        i = d & mask
        while True:
            held = table[i]
            if held == d:
                return i, True
            if held == 0:
                return i, False
            i = (i + 1) & mask

    def _insert(self, d: int, slot: int) -> None:
        self._table[slot] = d
        if len(self._order) < self.limit:
            self._order.append(d)
            if 2 * len(self._order) > len(self._table) < self._final_size:
                self._grow()
            return
        forgotten = self._order[self._oldest]
        self._order[self._oldest] = d
        self._oldest = (self._oldest + 1) % self.limit
        self._delete(forgotten)
        self.forgotten += 1
        noted(self.name, what=self.what)

    def _grow(self) -> None:
        """Doubles the table while the window fills (never once it is full)."""
        self._table = array("Q", bytes(16 * len(self._table)))
        self._mask = len(self._table) - 1
        for d in self._order:
            self._table[self._slot(d)[0]] = d

    def _delete(self, d: int) -> None:
        """Empties `d`'s slot and moves back each later digest of its probe run that may sit there, so
        every digest stays reachable from its home slot without a marker for deleted ones."""
        table, mask = self._table, self._mask
        hole = self._slot(d)[0]
        i = hole
        while True:
            i = (i + 1) & mask
            held = table[i]
            if held == 0:
                break
            if (i - held) & mask >= (i - hole) & mask:  # its home is not between the hole and i
                table[hole] = held
                hole = i
        table[hole] = 0

    def __contains__(self, key: Key) -> bool:
        return self._slot(digest(key))[1]

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
