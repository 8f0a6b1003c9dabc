"""Kill an env worker mid-stream, then start another, or let the one already sharing its consumer
group take over: every rollout of every task is published, each rollout id stands for one (group,
sample) however often its task ran, and the group's read position ends at the end of the tasks topic.

The workers are `rollwire env-worker` processes running an agent program that sleeps a different
time per task (no inference server is reached), against the real broker and the embedded log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from rollwire.core.bus import Beginning, EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.schemas import Codec, TaskAssigned, Topics

TASKS, GROUP_SIZE = 24, 2
AGENT = ("import json, os, time; task = json.loads(os.environ['ROLLWIRE_TASK']); "
         "time.sleep(task['delay']); print(task['answer'])")


def start_worker(bus_settings, prefix: str, log_path, *extra: str) -> subprocess.Popen:
    if bus_settings.type == "kafka":
        bus = ["--bus", "kafka", "--bootstrap", bus_settings.bootstrap_servers]
    else:
        bus = ["--bus", "embedded", "--log-dir", str(bus_settings.path)]
    agent = f"{sys.executable} -c \"{AGENT}\""
    return subprocess.Popen([sys.executable, "-m", "rollwire.cli", "env-worker", "--env", "reverse-digits",
                             "--base-url", "http://127.0.0.1:9", "--agent-command", agent, "--concurrency", "6",
                             *bus, "--prefix", prefix, *extra],
                            stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)


def rollouts(log, topics: Topics) -> list:
    out = []
    with log.reader([topics.rollouts], Beginning()) as reader:
        while batch := reader.poll_batch(1000, 1.0):
            out += [Codec().decode(r.value).event for r in batch]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("takeover", ["restarted", "survivor"])
@pytest.mark.parametrize("backend", [pytest.param("kafka", marks=pytest.mark.kafka), "embedded"])
def test_a_killed_env_worker_loses_no_task_and_its_redeliveries_keep_their_ids(backend, takeover, request, tmp_path):
    bus_settings = (request.getfixturevalue("bus_settings_kafka") if backend == "kafka"
                    else EmbeddedBusSettings(path=tmp_path / "log"))
    topics, log = Topics(f"t{uuid.uuid4().hex[:10]}"), open_log(bus_settings)
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="dispatcher")
    for i in range(TASKS):
        row = {"task_id": f"t{i}", "prompt": "r:12>", "answer": "21", "delay": 0.5 + (i % 5) * 0.5}
        producer.send(topics.tasks, TaskAssigned(task_id=row["task_id"], group_id=f"g{i}", environment="reverse-digits",
                                                 algorithm="grpo", group_size=GROUP_SIZE, task=row, policy_version=0),
                      key=f"g{i}")
    producer.close()
    worker_log = tmp_path / "worker.log"

    first = start_worker(bus_settings, topics.prefix, worker_log)
    # "survivor": a second worker shares the group from the start and takes the killed one's partitions
    # (after its session times out); "restarted": a new worker starts once the first is dead
    other = start_worker(bus_settings, topics.prefix, worker_log) if takeover == "survivor" else None
    try:
        deadline = time.monotonic() + 120
        while sum(log.end_offsets(topics.rollouts).values()) < 12:
            assert time.monotonic() < deadline and first.poll() is None, worker_log.read_text()[-3000:]
            time.sleep(0.3)
    finally:
        os.kill(first.pid, signal.SIGKILL)  # mid-stream: rollouts in flight, tasks taken but not committed
        first.wait()
    before = len(rollouts(log, topics))
    assert before < TASKS * GROUP_SIZE, "the worker was killed after it had finished everything"

    expected = {f"g{i}-{k}" for i in range(TASKS) for k in range(GROUP_SIZE)}
    second = other or start_worker(bus_settings, topics.prefix, worker_log)  # after a rebalance, on Kafka
    try:
        deadline = time.monotonic() + 180
        while {r.rollout_id for r in rollouts(log, topics)} != expected:
            assert time.monotonic() < deadline and second.poll() is None, worker_log.read_text()[-3000:]
            time.sleep(1.0)
        second.send_signal(signal.SIGTERM)  # a clean stop commits what it published
        assert second.wait(timeout=60) == 0, worker_log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            second.kill()

    seen = rollouts(log, topics)
    assert {r.rollout_id for r in seen} == expected, "a task's rollouts were lost"
    assert all(r.error is None and r.rollout_id == f"{r.group_id}-{r.sample_index}" for r in seen)
    runs = Counter(r.rollout_id for r in seen)
    # Only tasks the killed worker had taken but not committed run twice: at most its slots' worth
    # plus tasks finished after its last commit.
    assert sum(n - 1 for n in runs.values()) <= before
    ends = log.end_offsets(topics.tasks)
    assert log.committed(topics.group("env-worker"), topics.tasks) == {p: o for p, o in ends.items() if o > 0}
    log.close()
