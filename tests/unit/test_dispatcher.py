"""The dispatcher keeps in-flight work inside the off-policy budget and mixes environments."""

from __future__ import annotations

from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.producers.dispatcher import Dispatcher, EnvironmentMix, WaitingAllowance, may_issue
from rollwire.producers.tasksets import load_taskset
from rollwire.schemas import Codec, RolloutsDropped, TaskAssigned, Topics, TrainStepCompleted
from rollwire.trainer.settings import BatchSettings


def test_the_budget_is_max_off_policy_plus_one_batches():
    assert may_issue(0, 8, 0, 8) and not may_issue(1, 8, 0, 8)
    assert may_issue(16, 8, 2, 8) and not may_issue(17, 8, 2, 8)


def test_rollouts_waiting_to_sample_are_free_up_to_the_allowance_and_count_past_it():
    # 24 sampling of a budget of 24 (max_off_policy 2, batches of 8): no room, as the group may sample at once
    assert not may_issue(24, 8, 2, 8, sampling=24, waiting_rollouts=16)
    # 16 sampling, 8 waiting: a group of 8 more fits the budget, and waits within the allowance of 16
    assert may_issue(24, 8, 2, 8, sampling=16, waiting_rollouts=16)
    # 16 sampling, 16 waiting: the group would be 8 past the allowance, counted: 16 + 8 <= 24
    assert may_issue(32, 8, 2, 8, sampling=16, waiting_rollouts=16)
    assert not may_issue(33, 8, 2, 8, sampling=17, waiting_rollouts=16)
    # no allowance: every rollout in flight counts, sampling or not (the synchronous loop)
    assert may_issue(0, 8, 0, 8, sampling=0, waiting_rollouts=0) and not may_issue(8, 8, 0, 8, sampling=0)


def test_the_budget_counts_a_rollout_from_its_first_generation_request(tmp_path):
    from rollwire.schemas import SamplingStarted
    topics = Topics("s")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    mix = [(EnvironmentMix(name="reverse-digits", group_size=4), load_taskset("reverse-digits", count=50))]
    dispatcher = Dispatcher(log, topics, mix, BatchSettings(max_off_policy=1, batch_rollouts=8))
    assert dispatcher.allowance.value == 8  # the default: max_off_policy batches
    # nothing sampling: 16 of budget, plus 8 waiting free -> 24 rollouts, 6 groups
    assert dispatcher.step() == 6 and dispatcher.in_flight == 24 and dispatcher.sampling == 0
    workers = EventProducer(log.producer(), topics, name="env-worker")
    tasks = []
    with log.reader([topics.tasks]) as reader:
        while batch := reader.poll_batch(100, 0.5):  # a poll may return one partition's records
            tasks += [Codec().decode(r.value).event for r in batch]
    assert len(tasks) == 6
    first_two = [(t.group_id, i) for t in tasks[:2] for i in range(4)]
    for group_id, index in first_two + first_two[:3]:  # three sent again: a worker re-ran them after a crash
        workers.send(topics.sampling, SamplingStarted(group_id=group_id, sample_index=index, worker="w"), key=group_id)
    workers.flush()
    # 8 sampling, 16 waiting: 8 + max(4, 16 + 4 - 8) = 20 > 16: no group fits
    assert dispatcher.step() == 0 and dispatcher.sampling == 8
    trainer = EventProducer(log.producer(), topics, name="trainer")
    trainer.send(topics.train, TrainStepCompleted(step=1, policy_version=1, rollout_ids=[f"r{i}" for i in range(8)]),
                 key="policy")
    trainer.flush()
    # the 8 sampling ones trained: 0 sampling, 16 waiting -> one more group of 4 waits free, ... up to 24 waiting
    assert dispatcher.step() == 2 and dispatcher.in_flight == 24 and dispatcher.sampling == 0
    dispatcher.close()
    log.close()


def test_the_dispatcher_issues_only_what_the_trainer_can_take_in_time(tmp_path):
    topics = Topics("d")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    mix = [(EnvironmentMix(name="reverse-digits", group_size=4, weight=3.0), load_taskset("reverse-digits", count=50)),
           (EnvironmentMix(name="math-word", group_size=4, weight=1.0, algorithm="rloo"), _math(tmp_path))]
    dispatcher = Dispatcher(log, topics, mix, BatchSettings(max_off_policy=1, batch_rollouts=8, waiting_rollouts=0))

    assert dispatcher.step() == 4 and dispatcher.in_flight == 16  # (1 + 1) * 8 rollouts
    assert dispatcher.step() == 0
    trainer = EventProducer(log.producer(), topics, name="trainer")
    trainer.send(topics.train, TrainStepCompleted(step=1, policy_version=1, rollout_ids=[f"r{i}" for i in range(6)]),
                 key="policy")
    trainer.send(topics.drops, RolloutsDropped(rollout_ids=["r6", "r7"], reason="stale", stage="trainer"), key="g")
    trainer.flush()
    assert dispatcher.step() == 2 and dispatcher.policy_version == 1
    # production feedback trained or dropped was never issued here: it frees nothing
    trainer.send(topics.train, TrainStepCompleted(step=2, policy_version=2, rollout_ids=["f0", "f1"],
                                                  samples={"sft": 2, "production": 2}), key="policy")
    trainer.send(topics.drops, RolloutsDropped(rollout_ids=["f2"], reason="stale", stage="trainer", production=True),
                 key="g")
    trainer.send(topics.drops, RolloutsDropped(rollout_ids=["f3"], reason="unjoinable", stage="feedback joiner",
                                               production=True), key="g")
    trainer.flush()
    assert dispatcher.step() == 0 and dispatcher.in_flight == 16
    dispatcher.close()

    restarted = Dispatcher(log, topics, mix, BatchSettings(max_off_policy=1, batch_rollouts=8, waiting_rollouts=0))
    assert restarted.step() == 0 and restarted.in_flight == 16  # its predecessor's work counts
    restarted.close()
    with log.reader([topics.tasks]) as reader:
        tasks = []
        while batch := reader.poll_batch(100, 0.3):
            tasks += [Codec().decode(r.value).event for r in batch]
    assert len(tasks) == 6 and all(isinstance(t, TaskAssigned) for t in tasks)
    assert {t.environment for t in tasks} <= {"reverse-digits", "math-word"}
    assert sorted(t.policy_version for t in tasks) == [0, 0, 0, 0, 1, 1]


def _math(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    return load_taskset("math-word", path=path)


def one_environment(tmp_path, prefix: str, *, max_off_policy: int, batch_rollouts: int):
    """A dispatcher of reverse-digits groups of 4 on a fresh log, and a producer standing in for the
    rest of the loop."""
    topics = Topics(prefix)
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    mix = [(EnvironmentMix(name="reverse-digits", group_size=4), load_taskset("reverse-digits", count=50))]
    dispatcher = Dispatcher(log, topics, mix, BatchSettings(max_off_policy=max_off_policy, batch_rollouts=batch_rollouts))
    return log, topics, dispatcher, EventProducer(log.producer(), topics, name="others")


def test_no_group_is_issued_while_the_fleet_serves_weights_older_than_the_budget_allows(tmp_path):
    from rollwire.schemas.weights import ReplicaStatus, WeightsPublished
    log, topics, dispatcher, others = one_environment(tmp_path, "f", max_off_policy=0, batch_rollouts=4)
    others.send(topics.fleet, ReplicaStatus(replica_id="r0", state="serving"), key="r0")
    others.flush()
    assert dispatcher.step() == 1  # version 0 published (the base) and served
    others.send(topics.train, TrainStepCompleted(step=1, policy_version=1, rollout_ids=["a", "b", "c", "d"]),
                key="policy")
    others.send(topics.weights, WeightsPublished(version=1, step=1, uri="file:///w/v1", manifest_sha256="0" * 64),
                key="policy")
    others.flush()
    assert dispatcher.step() == 0  # synchronous: the next batch waits until the replica serves version 1
    others.send(topics.fleet, ReplicaStatus(replica_id="r0", state="serving", serving_version=1), key="r0")
    others.flush()
    assert dispatcher.step() == 1
    others.send(topics.fleet, ReplicaStatus(replica_id="r0", state="stopped", serving_version=1), key="r0")
    others.flush()
    dispatcher.step()
    assert dispatcher.served == {}  # a stopped replica no longer holds the fleet back
    dispatcher.close()


def test_a_step_seen_before_its_weights_event_already_holds_the_next_batch_back(tmp_path):
    """The trainer sends its step event, then its weights event: in between, the step has freed the
    budget but the new version is not served. A batch issued then would sample the old weights."""
    from rollwire.schemas.weights import ReplicaStatus
    log, topics, dispatcher, others = one_environment(tmp_path, "race", max_off_policy=0, batch_rollouts=4)
    others.send(topics.fleet, ReplicaStatus(replica_id="r0", state="serving", serving_version=0), key="r0")
    others.flush()
    assert dispatcher.step() == 1
    others.send(topics.train, TrainStepCompleted(step=1, policy_version=1, rollout_ids=["a", "b", "c", "d"]),
                key="policy")
    others.flush()
    assert dispatcher.in_flight == 4 and dispatcher.step() == 0 and dispatcher.in_flight == 0
    others.send(topics.fleet, ReplicaStatus(replica_id="r0", state="serving", serving_version=1), key="r0")
    others.flush()
    assert dispatcher.step() == 1
    dispatcher.close()


def test_dead_lettered_rollouts_and_tasks_are_counted_back_once(tmp_path):
    """A refused rollout is never trained or dropped: without counting it back the budget shrinks
    for good, and a run whose rollouts are all refused stands still."""
    from rollwire.core.bus import DeadLetters, Record
    log, topics, dispatcher, others = one_environment(tmp_path, "dl", max_off_policy=0, batch_rollouts=8)
    assert dispatcher.step() == 2 and dispatcher.in_flight == 8
    letters = DeadLetters(others, "scorer")
    rollout = Record(topics.rollouts, 0, 5, b"g", b"not an event", 0)
    letters.send(rollout, "unknown advantage algorithm")
    letters.send(rollout, "unknown advantage algorithm")  # the same record again: counted once
    with log.reader([topics.tasks]) as reader:
        task = reader.poll_batch(1, 5.0)[0]
    letters.send(task, "no environment 'reverse-digits' in this worker")
    others.flush()
    dispatcher.step()
    assert dispatcher.dead_lettered == 5 and dispatcher.issued == 8 + 4  # 5 counted back: room for one group
    dispatcher.close()


def test_rows_come_round_again_read_anew_rather_than_kept():
    import itertools

    from rollwire.producers.dispatcher import endless

    class Two:
        name, passes = "two", 0

        def rows(self):
            Two.passes += 1
            yield from ({"task_id": f"t{i}"} for i in range(2))

    rows = endless(Two())
    assert [r["task_id"] for r in itertools.islice(rows, 5)] == ["t0", "t1", "t0", "t1", "t0"]
    assert Two.passes == 3  # each pass reads the taskset again: nothing handed out is held


def test_the_waiting_allowance_halves_while_stale_drops_are_high_and_grows_back_once_they_end():
    allowance = WaitingAllowance(ceiling=128, target=0.1)
    for _ in range(20):  # 3% stale, as a healthy run drops now and then: left alone
        allowance.stale(2)
        allowance.trained(62)
    assert allowance.value == 128 and allowance.narrowed == 0
    values = []
    for _ in range(10):  # a standing queue: a fifth of the work dropped as stale
        allowance.stale(16)
        allowance.trained(64)
        values.append(allowance.value)
    # the smoothed share: 6.5%, 9.2%, 11.4%, ...: past the target from the third step, halved each step after
    assert values == [128, 128, 64, 32, 16, 8, 4, 2, 1, 0]
    steps = 0
    while allowance.value < 128:  # no more stale drops: 5 steps for the share to decay below 5%, then +3 a step
        allowance.trained(64)
        steps += 1
    assert steps == 5 + 43
    never = WaitingAllowance(ceiling=128, target=1.0)
    for _ in range(10):
        never.stale(64)
        never.trained(0)
    assert never.value == 128


def test_the_dispatcher_narrows_its_allowance_on_the_trainers_stale_drops(tmp_path):
    log, topics, dispatcher, trainer = one_environment(tmp_path, "w", max_off_policy=1, batch_rollouts=8)
    for step in range(1, 5):  # each step: 4 trained, 4 dropped as stale (and production drops do not count)
        trainer.send(topics.drops, RolloutsDropped(rollout_ids=[f"s{step}-{i}" for i in range(4)], reason="stale",
                                                   stage="trainer"), key="g")
        trainer.send(topics.drops, RolloutsDropped(rollout_ids=["f"] * 40, reason="stale", stage="trainer",
                                                   production=True), key="g")
        trainer.send(topics.train, TrainStepCompleted(step=step, policy_version=step,
                                                      rollout_ids=[f"t{step}-{i}" for i in range(4)]), key="policy")
        trainer.flush()
        dispatcher.step()
    # the smoothed share: 10%, 18%, 24%, 29%: above the target from the second step on, 8 -> 4 -> 2 -> 1
    assert dispatcher.allowance.narrowed == 3 and dispatcher.allowance.value == 1
    dispatcher.close()
    log.close()
