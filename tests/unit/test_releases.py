"""Serving decisions (`rollwire promote`, `rollwire rollback`): what they refuse, what the serving
plan and the routing make of them, and what a serving replica loads in each lane. The engine here
is a recording stand-in; the real swap back to an older version is in tests/inference."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

from rollwire.consumers.vllm_control import SwapTimes
from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
from rollwire.core.bus import EmbeddedBusSettings, catalog_topics, open_log
from rollwire.core.errors import ConfigError
from rollwire.core.objectstore import LocalStore
from rollwire.core.weight_versions import CheckpointMissingError, publish, version_prefix
from rollwire.producers.releases import ServingPlan, history, promote, rollback
from rollwire.producers.routing import Member, choose
from rollwire.schemas import Topics


class RecordingControl:
    """Stands in for a vLLM server's control client: records the versions swapped in."""

    def __init__(self) -> None:
        self.swapped: list[str] = []

    def swap_full_weights(self, folder: str, label: str, *, stage: bool = True) -> SwapTimes:
        self.swapped.append(label)
        return SwapTimes(drain_s=0.001, apply_s=0.008, paused_s=0.01)


@pytest.fixture
def world(tmp_path):
    topics = Topics("rel")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    store = LocalStore(tmp_path / "store")
    for version in (1, 2, 3):
        folder = tmp_path / f"w{version}"
        folder.mkdir()
        save_file({"w": np.full((2, 2), version, dtype=np.float32)}, str(folder / "model.safetensors"))
        publish(store, folder, version_prefix("policy", version), policy="policy", version=version, step=version)
    yield log, topics, store
    log.close()


def test_a_canary_needs_a_stable_version_and_a_rollback_a_verified_one(world):
    log, topics, store = world
    with pytest.raises(ConfigError, match="promote one first"):
        promote(log, topics, store, policy="policy", version=2, canary_share=0.1)
    promote(log, topics, store, policy="policy", version=1, decided_by="ops")
    canary = promote(log, topics, store, policy="policy", version=2, canary_share=0.25, note="on trial")
    assert (canary.stable.version, canary.canary.version, canary.canary_share) == (1, 2, 0.25)
    with pytest.raises(ConfigError, match="never stable .*stable so far: 1.*--force"):
        rollback(log, topics, store, policy="policy", version=2)
    with pytest.raises(CheckpointMissingError, match="version 9 of policy 'policy' is not in the store"):
        promote(log, topics, store, policy="policy", version=9)
    back = rollback(log, topics, store, policy="policy", version=1, note="v2 repeats itself")
    assert back.canary is None and back.stable.version == 1
    assert [(d.reason, d.stable.version) for d in history(log, topics, "policy")] == [
        ("promote", 1), ("canary", 1), ("rollback", 1)]
    assert rollback(log, topics, store, policy="policy", version=3, force=True).stable.version == 3


def test_the_plan_sends_the_canary_its_share_and_routing_finds_the_replica_serving_it(world):
    log, topics, store = world
    promote(log, topics, store, policy="policy", version=1)
    promote(log, topics, store, policy="policy", version=2, canary_share=0.25)
    plan = ServingPlan("policy").follow(log, topics)
    rng = random.Random(0)
    picks = [plan.pick(rng) for _ in range(4000)]
    assert 0.22 < picks.count((2, "canary")) / len(picks) < 0.28
    assert set(picks) == {(1, "stable"), (2, "canary")}
    members = [Member("r1", "u1", 1, "serving", 0.0, None), Member("r2", "u2", 2, "serving", 0.0, None),
               Member("r3", "u3", 3, "serving", 0.0, None)]
    assert choose(members, sticky=None, min_version=None, prefer=(1, "stable"))[0].replica_id == "r1"
    assert choose(members, sticky=None, min_version=None, prefer=(2, "canary")) == (members[1], "canary")
    member, why = choose(members[:1] + members[2:], sticky=None, min_version=None, prefer=(2, "canary"))
    assert (member.replica_id, why) == ("r3", "canary-unserved")  # no replica has it yet: the newest
    rollback(log, topics, store, policy="policy", version=1)
    deadline = time.monotonic() + 10
    while plan.decision.reason != "rollback" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {plan.pick(rng) for _ in range(200)} == {(1, "stable")}
    plan.close()


@pytest.mark.parametrize("lane, expected", [("stable", ["1", "1", "2", "1"]), ("canary", ["1", "2", "2", "1"])])
def test_a_serving_replica_loads_its_lanes_version_older_ones_on_a_rollback(world, tmp_path, lane, expected):
    log, topics, store = world
    control = RecordingControl()
    subscriber = WeightSubscriber(log, topics, store, control, WeightSubscriberSettings(
        replica_id=f"r-{lane}", cache_dir=tmp_path / f"cache-{lane}", follow="serving", lane=lane))
    promote(log, topics, store, policy="policy", version=1)
    assert subscriber.catch_up().serving_version == 1
    promote(log, topics, store, policy="policy", version=2, canary_share=0.1)
    subscriber.poll(timeout_s=2.0)
    promote(log, topics, store, policy="policy", version=2)
    subscriber.poll(timeout_s=2.0)
    rollback(log, topics, store, policy="policy", version=1)
    subscriber.poll(timeout_s=2.0)
    # every change of version is one swap; a decision that leaves the lane's version alone is none
    changes = [v for i, v in enumerate(expected) if i == 0 or v != expected[i - 1]]
    assert control.swapped == changes
    assert subscriber.serving_version == 1
    subscriber.close()
