"""The replay's comparison of recorded and replayed scores: exact counts, bounded memory."""

from __future__ import annotations

import random
import statistics

import pytest

from rollwire.streams.replay import LARGEST_KEPT, Stats, Summary, compare


def summary(group: str, reward: float, advantage: float, tag: bytes = b"") -> Summary:
    return Summary("env", group, reward, advantage, digest=bytes([int(advantage * 10) % 256]) + tag)


def test_counts_the_largest_changes_and_the_groups_left_without_signal():
    recorded = [("a0", summary("a", 1, 0.5)), ("a1", summary("a", 0, -0.5)),   # group a: loses its signal
                ("b0", summary("b", 1, 0.5)), ("b1", summary("b", 0, -0.5)),   # group b: unchanged
                ("c0", summary("c", 1, 0.2)), ("gone", summary("c", 1, 0.1)),  # c: one changes, one only recorded
                ("a0", summary("a", 1, 0.5))]                                  # a redelivered scoring counts once
    replayed = [("a0", summary("a", 1, 0.0)), ("a1", summary("a", 1, 0.0)),
                ("b0", summary("b", 1, 0.5)), ("b1", summary("b", 0, -0.5)),
                ("c0", summary("c", 1, -1.8)), ("new", summary("c", 1, 0.3))]
    result = compare(recorded, replayed)
    assert (result.identical, result.changed, result.only_recorded, result.only_replayed) == (2, 3, 1, 1)
    assert result.examples["only_recorded"] == ["gone"] and result.examples["only_replayed"] == ["new"]
    assert result.zero_signal_groups == 1 and result.examples["zero_signal"] == ["a"]
    assert [rid for rid, _, _ in result.largest] == ["c0", "a1", "a0"]  # by size of the change (ties: by id, last first)
    env = result.environments["env"]
    assert env.rollouts == 5 and env.sign_flips == 1
    assert env.advantages_after.mean == pytest.approx(statistics.fmean([0, 0, 0.5, -0.5, -1.8]))
    assert env.advantages_after.spread == pytest.approx(statistics.pstdev([0, 0, 0.5, -0.5, -1.8]))


def test_what_a_comparison_keeps_does_not_grow_with_the_run():
    rng = random.Random(3)
    n = 60_000
    recorded = [(f"r{i}", summary(f"g{i // 8}", 1, rng.uniform(-1, 1))) for i in range(n)]
    replayed = [(rid, summary(s.group_id, 1, s.advantage + 0.01, b"x")) for rid, s in recorded]
    result = compare(recorded, replayed)
    env = result.environments["env"]
    assert result.changed == n and len(result.largest) == LARGEST_KEPT
    assert len(env.advantages_before.sample) == 20_000 == len(env.advantages_after.sample)
    assert env.rewards_before.count == n


def test_stats_match_the_textbook_over_a_stream():
    values = [random.Random(1).gauss(2, 3) for _ in range(1000)]
    stats = Stats(sample_size=100)
    for v in values:
        stats.add(v)
    assert (stats.count, len(stats.sample)) == (1000, 100)
    assert stats.mean == pytest.approx(statistics.fmean(values)) and stats.spread == pytest.approx(statistics.pstdev(values))
