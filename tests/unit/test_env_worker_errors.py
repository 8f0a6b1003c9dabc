"""A hanging agent, an unreachable fleet and a malformed task row each become an errored rollout
with its reason; the worker goes on. (No inference server is needed: none is reached.)"""

from __future__ import annotations

import sys

from rollwire.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.consumers.vllm_control import VllmControl
from rollwire.producers.env_worker import EnvWorker
from rollwire.producers.harnesses import script_harness
from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.tasksets import load_taskset
from rollwire.schemas import Codec, TaskAssigned, Topics


def run(tmp_path, task_rows, **worker_args):
    topics = Topics("errs")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="dispatcher")
    for i, row in enumerate(task_rows):
        producer.send(topics.tasks, TaskAssigned(task_id=f"t{i}", environment="reverse-digits", algorithm="grpo",
                                                 group_size=2, task=row, policy_version=0), key=f"g{i}")
    producer.close()
    worker = EnvWorker(log, topics, VllmControl("http://127.0.0.1:9", timeout_s=2),
                       {"reverse-digits": load_taskset("reverse-digits", count=1)}, **worker_args)
    published = sum(worker.step(timeout_s=0.5) for _ in range(4))
    worker.close()
    rollouts = []
    with log.reader([topics.rollouts]) as reader:
        while batch := reader.poll_batch(100, 0.5):  # one partition per fetch: read until empty
            rollouts += [Codec().decode(r.value).event for r in batch]
    return published, rollouts


def test_an_unreachable_fleet_and_a_malformed_row_are_errored_rollouts(tmp_path):
    published, rollouts = run(tmp_path, [{"prompt": "<|bos|>r:12>", "answer": "21"}, {"no": "prompt"}])
    assert published == 4
    kinds = sorted((r.task_id, r.error.kind) for r in rollouts)
    assert kinds == [("t0", "inference"), ("t0", "inference"), ("t1", "harness_crash"), ("t1", "harness_crash")]
    assert "KeyError" in next(r for r in rollouts if r.task_id == "t1").error.message


def test_a_hanging_agent_is_killed_and_reported_as_a_timeout(tmp_path):
    hang = tmp_path / "hang.py"
    hang.write_text("import time\ntime.sleep(60)\n")
    server = InterceptionServer()
    try:
        published, rollouts = run(tmp_path, [{"prompt": "x", "answer": "y"}],
                                  harness=script_harness([sys.executable, str(hang)], server, timeout_s=1))
    finally:
        server.shutdown()
    assert published == 2 and {r.error.kind for r in rollouts} == {"timeout"}
    assert all("killed" in r.error.message for r in rollouts)
