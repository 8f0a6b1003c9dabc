"""Key-to-partition mapping compatible with Kafka's Java client (and librdkafka `murmur2_random`),
so the embedded log and Kafka put a key on the same partition."""

from __future__ import annotations

import functools
import random

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """32-bit murmur2 with Kafka's seed 0x9747b28c, as an unsigned int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    rounded = length & ~3
    for i in range(0, rounded, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[rounded + 2] << 16
    if tail >= 2:
        h ^= data[rounded + 1] << 8
    if tail >= 1:
        h ^= data[rounded]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes | None, partitions: int) -> int:
    """The partition of `key`: murmur2 (sign bit cleared) mod `partitions`; random without a key."""
    if key is None:
        return random.randrange(partitions)
    return _keyed_partition(key, partitions)


@functools.lru_cache(maxsize=16384)
def _keyed_partition(key: bytes, partitions: int) -> int:
    """Cached: the same keys come back (every rollout of a group, every record of its changelog),
    and murmur2 in Python costs about 2 us a key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
