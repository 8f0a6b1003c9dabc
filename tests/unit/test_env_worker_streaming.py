"""The env worker streams: slots refill as soon as a rollout ends, each rollout is published the
moment it finishes, read positions stop at the oldest task still running, and waiting on an
environment holds no inference slot. (No inference server: the harnesses here sleep, and the
one that samples talks to an in-memory stand-in for vLLM's routes.)"""

from __future__ import annotations

import threading
import time

from builders import big_trace

from rollwire.core import trace_blobs
from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.core.objectstore import LocalStore
from rollwire.producers.env_worker import EnvWorker, EnvWorkerSettings
from rollwire.producers.tasksets import load_taskset
from rollwire.schemas import Codec, TaskAssigned, Topics


class Harness:
    """Sleeps `row["delay"]` seconds; records when each task started and ended and how many ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.running = self.most_running = 0

    def __call__(self, row: dict, interceptor) -> str:
        with self.lock:
            self.started.setdefault(row["task_id"], time.monotonic())
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        time.sleep(row["delay"])
        with self.lock:
            self.running -= 1
            self.ended[row["task_id"]] = time.monotonic()
        return "21"


def setup(tmp_path, delays: dict[str, float], *, group_size: int = 1):
    """An embedded log holding one task per entry of `delays`, all on one partition, in that order."""
    topics = Topics("stream")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="dispatcher")
    for task_id, delay in delays.items():
        producer.send(topics.tasks, TaskAssigned(task_id=task_id, group_id=task_id, environment="reverse-digits",
                                                 algorithm="grpo", group_size=group_size, policy_version=0,
                                                 task={"task_id": task_id, "prompt": "r:12>", "answer": "21",
                                                       "delay": delay}), key="one-partition")
    producer.close()
    return log, topics


def worker_for(log, topics, harness, control=None, **settings) -> EnvWorker:
    return EnvWorker(log, topics, control, {"reverse-digits": load_taskset("reverse-digits", count=1)},
                     EnvWorkerSettings(**settings), harness=harness)


def published(log, topics) -> list[tuple[int, object]]:
    """(record timestamp, rollout) of every published rollout."""
    out = []
    with log.reader([topics.rollouts]) as reader:
        while batch := reader.poll_batch(1000, 0.5):
            out += [(r.timestamp_ms, Codec().decode(r.value).event) for r in batch]
    return out


def committed(log, topics) -> int:
    return sum(log.committed(topics.group("env-worker"), topics.tasks).values())


def step_until(worker: EnvWorker, done, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        worker.step(timeout_s=0.05)


def test_new_tasks_start_while_a_slow_rollout_runs_and_rollouts_publish_in_completion_order(tmp_path):
    delays = {"slow": 2.0, **{f"fast{i}": 0.1 for i in range(6)}}
    log, topics = setup(tmp_path, delays)
    harness = Harness()
    worker = worker_for(log, topics, harness, concurrency=2)
    try:
        step_until(worker, lambda: len(harness.ended) == 6)  # every fast task, while the slow one still runs
        assert "slow" not in harness.ended
        # The slow task sits at offset 0 of the partition: nothing past it is committed yet.
        worker.step(timeout_s=0.05)
        assert committed(log, topics) == 0
        step_until(worker, lambda: worker.published_total == 7)
        worker.step(timeout_s=0.05)
        assert committed(log, topics) == 7
    finally:
        worker.close()

    assert harness.most_running == 2, "one slot stayed busy with the slow rollout, the other took task after task"
    assert all(harness.started[f"fast{i}"] < harness.ended["slow"] for i in range(6))
    rollouts = published(log, topics)
    assert len(rollouts) == 7 and all(r.error is None for _, r in rollouts)
    by_task = {r.task_id: ts for ts, r in rollouts}
    assert max(by_task, key=by_task.get) == "slow"  # completion order, not the order the tasks came in
    assert all(by_task[f"fast{i}"] < by_task["slow"] - 1000 for i in range(6))


def test_a_group_s_rollouts_publish_one_by_one_as_each_finishes(tmp_path):
    log, topics = setup(tmp_path, {"g": 0.0}, group_size=3)
    delays = iter([0.1, 1.0, 2.0])
    lock = threading.Lock()

    def harness(row, interceptor):
        with lock:
            delay = next(delays)
        time.sleep(delay)
        return "21"

    worker = worker_for(log, topics, harness, concurrency=3)
    try:
        step_until(worker, lambda: worker.published_total == 1)
        first = time.monotonic()
        step_until(worker, lambda: worker.published_total == 3)
    finally:
        worker.close()
    stamps = sorted(ts for ts, _ in published(log, topics))
    assert len(stamps) == 3 and stamps[2] - stamps[0] > 1500  # each when it ended, not all at the end
    assert time.monotonic() - first > 1.5
    assert sorted(r.rollout_id for _, r in published(log, topics)) == ["g-0", "g-1", "g-2"]


class FakeFleet:
    """vLLM's token-in/token-out routes in memory: each generation takes `seconds`; counts calls at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.lock = seconds, threading.Lock()
        self.running = self.most_running = 0

    def generate(self, token_ids, **kwargs) -> dict:
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        return {"choices": [{"token_ids": [5, 6], "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.7}]},
                             "weight_versions": [{"version": "0", "start": 0, "end": 2}], "finish_reason": "length"}]}

    def detokenize(self, token_ids) -> str:
        return "21"


def test_waiting_on_the_environment_holds_no_inference_slot(tmp_path):
    log, topics = setup(tmp_path, {f"t{i}": 0.5 for i in range(8)})
    harness = Harness()
    fleet = FakeFleet(seconds=0.2)

    def env_then_model(row, interceptor):
        harness(row, interceptor)  # the environment: 0.5 s
        return interceptor.complete_ids([1, 2, 3])

    worker = worker_for(log, topics, env_then_model, fleet, concurrency=8, inference_concurrency=2)
    try:
        step_until(worker, lambda: worker.published_total == 8)
    finally:
        worker.close()
    assert harness.most_running == 8, "all eight rollouts waited on their environment at once"
    assert fleet.most_running == 2, "but never more than two generation requests were in flight"
    assert all(r.completion_token_ids == [5, 6] and r.error is None for _, r in published(log, topics))


def test_each_rollout_reports_its_first_generation_request_once_or_with_its_result(tmp_path):
    """The dispatcher's budget counts a rollout from its first generation request: the worker sends
    `SamplingStarted` as it goes out (after the environment's wait, before the result), once however
    many calls follow, and with the result for a rollout that never called the model."""
    log, topics = setup(tmp_path, {"samples": 0.3, "model-free": 0.1})
    fleet = FakeFleet(seconds=0.3)
    called_at: dict[str, float] = {}

    def env_then_model(row, interceptor):
        time.sleep(row["delay"])  # the environment
        if row["task_id"] == "model-free":
            return "21"
        called_at[row["task_id"]] = time.time()
        interceptor.complete_ids([1, 2, 3])
        return interceptor.complete_ids([1, 2, 3, 4])

    worker = worker_for(log, topics, env_then_model, fleet, concurrency=2)
    try:
        step_until(worker, lambda: worker.published_total == 2)
    finally:
        worker.close()
    with log.reader([topics.sampling]) as reader:
        records = reader.poll_batch(100, 0.5)
    started = {Codec().decode(r.value).event.group_id: (r.timestamp_ms, Codec().decode(r.value).event) for r in records}
    assert len(records) == 2 and started["samples"][1].sampled and not started["model-free"][1].sampled
    rollouts = {r.task_id: at for at, r in published(log, topics)}
    at = started["samples"][0] / 1000
    assert called_at["samples"] - 0.05 <= at < called_at["samples"] + 0.2, "sent as the first request went out"
    assert started["samples"][0] < rollouts["samples"] and started["model-free"][0] <= rollouts["model-free"]


def test_a_rollout_past_its_timeout_is_published_errored_at_the_deadline(tmp_path):
    log, topics = setup(tmp_path, {"hangs": 3.0})
    worker = worker_for(log, topics, Harness(), concurrency=1, rollout_timeout_s=0.5)
    started = time.monotonic()
    try:
        step_until(worker, lambda: worker.published_total == 1)
        took = time.monotonic() - started
        time.sleep(3.0)  # the harness thread returns now; its late result must not be published
        worker.step(timeout_s=0.1)
    finally:
        worker.close()
    [(_, rollout)] = published(log, topics)
    assert rollout.error.kind == "timeout" and took < 2.0
    assert committed(log, topics) == 1


def test_stopping_drains_then_publishes_what_is_left_as_abandoned(tmp_path):
    log, topics = setup(tmp_path, {"quick": 0.2, "endless": 30.0})
    worker = worker_for(log, topics, Harness(), concurrency=2)
    step_until(worker, lambda: worker.in_flight == 2)
    worker.close(drain_s=1.0)
    rollouts = {r.task_id: r for _, r in published(log, topics)}
    assert rollouts["quick"].error is None  # finished within the drain
    assert rollouts["endless"].error.kind == "abandoned" and "stopped" in rollouts["endless"].error.message
    assert committed(log, topics) == 2  # every task taken is accounted for: nothing is redelivered


def test_the_inference_gate_sends_requests_in_waves_within_its_window():
    from rollwire.producers.interception import InferenceGate
    gate = InferenceGate(limit=10, window_s=0.3)
    entered: dict[int, float] = {}

    def request(i: int) -> None:
        with gate:
            entered[i] = time.monotonic()
            time.sleep(0.05)

    started = time.monotonic()
    threads = [threading.Thread(target=request, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.02)  # they trickle in
    for t in threads:
        t.join()
    assert max(entered.values()) - min(entered.values()) < 0.05, "the four left as one wave"
    assert 0.25 < min(entered.values()) - started < 1.0, "after the window, not before"

    full = InferenceGate(limit=3, window_s=5.0)  # a wave as large as the free capacity leaves at once
    entered.clear()
    gate = full
    started = time.monotonic()
    threads = [threading.Thread(target=request, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(entered.values()) - started < 1.0


def test_a_wave_leaves_at_once_when_no_other_rollout_could_join_it():
    from rollwire.producers.interception import InferenceGate
    gate = InferenceGate(limit=64, window_s=5.0, rollouts=lambda: 3)  # three rollouts in flight in the worker
    entered: list[float] = []

    def request() -> None:
        with gate:
            entered.append(time.monotonic())

    started = time.monotonic()
    threads = [threading.Thread(target=request) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(entered) == 3 and max(entered) - started < 1.0  # not the 5 s window


def test_the_env_worker_offloads_only_traces_over_the_event_limit(tmp_path):
    log, topics = setup(tmp_path, {})
    store = LocalStore(tmp_path / "store")
    worker = worker_for(log, topics, Harness())
    worker.store = store
    worker.producer.codec = Codec(max_event_bytes=16 * 1024)
    worker._send_trace(big_trace("g-0"), "g")
    worker._send_trace(big_trace("g-1", tokens=10), "g")
    worker.producer.flush()
    with log.reader([topics.traces]) as reader:
        sent = {e.rollout_id: e for e in (Codec().decode(r.value).event for r in reader.poll_batch(10, 2.0))}
    assert sent["g-0"].blob is not None and sent["g-1"].blob is None and len(sent["g-1"].nodes) == 2
    assert trace_blobs.nodes_of(sent["g-0"], store) == big_trace("g-0").nodes
    worker.close(drain_s=0)
    log.close()
