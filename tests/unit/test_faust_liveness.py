"""`Liveness.observe`: how long the oldest uncommitted record of an owned partition has waited,
from the broker's end and committed offsets (the real broker's case: tests/integration)."""

from __future__ import annotations

from rollwire.core.bus import BusError, KafkaBusSettings
from rollwire.streams.faust_app import Liveness

R0, R1, T0 = ("rollouts", 0), ("rollouts", 1), ("ticks", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch() -> tuple[Liveness, Clock]:
    clock = Clock()
    return Liveness(KafkaBusSettings(bootstrap_servers="127.0.0.1:1"), "g", ["rollouts", "ticks"], 60, clock), clock


class Away:
    """The event log of a broker that is away."""

    def end_offsets(self, topic: str) -> dict[int, int]:
        raise BusError(f"could not read the end offsets of {topic!r}")


def test_a_record_left_uncommitted_waits_from_when_it_was_first_seen():
    liveness, clock = watch()
    assert liveness.observe({R0: 10, T0: 5}, {R0: 10, T0: 5}, {R0, T0}) == 0
    clock.now = 1
    assert liveness.observe({R0: 12, T0: 6}, {R0: 10, T0: 6}, {R0, T0}) == 0  # R0's 10 and 11 seen now
    clock.now = 50
    assert liveness.observe({R0: 20, T0: 60}, {R0: 11, T0: 59}, {R0, T0}) == 49  # 11 still not committed; T0 new
    clock.now = 51
    assert liveness.observe({R0: 20, T0: 61}, {R0: 12, T0: 60}, {R0, T0}) == 0  # both caught up: watched anew
    clock.now = 70
    assert liveness.observe({R0: 20, T0: 71}, {R0: 12, T0: 70}, {R0, T0}) == 19  # R0's 12..19 since 51


def test_a_partition_another_worker_owns_does_not_count_and_a_lost_one_is_forgotten():
    liveness, clock = watch()
    assert liveness.observe({R0: 5, R1: 9}, {R0: 0, R1: 0}, {R0}) == 0
    clock.now = 100
    assert liveness.observe({R0: 5, R1: 9}, {R0: 0, R1: 0}, {R0}) == 100  # R1 is not ours
    assert liveness.observe({R0: 5, R1: 9}, {R0: 0, R1: 0}, {R1}) == 0  # R0 moved away; R1 seen only now


def test_an_unreachable_broker_starts_the_watch_over():
    liveness, clock = watch()
    liveness.observe({R0: 5}, {}, {R0})  # nothing ever committed counts from 0
    clock.now = 30
    liveness._log = Away()
    assert liveness.check({R0}) == 0  # no broker there: no verdict, and the wait seen so far is forgotten
    clock.now = 40
    assert liveness.observe({R0: 5}, {}, {R0}) == 0
