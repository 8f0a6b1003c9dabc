"""The scorer's changelog grows by one rollout per rollout, and rebuilds exactly the groups held."""

from __future__ import annotations

import itertools
import random
import time

from builders import group_of

from rollwire.schemas import Codec
from rollwire.schemas.scorer import ScorerGroupRollout, ScorerGroupState
from rollwire.streams import group_changelog
from rollwire.streams.scoring import GroupScorer, ScorerSettings

codec = Codec()


def run_through(scorer: GroupScorer, arrivals, *, now_of=lambda i: 1_000 + i, commits=lambda i: True):
    """Feeds rollouts (and `"tick"` markers) to the scorer as a driver would, its changelog writes
    coalesced until each commit (`commits(i)`: after input i; always after the last); yields at
    each commit the live states, the changelog as it stands (latest record per key), and the
    bytes and records written so far."""
    states: dict[str, ScorerGroupState] = {}
    latest: dict[str, bytes | None] = {}
    pending = group_changelog.PendingWrites()
    written = records = 0
    for i, item in enumerate(arrivals):
        steps = ([(gid, scorer.on_tick(s, now=now_of(i))) for gid, s in list(states.items())] if item == "tick"
                 else [(item.group_id, scorer.on_rollout(states.get(item.group_id), item, now=now_of(i)))])
        for gid, step in steps:
            pending.add(group_changelog.writes(gid, states.get(gid), step))
            if step.changed and step.state is None:
                states.pop(gid)
            elif step.changed:
                states[gid] = step.state
        if commits(i) or i == len(arrivals) - 1:
            for key, record in pending.drain():
                latest[key] = None if record is None else codec.encode(record, producer="test")
                written += len(key) + len(latest[key] or b"")
                records += 1
            yield states, latest, written, records


def shuffled_groups(groups: int, seed: int, *, redelivered_after: int) -> list:
    """Groups of 2 to 4 rollouts (group 2 with an errored one) in a shuffled order, one rollout
    delivered again, and ticks that time groups out and forget them."""
    arrivals: list = []
    for g in range(groups):
        arrivals += group_of(f"g{g}", [1, 0, 1, 0], errored=(1,) if g == 2 else ())[: 2 + g % 3]
    random.Random(seed).shuffle(arrivals)
    cut = redelivered_after
    return arrivals[:cut] + [arrivals[0], "tick"] + arrivals[cut:] + ["tick", "tick"]


def restored(latest: dict[str, bytes | None]) -> dict[str, ScorerGroupState]:
    return group_changelog.restore(codec.decode(v).event for v in latest.values() if v)


def test_a_group_of_k_rollouts_writes_about_k_rollouts_of_bytes():
    k = 32
    group = group_of("g", [float(i % 2) for i in range(k)], lengths=[50] * k)
    one_rollout = len(codec.encode(group[0], producer="test"))
    *_, (_, _, written, _) = run_through(GroupScorer(ScorerSettings()), group)
    # k rollout records, a header when the group opens and when it closes, k small tombstones.
    assert written < 1.25 * k * one_rollout, f"{written} B written for {k} rollouts of {one_rollout} B"


def test_restoring_after_any_prefix_gives_the_groups_the_scorer_held():
    scorer = GroupScorer(ScorerSettings(group_timeout_s=0.005, retain_closed_s=0.02, min_group_size=2))
    arrivals = shuffled_groups(6, seed=7, redelivered_after=5)
    seen_closed = seen_forgotten = False
    for states, latest, _, _ in run_through(scorer, arrivals, now_of=lambda i: 1_000 + 4 * i):
        assert restored(latest) == states
        seen_closed |= any(s.closed_at_ms is not None for s in states.values())
        seen_forgotten |= len(states) < len({r.group_id for r in arrivals[:5] if r != "tick"})
    assert seen_closed and seen_forgotten


def test_writes_coalesced_per_batch_restore_the_same_groups_with_fewer_records():
    scorer = GroupScorer(ScorerSettings(group_timeout_s=0.005, retain_closed_s=0.02, min_group_size=2))
    arrivals = shuffled_groups(12, seed=11, redelivered_after=9)
    rng = random.Random(11)
    batched = 0
    for states, latest, _, batched in run_through(scorer, arrivals, now_of=lambda i: 1_000 + 4 * i,  # noqa: B007
                                                  commits=lambda i: rng.random() < 0.3):
        assert restored(latest) == states  # at every commit
    *_, (_, _, _, unbatched) = run_through(scorer, arrivals, now_of=lambda i: 1_000 + 4 * i)
    assert batched < unbatched


def test_coalescing_keeps_the_last_write_and_drops_records_born_and_deleted_in_one_batch():
    pending = group_changelog.PendingWrites()
    open_header, closed_header = object(), object()
    pending.add([("g", open_header), ("g\x000", "r0")])          # the group opens in this batch
    pending.add([("old\x001", None)])                            # a record from an earlier batch
    pending.add([("g", closed_header), ("g\x000", None)])        # ...and closes in it
    assert pending.drain() == [("g", closed_header), ("old\x001", None)]
    assert len(pending) == 0


def test_the_order_rollouts_arrive_in_does_not_change_the_group():
    group = group_of("g", [1, 0, 1, 0])
    held = set()
    for order in itertools.permutations(group[:3]):
        *_, (states, _, _, _) = run_through(GroupScorer(ScorerSettings()), order)
        held.add(codec.encode(states["g"].model_copy(update={"first_seen_ms": 0}), producer="t")[-400:])
    assert len(held) == 1


def test_a_changelog_written_as_whole_groups_still_restores():
    group = group_of("g", [1, 0, 1, 0])
    whole = ScorerGroupState(group_id="g", environment="reverse-digits", algorithm="grpo", group_size=4,
                             first_seen_ms=5, rollouts=group[:2], rollout_ids=[r.rollout_id for r in group[:2]])
    state = group_changelog.restore([whole, ScorerGroupRollout(rollout=group[2])])["g"]
    assert [r.rollout_id for r in state.rollouts] == ["g-r0", "g-r1", "g-r2"] == state.rollout_ids


def test_rollout_records_of_a_closed_group_are_ignored_and_removed_when_it_is_forgotten():
    group = group_of("g", [1, 0])
    closed = ScorerGroupState(group_id="g", environment="reverse-digits", algorithm="grpo", group_size=2,
                              first_seen_ms=5, rollout_ids=["g-r0", "g-r1"], closed_at_ms=9)
    assert group_changelog.restore([closed, ScorerGroupRollout(rollout=group[0])])["g"] == closed  # a crash left group[0] behind
    forget = GroupScorer(ScorerSettings(retain_closed_s=0)).on_tick(closed, now=10)
    keys = [k for k, v in group_changelog.writes("g", closed, forget) if v is None]
    assert keys == ["g", group_changelog.rollout_key("g", 0), group_changelog.rollout_key("g", 1)]


def test_a_changelog_record_that_does_not_decode_is_dead_lettered_and_the_rest_restored(tmp_path):
    from rollwire.core.bus import Beginning, EmbeddedBusSettings, EventProducer, catalog_topics, open_log
    from rollwire.schemas import Topics
    from rollwire.streams.embedded_scorer import EmbeddedScorer
    log, topics = open_log(EmbeddedBusSettings(path=tmp_path / "log")), Topics("cl")
    log.create_topics(catalog_topics(topics))
    scorer = GroupScorer(ScorerSettings())
    started = int(time.time() * 1000)  # the service's first tick must not time the group out
    *_, (states, latest, _, _) = run_through(scorer, group_of("g", [1, 0, 1, 0])[:2], now_of=lambda i: started + i)
    producer = EventProducer(log.producer(), topics, name="test")
    for key, value in latest.items():
        producer.send(topics.name("scorer-state"), codec.decode(value).event, key=key)
    producer.close()
    with log.producer() as raw:
        raw.send(topics.name("scorer-state"), b"\xc1 garbage", key=b"h")
        raw.flush()

    service = EmbeddedScorer(log, topics, scorer)
    service.step(timeout_s=0.5)
    assert service.states == states
    with log.reader([topics.deadletter], Beginning()) as reader:
        letters = [codec.decode(r.value).event for r in reader.poll_batch(10, 2.0)]
    assert [(d.source_topic, d.key) for d in letters] == [("cl.scorer-state", b"h")]
    service.close()
    log.close()
