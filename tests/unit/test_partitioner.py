"""Keys land on the partitions Kafka's Java client would choose."""

from __future__ import annotations

import ctypes

import pytest

from rollwire.core.bus.partitioner import murmur2, partition_for

# Printed by org.apache.kafka.common.utils.Utils.murmur2 (kafka-clients 4.1.1) for these strings.
JAVA_MURMUR2 = {"21": -973932308, "foobar": -790332482, "abc": 479470107,
                "a-little-bit-long-string": -985981536, "group-7f3a": -782892229, "": 275646681,
                "x": 2121525046, "xy": -1884506471, "xyz": -2021271510}


@pytest.mark.parametrize("text, expected", JAVA_MURMUR2.items())
def test_murmur2_matches_the_java_client(text, expected):
    assert ctypes.c_int32(murmur2(text.encode())).value == expected


def test_partition_is_positive_murmur2_modulo_partitions():
    assert [partition_for(k.encode(), 7) for k in ("21", "foobar", "abc", "group-7f3a")] == [3, 0, 4, 2]
    assert all(0 <= partition_for(None, 5) < 5 for _ in range(50))
