"""Memory bounds: the dedupe windows and the scorer's closed groups forget their oldest entries past
their limits, count it, and cost what their settings say per entry."""

from __future__ import annotations

import collections
import gc
import json
import random
import tracemalloc
import uuid

from builders import group_of, served

from rollwire.core.bounds import BYTES_PER_KEY, RecentKeys, digest, pack, unpack
from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas import FeedbackReceived, RolloutsDropped, ScoredRollout
from rollwire.streams.feedback_join import FeedbackJoiner, FeedbackJoinSettings
from rollwire.streams.joiner_host import JoinerHost
from rollwire.streams.scorer_host import ScorerHost
from rollwire.streams.scoring import CLOSED_GROUP_BYTES, ClosedGroup, GroupScorer, ScorerSettings
from rollwire.trainer.checkpoint import TrainerState

T0 = 1_790_000_000_000


def test_recent_keys_recognise_a_redelivery_and_forget_the_oldest_past_the_limit():
    keys = RecentKeys(3, "test.window")
    assert [keys.add(k) for k in ("a", "b", "a", ("g", 1), ("g", 2))] == [True, True, False, True, True]
    assert len(keys) == 3 and keys.forgotten == 1
    assert "a" not in keys and "b" in keys and ("g", 1) in keys and ("g", 0) not in keys
    assert keys.add("a")  # forgotten, so new again: the cost the window's setting states


def test_recent_keys_come_back_from_their_digests_in_another_process():
    keys = RecentKeys(10, "test.window")
    for k in ("r-1", "r-2", ("t", 0, 7)):
        keys.add(k)
    restored = RecentKeys(10, "test.window", digests=unpack(pack(keys.digests())))
    assert restored.digests() == keys.digests() and "r-2" in restored and ("t", 0, 7) in restored
    # the digest is fixed, not Python's per-process hash: these values hold in every process
    assert digest("r-1") == int.from_bytes(__import__("hashlib").blake2b(b"r-1", digest_size=8).digest(), "little")
    assert digest(("t", 0, 7)) == digest("t\x000\x007")


def test_recent_keys_answer_as_a_set_and_a_queue_would_through_collisions_and_wraps():
    rng = random.Random(7)
    for limit in (1, 2, 5, 16, 100, 1000):
        keys, held, order, forgotten = RecentKeys(limit, "test.window"), set(), collections.deque(), 0
        pool = [f"r-{i}" for i in range(3 * limit + 2)]  # small windows: probe runs that wrap the table
        for _ in range(20 * limit + 50):
            key = rng.choice(pool)
            new = key not in held
            if new:
                held.add(key)
                order.append(key)
                if len(order) > limit:
                    held.discard(order.popleft())
                    forgotten += 1
            assert keys.add(key) == new, (limit, key)
        assert len(keys) == len(held) and keys.digests() == [digest(k) for k in order]
        assert [k in keys for k in pool] == [k in held for k in pool]
        assert keys.forgotten == forgotten
        assert RecentKeys(limit, "test.window", digests=keys.digests()).digests() == keys.digests()


def test_a_full_window_never_allocates_its_table_again():
    keys = RecentKeys(20_000, "test.window")
    for i in range(20_000):
        keys.add(f"r-{i}")
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(20_000, 120_000):  # five windows' worth, each forgetting the oldest
        keys.add(f"r-{i}")
    now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # a set forgetting as it learns reallocates its whole table (~0.5 MB here) every ~10,000 keys
    assert now - base < 4096 and peak - base < 16_384, (now - base, peak - base)
    assert keys.forgotten == 100_000 and len(keys) == 20_000
    assert "r-100000" in keys and "r-119999" in keys and "r-99999" not in keys and "r-1" not in keys


def test_a_remembered_key_costs_under_what_the_settings_state():
    ids = [str(uuid.uuid4()) for _ in range(50_000)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    keys = RecentKeys(len(ids), "test.window")
    for rid in ids:
        keys.add(rid)
    cost = (tracemalloc.get_traced_memory()[0] - before) / len(ids)
    tracemalloc.stop()
    assert 16 < cost < BYTES_PER_KEY, cost


def test_a_closed_group_is_held_compact_and_still_tells_a_redelivery_from_a_late_rollout():
    host = ScorerHost(GroupScorer(ScorerSettings()), partitions=2)
    rollouts = group_of("g", [1, 0, 1])
    for r in rollouts:
        host.rollout(r, now=T0)
    held = host.held()["g"]
    assert isinstance(held, ClosedGroup) and len(held) == 3
    assert host.rollout(rollouts[1], now=T0 + 1).outputs == [] and host.stats["duplicates"] == 1
    late = group_of("g", [1, 0, 1, 1])[3].model_copy(update={"group_size": 3})
    assert "already closed with 3 rollouts" in host.rollout(late, now=T0 + 1).rejected
    [(key, header)] = [w for w in host.writes() if w[0] == "g"]  # the changelog keeps the ids themselves
    assert header.rollout_ids == [r.rollout_id for r in rollouts]


def test_past_max_closed_groups_the_oldest_closed_group_is_forgotten_and_counted():
    host = ScorerHost(GroupScorer(ScorerSettings(max_closed_groups=2)), partitions=4)
    groups = {g: group_of(g, [1, 0]) for g in ("a", "b", "c")}
    for i, rollouts in enumerate(groups.values()):
        for r in rollouts:
            host.rollout(r, now=T0 + i)
        written = host.writes()
    assert set(host.held()) == {"b", "c"} and host.closed_groups() == 2 and host.stats["forgotten"] == 1
    assert ("a", None) in written  # its tombstone: a restart does not bring it back
    assert host.rollout(groups["b"][0], now=T0 + 5).outputs == []  # still recognised
    again = host.rollout(groups["a"][0], now=T0 + 5)  # forgotten: the redelivery opens the group anew
    assert again.rejected is None and host.open_groups() == 1


def test_closed_groups_are_forgotten_oldest_first_at_retain_closed_s():
    host = ScorerHost(GroupScorer(ScorerSettings(retain_closed_s=10)), partitions=4)
    for i, g in enumerate(("a", "b", "c")):
        outputs = [o for r in group_of(g, [1, 0]) for o in host.rollout(r, now=T0 + i * 4000).outputs]
        assert [type(o.event) for o in outputs] == [ScoredRollout, ScoredRollout]
    host.tick(now=T0 + 10_000)
    assert set(host.held()) == {"b", "c"}
    host.tick(now=T0 + 17_000)
    assert set(host.held()) == {"c"} and host.stats["forgotten"] == 0


def test_a_closed_group_costs_under_what_the_settings_state():
    host = ScorerHost(GroupScorer(ScorerSettings()), partitions=4)
    count = 2_000
    tracemalloc.start()  # (before the warm-up: what a later eviction frees was traced)
    for i in range(20_000):  # the partitioner's bounded cache of keys full already, as in a long run
        partition_for(f"warm-{i}".encode(), 4)
    gc.collect()
    before = tracemalloc.take_snapshot()
    for i in range(count):
        for r in group_of(uuid.uuid4().hex, [1, 0, 1, 0, 1, 0, 1, 0]):
            host.rollout(r, now=T0 + i)
        host.writes()
    gc.collect()
    # less the resizing of the partitioner's cache, which is as large after a million groups
    cache = [tracemalloc.Filter(False, "*/core/bus/partitioner.py")]
    grown = tracemalloc.take_snapshot().filter_traces(cache).compare_to(before.filter_traces(cache), "filename")
    cost = sum(stat.size_diff for stat in grown) / count
    tracemalloc.stop()
    assert host.closed_groups() == count
    assert cost < CLOSED_GROUP_BYTES, cost


def test_the_trainer_checkpoint_keeps_digests_and_reads_the_ids_older_checkpoints_hold():
    state = TrainerState(step=3, version=3, seen=[digest("r-1"), digest("r-2")])
    raw = json.loads(state.to_json())
    assert "seen" not in raw and TrainerState.from_json(state.to_json()).seen == state.seen
    old = {**raw, "seen": ["r-1", "r-2"]}
    del old["seen_digests"]
    assert TrainerState.from_json(json.dumps(old)).seen == state.seen


def test_an_overflowed_group_is_dropped_not_forgotten():
    host = ScorerHost(GroupScorer(ScorerSettings(max_open_groups=1, max_closed_groups=1)), partitions=2)
    host.rollout(group_of("a", [1, 0, 1])[0], now=T0)
    [out] = host.rollout(group_of("b", [1, 0, 1])[0], now=T0 + 1).outputs
    assert isinstance(out.event, RolloutsDropped) and out.event.reason == "overflow"
    assert isinstance(host.held()["a"], ClosedGroup) and host.stats["forgotten"] == 0


def rating(feedback_id: str, value: float, receipt: str) -> FeedbackReceived:
    return FeedbackReceived(feedback_id=feedback_id, source="app", kind="rating", rating=value, response_id=receipt,
                            received_at_ms=T0)


def test_past_max_receipts_the_joiner_forgets_its_oldest_receipt_and_drops_what_waited_there():
    host = JoinerHost(FeedbackJoiner(FeedbackJoinSettings(max_receipts=2)), partitions=4)
    assert host.event(rating("early", 1.0, "r0"), now=T0) == []  # feedback first: it waits for its record
    assert [key for key, _ in host.writes()] == ["r0"]
    host.event(served(response_id="r1", served_at_ms=T0), now=T0 + 1)
    [dropped] = host.event(served(response_id="r2", served_at_ms=T0), now=T0 + 2)
    assert isinstance(dropped.event, RolloutsDropped) and dropped.event.reason == "overflow"
    assert dropped.event.rollout_ids == ["early"] and "max_receipts 2" in dropped.event.detail
    assert set(host.held()) == {"r1", "r2"} and host.stats["forgotten"] == 1
    assert ("r0", None) in host.writes()
    [sample] = host.event(rating("late", 1.0, "r1"), now=T0 + 3)  # a receipt kept still joins
    assert isinstance(sample.event, ScoredRollout)


def test_the_joiner_schedule_is_rebuilt_when_it_holds_mostly_stale_entries():
    host = JoinerHost(FeedbackJoiner(FeedbackJoinSettings(max_receipts=10)), partitions=1)
    host.tick(now=T0)  # the schedule exists from the first tick
    for i in range(3000):
        host.event(served(response_id=f"r{i}", served_at_ms=T0), now=T0)
    assert len(host.held()) == 10 and host.stats["forgotten"] == 2990
    assert len(host._schedules[0]) <= 2 * 10 + 1024 + 1
