"""The env worker: tasks in, scored-by-environment rollouts out, with exact token provenance.

    reads:  <prefix>.tasks     (consumer group `env-workers`: more workers, more throughput)
    writes: <prefix>.rollouts, <prefix>.traces, <prefix>.deadletter

For each `TaskAssigned` it runs the group's rollouts concurrently (at most `concurrency` at once),
each with its own `Interceptor`, judges them with the taskset's reward functions, and publishes one
`RolloutCompleted` and one `TraceRecorded` per rollout, keyed by group id. A harness that raises,
hangs past `rollout_timeout_s`, or an inference error makes that rollout errored (published with
the reason, never trained); the worker goes on. A task naming an unknown environment is
dead-lettered. Offsets are committed after a group's events are flushed.

Harnesses (`rollwire.producers.harnesses`): completion, multi-turn chat with tools, and unmodified
agent scripts behind an OpenAI-compatible endpoint. The taskset's harness runs in the configured
runtime (`rollwire.producers.runtimes`: in process, or in a subprocess that reaches the model
through the rollout's interception URL); a harness passed to the worker runs in process.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from typing import Literal

from opentelemetry.trace import Status, StatusCode
from pydantic import BaseModel, ConfigDict, Field

from rollwire import telemetry
from rollwire.bus import DeadLetters, EventConsumer, EventLog, EventProducer
from rollwire.consumers.vllm_control import VllmControl, VllmError
from rollwire.producers.assembly import assemble
from rollwire.producers.harnesses import Harness, HarnessTimeout
from rollwire.producers.runtimes import RUNTIMES, Runtime
from rollwire.producers.interception import Interceptor
from rollwire.producers.tasksets import RolloutView, Taskset
from rollwire.schemas.base import now_ms
from rollwire.schemas.rollout import (
    RolloutCompleted,
    RolloutError,
    RolloutTimings,
    TaskAssigned,
    TraceNode,
    TraceRecorded,
)
from rollwire.schemas.topics import Topics

logger = logging.getLogger(__name__)

class SimulatedLatency(BaseModel):
    """A delay drawn for every rollout before its harness runs: rehearses slow environments (tool
    calls, sandboxes, human-paced agents) for benchmarks and capacity planning. Off by default."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    distribution: Literal["lognormal", "pareto"] = "lognormal"
    """`lognormal`: median `scale_s`, shape `sigma`; `pareto`: minimum `scale_s`, tail index `alpha`."""
    scale_s: float = Field(default=0.2, gt=0)
    """Median (lognormal) or minimum (pareto) delay in seconds."""
    sigma: float = Field(default=1.0, gt=0)
    """Lognormal shape: 1.0 puts the 99th percentile at ~10x the median."""
    alpha: float = Field(default=1.5, gt=0)
    """Pareto tail index: smaller is heavier (below 2 the variance is infinite)."""
    max_s: float = Field(default=60.0, gt=0)
    """Cap on one delay."""
    seed: int | None = None
    """Seed of the draws; None for a fresh one."""

    def sampler(self) -> Callable[[], float]:
        rng = random.Random(self.seed)
        if self.distribution == "lognormal":
            return lambda: min(self.max_s, rng.lognormvariate(math.log(self.scale_s), self.sigma))
        return lambda: min(self.max_s, self.scale_s * rng.paretovariate(self.alpha))


class EnvWorkerSettings(BaseModel):
    """Settings of one env worker."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    group_id: str = "env-workers"
    """Consumer group shared by all env workers of a run."""
    concurrency: int = Field(default=8, ge=1)
    """Rollouts in flight at once in this worker."""
    rollout_timeout_s: float = Field(default=120.0, gt=0)
    """A rollout still running after this long is published errored (`timeout`)."""
    runtime: Literal["in-process", "subprocess"] = "in-process"
    """Where the taskset's harness runs (`rollwire.producers.runtimes`)."""
    simulated_latency: SimulatedLatency | None = None
    """Add a random delay to every rollout (benchmarks); None in real runs."""
    tasks_per_poll: int = Field(default=4, ge=1)
    """Tasks taken from the log at once; their groups' rollouts share the `concurrency` slots."""
    name: str = "env-worker"
    """Producer name in event envelopes."""


def trace_nodes(interceptor: Interceptor, branches: list[int]) -> list[TraceNode]:
    """The rollout's message graph: messages as the model first saw them, each inference call, each
    reply, in order, one chain; a call's branch (from assembly) also marks the messages that led to it."""
    nodes: list[dict] = []
    pending: list[dict] = []  # messages waiting for the branch of the call they lead to
    for kind, item in interceptor.events:
        node = {"node_id": len(nodes), "parent_id": len(nodes) - 1 if nodes else None,
                "branch": nodes[-1]["branch"] if nodes else 0}
        if kind == "call":
            node.update(kind="llm_call", call=interceptor.calls[item],
                        branch=branches[item] if item < len(branches) else 0)
            for message in pending:
                message["branch"] = node["branch"]
            pending = []
        else:
            node.update(kind="tool_result" if item["role"] == "tool" else "message", role=item["role"],
                        content=item["content"])
            if item["role"] != "assistant":
                pending.append(node)
        nodes.append(node)
    return [TraceNode(**node) for node in nodes]


class EnvWorker:
    def __init__(self, log: EventLog, topics: Topics, control: VllmControl, tasksets: dict[str, Taskset],
                 settings: EnvWorkerSettings | None = None, *, harness: Harness | None = None,
                 model: str | None = None) -> None:
        self.settings = settings or EnvWorkerSettings()
        self.topics, self.control, self.tasksets, self.harness, self.model = topics, control, tasksets, harness, model
        self.producer = EventProducer(log.producer(), topics, name=self.settings.name)
        self.consumer = EventConsumer(log.consumer([topics.tasks], self.settings.group_id),
                                      DeadLetters(self.producer, self.settings.name), group=self.settings.group_id)
        self.pool = concurrent.futures.ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="rollout")
        self.runtime: Runtime = RUNTIMES[self.settings.runtime]()
        latency = self.settings.simulated_latency
        self._delay = latency.sampler() if latency else None
        self._delay_lock = threading.Lock()

    def step(self, timeout_s: float = 1.0) -> int:
        """Runs the groups of the tasks that arrive within `timeout_s`; returns rollouts published.

        The rollouts of every group polled together run at once (at most `concurrency` at a time),
        so a slow rollout in one group does not hold up the others'."""
        published = 0
        started = []
        for delivery in self.consumer.poll_batch(self.settings.tasks_per_poll, timeout_s):
            task: TaskAssigned = delivery.event
            taskset = self.tasksets.get(task.environment)
            if taskset is None:
                self.consumer.dead_letter(delivery, f"no environment {task.environment!r} in this worker "
                                                    f"(it runs {', '.join(sorted(self.tasksets))})")
                continue
            started.append((delivery, self._start_group(task, taskset, delivery.record.headers)))
        for delivery, futures in started:
            task = delivery.event
            with self.consumer.process_span(delivery):
                for rollout, trace in self._finish_group(task, futures):
                    with telemetry.continued(rollout.traceparent):  # sends are children of the rollout span
                        self.producer.send(self.topics.rollouts, rollout, key=task.group_id)
                        self.producer.send(self.topics.traces, trace, key=task.group_id)
                    published += 1
        self.producer.flush()
        self.consumer.commit()
        return published

    def run_group(self, task: TaskAssigned, taskset: Taskset) -> list[tuple[RolloutCompleted, TraceRecorded]]:
        return self._finish_group(task, self._start_group(task, taskset, ()))

    def _start_group(self, task: TaskAssigned, taskset: Taskset, headers) -> list[concurrent.futures.Future]:
        """Each rollout's span is a child of the task's send span (the context in `headers`)."""
        parent = telemetry.context_from_headers(headers)
        return [self.pool.submit(self._traced_rollout, parent, task, taskset, i) for i in range(task.group_size)]

    def _traced_rollout(self, parent, task: TaskAssigned, taskset: Taskset, index: int
                        ) -> tuple[RolloutCompleted, TraceRecorded]:
        attributes = {"rollwire.group_id": task.group_id, "rollwire.environment": task.environment,
                      "rollwire.sample_index": index}
        with telemetry.tracer().start_as_current_span("rollout", context=parent, attributes=attributes) as span:
            rollout, trace = self._rollout(task, taskset, index)
            span.set_attribute("rollwire.rollout_id", rollout.rollout_id)
            if rollout.error is not None:
                span.set_status(Status(StatusCode.ERROR, f"{rollout.error.kind}: {rollout.error.message}"))
            return rollout.model_copy(update={"traceparent": telemetry.current_traceparent()}), trace

    def _finish_group(self, task: TaskAssigned, futures: list[concurrent.futures.Future]
                      ) -> list[tuple[RolloutCompleted, TraceRecorded]]:
        deadline = time.monotonic() + self.settings.rollout_timeout_s
        results = []
        for i, future in enumerate(futures):
            try:
                results.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                results.append(self._errored(task, i, "timeout",
                                             f"the harness ran past rollout_timeout_s = {self.settings.rollout_timeout_s:g}"))
        return results

    def _rollout(self, task: TaskAssigned, taskset: Taskset, index: int) -> tuple[RolloutCompleted, TraceRecorded]:
        interceptor = Interceptor(self.control, task.sampling, model=self.model)
        started = time.perf_counter()
        if self._delay is not None:
            with self._delay_lock:
                delay = self._delay()
            time.sleep(delay)
        try:
            if self.harness is not None:
                answer = self.harness(task.task, interceptor)
            else:
                answer = self.runtime.run(taskset.harness, task.task, interceptor,
                                          timeout_s=self.settings.rollout_timeout_s)
        except Exception as exc:  # harness code is user code: report it on the rollout
            kind = ("inference" if isinstance(exc, VllmError) else
                    "timeout" if isinstance(exc, HarnessTimeout) else "harness_crash")
            return self._errored(task, index, kind, f"{type(exc).__name__}: {exc}")
        ran = time.perf_counter() - started
        record = assemble(interceptor.calls)
        judged_at = time.perf_counter()
        judgement = taskset.judge(RolloutView(task=task.task, completion=answer,
                                              completion_tokens=sum(record.loss_mask),
                                              finish_reason=interceptor.finish_reason))
        inference = sum(c.latency_s for c in interceptor.calls)
        rollout = RolloutCompleted(
            group_id=task.group_id, task_id=task.task_id, environment=task.environment, algorithm=task.algorithm,
            group_size=task.group_size, sample_index=index, prompt_token_ids=record.prompt_token_ids,
            completion_token_ids=record.completion_token_ids, completion_logprobs=record.completion_logprobs,
            loss_mask=record.loss_mask, weight_versions=record.weight_versions, rewards=judgement.rewards,
            reward=judgement.reward, metrics=judgement.metrics, error=judgement.error,
            timings=RolloutTimings(queued_s=max(0.0, (now_ms() - task.issued_at_ms) / 1000 - ran),
                                   inference_s=inference, environment_s=max(0.0, ran - inference),
                                   scoring_s=time.perf_counter() - judged_at))
        return rollout, TraceRecorded(rollout_id=rollout.rollout_id, group_id=task.group_id,
                                      nodes=trace_nodes(interceptor, record.branches))

    @staticmethod
    def _errored(task: TaskAssigned, index: int, kind: str, message: str) -> tuple[RolloutCompleted, TraceRecorded]:
        rollout = RolloutCompleted(group_id=task.group_id, task_id=task.task_id, environment=task.environment,
                                   algorithm=task.algorithm, group_size=task.group_size, sample_index=index,
                                   error=RolloutError(kind=kind, message=message))
        logger.warning("rollout %d of group %s errored: %s", index, task.group_id, message)
        return rollout, TraceRecorded(rollout_id=rollout.rollout_id, group_id=task.group_id)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.runtime.close()
        self.consumer.close()
        self.producer.close()
