"""A hanging agent, an unreachable fleet and a malformed task row each become an errored rollout
with its reason; the worker goes on. (No inference server is needed: none is reached.)"""

from __future__ import annotations

import sys

from rollwire.consumers.vllm_control import VllmControl
from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.producers.env_worker import EnvWorker
from rollwire.producers.harnesses import script_harness
from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.routing import Router
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
    # nothing listens there: each call waits `wait_s` for the replica to come back, then errors
    worker = EnvWorker(log, topics, Router.single(VllmControl("http://127.0.0.1:9", timeout_s=2), wait_s=0.5),
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


def _one_task(path, prefix: str, *, group_size: int):
    """A log holding one reverse-digits task (`abcd`), and its topics."""
    topics = Topics(prefix)
    log = open_log(EmbeddedBusSettings(path=path))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="dispatcher")
    producer.send(topics.tasks, TaskAssigned(task_id="t0", environment="reverse-digits", algorithm="grpo",
                                             group_size=group_size, task={"prompt": "abcd", "answer": "dcba"},
                                             policy_version=0), key="g0")
    producer.close()
    return log, topics


class _Fleet:
    """Answers like vLLM's /inference/v1/generate, sampling exactly the `max_tokens` it is allowed;
    text is one token per character."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def tokenize(self, text: str) -> list[int]:
        return [7] * len(text)

    def detokenize(self, ids: list[int]) -> str:
        return "x" * len(ids)

    def generate(self, prompt_ids, *, max_tokens, **_):
        self.asked.append(max_tokens)
        return {"choices": [{"token_ids": [5] * max_tokens, "finish_reason": "length",
                             "logprobs": {"content": [{"logprob": -0.1}] * max_tokens}}]}


def test_a_call_is_cut_to_the_rollouts_token_limit_and_refused_past_it():
    from rollwire.producers.interception import Interceptor, RolloutTooLong
    from rollwire.schemas import SamplingParams
    fleet = _Fleet()
    interceptor = Interceptor(fleet, SamplingParams(max_tokens=8), max_sequence_tokens=10)
    assert interceptor.complete("abcd") == "x" * 6  # 4 prompt tokens leave room for 6, not 8
    try:
        interceptor.complete("a" * 10)
    except RolloutTooLong as exc:
        assert "a prompt of 10 tokens leaves no room under the rollout's limit of 10 tokens" in str(exc)
    else:
        raise AssertionError("a prompt filling the limit was sent")
    assert fleet.asked == [6]  # the refused call never reached the fleet


def test_a_rollout_past_its_token_limit_is_errored_even_when_the_harness_swallows_the_refusal(tmp_path):
    from rollwire.producers.env_worker import EnvWorkerSettings

    def stubborn(row, interceptor):
        answer = interceptor.complete(row["prompt"])
        try:
            interceptor.complete(row["prompt"] + answer)  # the conversation outgrows the limit
        except RuntimeError:
            pass  # and the agent carries on as if nothing happened
        return answer

    log, topics = _one_task(tmp_path / "log", "long", group_size=2)
    worker = EnvWorker(log, topics, _Fleet(), {"reverse-digits": load_taskset("reverse-digits", count=1)},
                       EnvWorkerSettings(max_rollout_tokens=10), harness=stubborn)
    assert sum(worker.step(timeout_s=0.5) for _ in range(4)) == 2
    worker.close()
    with log.reader([topics.rollouts]) as reader:
        rollouts = [Codec().decode(r.value).event for r in reader.poll_batch(100, 0.5)]
    assert [r.error.kind for r in rollouts] == ["too_long", "too_long"]
    assert "limit of 10 tokens (env_workers.max_rollout_tokens)" in rollouts[0].error.message


def test_a_rollout_keeps_its_other_lines_where_its_environment_says_branches_all(tmp_path):
    """A harness whose second call does not extend the first (as a template that rewrites history):
    with `branches = "all"` the rollout carries that call as a line of its own; by default it is
    left out, and the rollout's metrics say how many tokens were."""
    from rollwire.producers.environment import EnvironmentSetup

    def rewriting(row, interceptor):
        first = interceptor.complete(row["prompt"])
        return interceptor.complete("rewritten " + first)

    found = {}
    for keep in ("main", "all"):
        log, topics = _one_task(tmp_path / keep, f"branches-{keep}", group_size=1)
        worker = EnvWorker(log, topics, _Fleet(), {"reverse-digits": load_taskset("reverse-digits", count=1)},
                           harness=rewriting, setups={"reverse-digits": EnvironmentSetup(branches=keep)})
        assert sum(worker.step(timeout_s=0.5) for _ in range(4)) == 1
        worker.close()
        with log.reader([topics.rollouts]) as reader:
            [found[keep]] = [Codec().decode(r.value).event for r in reader.poll_batch(100, 0.5)]
    main, every = found["main"], found["all"]
    n = len(main.completion_token_ids)  # the stand-in samples as many tokens as allowed, each call alike
    assert main.branches == [] and main.metrics["rollwire.untrained_tokens"] == float(n)  # the second call's
    [line] = every.branches
    assert len(line.completion_token_ids) == n and line.prompt_token_ids == [7] * (len("rewritten ") + n)
    assert every.metrics["rollwire.branched_calls"] == 1.0 and every.metrics["rollwire.untrained_tokens"] == 0.0
    assert every.completion_token_ids == main.completion_token_ids  # the main line either way
