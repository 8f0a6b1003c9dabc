"""The stream processors' hosts alone, with no driver and no log: what they hold, what they return,
what they write, and what they read back after a rebalance."""

from __future__ import annotations

from builders import group_of, served

from rollwire.core.bus.partitioner import partition_for
from rollwire.schemas import FeedbackReceived, RolloutsDropped, ScoredRollout
from rollwire.streams.feedback_join import FeedbackJoiner, FeedbackJoinSettings
from rollwire.streams.joiner_host import JoinerHost, baseline_key, baseline_partition
from rollwire.streams.scorer_host import ScorerHost
from rollwire.streams.scoring import GroupScorer, ScorerSettings

T0 = 1_790_000_000_000


class Groups:
    """A store of groups, as a driver's changelog would hold them."""

    def __init__(self, states, partitions=4):
        self.states, self.partitions = dict(states), partitions
        self.reads = 0

    def group(self, group_id):
        self.reads += 1
        return self.states.get(group_id)

    def group_ids(self, partition):
        return [g for g in self.states if partition_for(g.encode(), self.partitions) == partition]


def test_past_max_open_groups_the_oldest_open_group_over_every_partition_is_closed():
    ids = ["a", "b", "c"]
    assert len({partition_for(g.encode(), 4) for g in ids}) > 1  # the groups are spread over partitions
    host = ScorerHost(GroupScorer(ScorerSettings(max_open_groups=2)), partitions=4)
    for i, g in enumerate(ids):
        applied = host.rollout(group_of(g, [1, 0, 1])[0], now=T0 + i)
    [out] = applied.outputs
    assert (out.topic, out.key, out.event.reason) == ("drops", "a", "overflow")
    assert host.open_groups() == 2 and host.stats["overflow"] == 1


def test_a_group_forgotten_leaves_memory_once_its_tombstones_are_written():
    host = ScorerHost(GroupScorer(ScorerSettings(retain_closed_s=1)), partitions=4)
    for r in group_of("g", [1, 0]):
        outputs = host.rollout(r, now=T0).outputs
    assert [o.event.rollout.rollout_id for o in outputs if isinstance(o.event, ScoredRollout)] == ["g-r0", "g-r1"]
    assert [key for key, _ in host.writes()][0] == "g"
    assert host.tick(now=T0 + 999) == [] and "g" in host.held()
    host.tick(now=T0 + 1000)  # past retain_closed_s: forgotten
    assert "g" not in host.held()
    assert ("g", None) in host.writes() and host._held.keys() == []  # nothing of it is left, not even its id


def test_after_a_reset_groups_are_read_from_the_store_when_first_needed_and_time_out_there():
    scorer = GroupScorer(ScorerSettings(group_timeout_s=1))
    waiting = scorer.on_rollout(None, group_of("w", [1, 0, 1])[0], now=T0).state
    store = Groups({"w": waiting})
    host = ScorerHost(scorer, partitions=4)
    host.reset(store)
    assert store.reads == 0  # nothing is read at assignment (a faust table is recovered after it)
    [drop] = host.tick(now=T0 + 1000, partitions=[partition_for(b"w", 4)])
    assert isinstance(drop.event, RolloutsDropped) and drop.event.reason == "group_timeout"
    assert host.tick(now=T0 + 1000, partitions=range(4)) == []  # due once


def rating(feedback_id, value, receipt, source="app"):
    return FeedbackReceived(feedback_id=feedback_id, kind="rating", rating=value, response_id=receipt, source=source,
                            received_at_ms=T0)


def test_the_joiner_keeps_a_baseline_per_partition_and_writes_it_under_its_partition():
    receipts = [f"r{i}" for i in range(20)]
    first = receipts[0]
    other = next(r for r in receipts if partition_for(r.encode(), 4) != partition_for(first.encode(), 4))
    host = JoinerHost(FeedbackJoiner(FeedbackJoinSettings(baseline="source_mean")), partitions=4)
    for receipt in (first, other):
        assert host.event(served(response_id=receipt, served_at_ms=T0), now=T0) == []
    [one] = host.event(rating("f1", 1.0, first), now=T0)
    [two] = host.event(rating("f2", 1.0, other), now=T0)
    assert (one.event.advantage, two.event.advantage) == (1.0, 1.0)  # each partition's baseline starts afresh
    keys = [key for key, _ in host.writes() if key.startswith("\x00")]
    assert keys == [baseline_key("app", partition_for(first.encode(), 4)), baseline_key("app", partition_for(other.encode(), 4))]
    assert baseline_partition(keys[0], 4) == partition_for(first.encode(), 4)
    assert baseline_partition("\x00app", 4) == partition_for(b"\x00app", 4)  # a key from before partitions
    assert host.event(group_of("x", [1.0])[0]) is None  # not the joiner's input: the driver dead-letters it
