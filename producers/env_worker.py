"""The env worker: tasks in, scored-by-environment rollouts out, with exact token provenance.

    reads:  <prefix>.tasks     (consumer group `<prefix>-env-worker`: more workers, more throughput)
    writes: <prefix>.rollouts, <prefix>.traces, <prefix>.deadletter,
            <prefix>.sampling (SamplingStarted: a rollout's first generation request, for the dispatcher's budget)

It streams. Up to `concurrency` rollouts are in flight at all times, each on its own thread; the
moment one finishes it is judged by the taskset's reward functions and published (one
`RolloutCompleted` and one `TraceRecorded`, keyed by group id), and its slot takes the next
rollout. Tasks are taken from the log only while a slot is free (backpressure), so a slow rollout
never holds up another group and the scorer sees rollouts in completion order.

    tasks ──poll while a slot is free──▶ [ slot × concurrency ] ──each as it ends──▶ rollouts, traces
                                            │ environment (harness, tools, latency): no limit but the slot
                                            └ generation requests: at most `inference_concurrency`

Waiting on an environment holds a rollout slot, never an inference slot: generation requests to
the fleet have their own limit (`inference_concurrency`), taken only around each call.

Read positions. A task's offset is committed only once all of its rollouts are published and
flushed: per partition, the position committed is the offset of the oldest task not yet fully
published. A `kill -9` therefore loses nothing; the tasks after that point run again and their
rollouts, whose ids are derived from group id and sample index, are recognised downstream as
duplicates.

A harness that raises, hangs past `rollout_timeout_s`, or an inference error makes that rollout
errored (published with the reason, never trained); the worker goes on. A task naming an unknown
environment is dead-lettered. On `close` the worker takes no new task, lets in-flight rollouts
finish for up to `drain_s`, and publishes the rest errored (`abandoned`) with that reason, so
every rollout of every task it took is accounted for.

Harnesses (`rollwire.producers.harnesses`): completion, multi-turn chat with tools, and unmodified
agent scripts behind an OpenAI-compatible endpoint. The taskset's harness runs in the configured
runtime (`rollwire.producers.runtimes`: in process, or in a subprocess that reaches the model
through the rollout's interception URL); a harness passed to the worker runs in process.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode
from pydantic import BaseModel, ConfigDict, Field

from rollwire.consumers.vllm_control import VllmControl, VllmError
from rollwire.core import metrics, telemetry, trace_blobs
from rollwire.core.bus import CommitFailedError, DeadLetters, Delivery, EventConsumer, EventLog, EventProducer
from rollwire.core.objectstore import ObjectStore
from rollwire.producers.assembly import assemble
from rollwire.producers.environment import EnvironmentSetup, RolloutRunner, Runners
from rollwire.producers.harnesses import Harness, HarnessTimeout, ResourceLimit
from rollwire.producers.interception import InferenceGate, Interceptor
from rollwire.producers.routing import Router
from rollwire.producers.sandbox import ContainerSettings
from rollwire.producers.tasksets import RolloutView, Taskset
from rollwire.schemas.base import now_ms
from rollwire.schemas.errors import EventTooLargeError
from rollwire.schemas.rollout import (
    ErrorKind,
    RolloutCompleted,
    RolloutError,
    RolloutTimings,
    SamplingStarted,
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

    group_id: str | None = None
    """Consumer group shared by all env workers of a run; None: the run's, `<prefix>-env-worker`
    (`Topics.group`), so a worker started by hand beside a run shares its tasks."""
    concurrency: int = Field(default=16, ge=1)
    """Rollouts in flight at once in this worker (environment slots). A slot waiting on a slow
    environment costs a sleeping thread, so this can be far above what the fleet serves at once."""
    inference_concurrency: int = Field(default=32, ge=1)
    """Generation requests this worker sends the fleet at once, whatever its rollouts are doing."""
    inference_window_s: float = Field(default=0.0, ge=0, le=1)
    """Up to this long, a generation request waits for others to go to the fleet with it as one
    batch (`InferenceGate`); 0 sends each at once. Worth tens of milliseconds when the inference
    server is CPU-bound and environments are slow: spread-out requests cost it far more per token."""
    max_rollout_tokens: int = Field(default=32768, ge=2)
    """Most tokens one sequence of a rollout may hold (a call's prompt with its completion): each
    call's `max_tokens` is cut to fit, and a call whose prompt alone fills it is refused; the rollout
    is then published errored (`too_long`) and the scorer drops it, counted. Keeps what the trainer
    must hold in memory per sample bounded whatever an agent does."""
    rollout_timeout_s: float = Field(default=120.0, gt=0)
    """A rollout still running after this long is published errored (`timeout`)."""
    runtime: Literal["in-process", "subprocess", "container"] = "in-process"
    """Where each rollout's harness or agent runs: in this process, a subprocess, or a container
    (one per rollout, no network but its model URL: `rollwire.producers.sandbox`)."""
    container: ContainerSettings = Field(default_factory=ContainerSettings)
    """The image, agent program and limits of the `container` runtime."""
    tool_call_format: Literal["auto", "hermes", "llama3_json", "mistral"] = "auto"
    """The format the policy writes tool calls in (`rollwire.producers.tool_calls`), which harnesses
    and the rollout's URL read them in: `auto` reads it from the served chat template (the format it
    writes a call in), Hermes's where the template writes none."""
    simulated_latency: SimulatedLatency | None = None
    """Add a random delay to every rollout (benchmarks); None in real runs."""
    drain_s: float = Field(default=5.0, ge=0)
    """On stop, how long in-flight rollouts may still finish; the rest are published `abandoned`."""
    name: str = "env-worker"
    """Producer name in event envelopes."""


@dataclass(eq=False)
class _Task:
    """A task taken from the log whose rollouts are not all published yet."""

    delivery: Delivery
    taskset: Taskset
    parent: Context
    """Trace context of the task's send span: each rollout span is its child."""
    unpublished: int


@dataclass(eq=False)
class _Slot:
    """One rollout in flight."""

    task: _Task
    index: int
    deadline: float
    published: bool = False
    """Set, under the worker's lock, by whichever publishes it first: its thread, the timeout
    watchdog, or `close`."""
    sampling_reported: bool = False
    """Its `SamplingStarted` was sent (under the worker's lock)."""


def rollout_id(group_id: str, index: int) -> str:
    """A rollout's id: the same for a task run twice (a redelivery after a crash), so consumers
    drop the second run as a duplicate."""
    return f"{group_id}-{index}"


def task_text(taskset: Taskset, row: dict) -> str | None:
    """What the row asks, as text (`Taskset.task_text`, user code: None when it fails)."""
    try:
        return taskset.task_text(row)
    except Exception:
        logger.warning("taskset %s: task_text failed on row %s", taskset.name, row.get("task_id"), exc_info=True)
        return None


def trace_nodes(interceptor: Interceptor, branches: list[int]) -> list[TraceNode]:
    """The rollout's message graph: messages as the model first saw them, each inference call, each
    reply, in order, one chain; a call's branch (from assembly) also marks the messages that led to it."""
    nodes: list[dict] = []
    pending: list[dict] = []  # messages waiting for the branch of the call they lead to
    for _, item in interceptor.events:  # ("call", its index) or ("message", the message)
        node = {"node_id": len(nodes), "parent_id": len(nodes) - 1 if nodes else None,
                "branch": nodes[-1]["branch"] if nodes else 0}
        if isinstance(item, int):  # kind "call": the index of the call
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
    def __init__(self, log: EventLog, topics: Topics, control: VllmControl | Router, tasksets: dict[str, Taskset],
                 settings: EnvWorkerSettings | None = None, *, harness: Harness | None = None,
                 model: str | None = None, store: ObjectStore | None = None,
                 setups: Mapping[str, EnvironmentSetup] | None = None) -> None:
        self.settings = settings or EnvWorkerSettings()
        self.setups = dict(setups or {})
        """Per environment, the harness and runtime its recipe entry chose (`rollwire.producers.environment`)."""
        for name, setup in self.setups.items():
            if name in tasksets:
                setup.check(type(tasksets[name]), name)
        self.store = store
        """Where traces too large for one event go (`rollwire.core.trace_blobs`); None sends them without their graph."""
        self.topics, self.tasksets, self.harness, self.model = topics, tasksets, harness, model
        self.router = control if isinstance(control, Router) else Router.single(control)
        """Where each rollout's model calls go (one replica, or the fleet by version); its owner closes it."""
        self.producer = EventProducer(log.producer(), topics, name=self.settings.name)
        group = self.settings.group_id or topics.group("env-worker")
        self.consumer = EventConsumer(log.consumer([topics.tasks], group), DeadLetters(self.producer, self.settings.name),
                                      group=group)
        self.runners = Runners(runtime=self.settings.runtime, container=self.settings.container,
                               timeout_s=self.settings.rollout_timeout_s)
        """Each environment's runtime, made when it first needs one (`_runner`)."""
        self.runners.runtime_for(self.settings.runtime)  # the worker's own: refused now if it cannot run here
        self._runners: dict[str, RolloutRunner] = {}
        self._grace: dict[str, float] = {}
        """Per environment, how long past the time limit its runtime may take to end a rollout itself."""
        self.inference_gate = InferenceGate(self.settings.inference_concurrency, self.settings.inference_window_s,
                                            rollouts=lambda: len(self._slots))
        latency = self.settings.simulated_latency
        self._delay = latency.sampler() if latency else None
        self._rollouts = metrics.rollouts_counter()
        self._lock = threading.Lock()  # guards the fields below and serialises sends
        self._slots: set[_Slot] = set()
        self._open: dict[tuple[str, int], dict[int, _Task]] = {}  # partition -> offset -> task
        self._published = 0
        self.published_total = 0
        """Rollouts this worker has published (errored ones included)."""
        self._committed: dict[tuple[str, int], int] = {}
        self._freed = threading.Event()
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Rollouts started and not yet published."""
        return len(self._slots)

    def step(self, timeout_s: float = 1.0) -> int:
        """Takes tasks while slots are free (waiting up to `timeout_s` for one, or, when every slot
        is busy, for a slot to free), times out overdue rollouts, commits what is fully published.
        Returns the rollouts published since the previous call (they are sent as they finish)."""
        wait = max(0.0, min(timeout_s, self._next_deadline() - time.monotonic()))
        if self.in_flight < self.settings.concurrency:
            self._take_tasks(wait)
        else:
            self._freed.wait(wait)  # backpressure: nothing is read from the log while all slots are busy
        self._freed.clear()
        self._expire_overdue()
        self._commit_published()
        with self._lock:
            published, self._published = self._published, 0
        return published

    def run(self, stop: threading.Event | None = None, *, idle_exit_s: float | None = None) -> int:
        """Steps until `stop` is set, or until nothing was in flight or published for `idle_exit_s`;
        returns the rollouts published."""
        total, idle_since = 0, time.monotonic()
        while stop is None or not stop.is_set():
            count = self.step(timeout_s=0.5)
            total += count
            if count or self.in_flight:
                idle_since = time.monotonic()
            elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                break
        return total

    # -- taking tasks -----------------------------------------------------------------------------

    def _take_tasks(self, wait_s: float) -> None:
        """Polls one task at a time while a slot is free: waits `wait_s` for the first, none after."""
        while self.in_flight < self.settings.concurrency:
            deliveries = self.consumer.poll_batch(1, wait_s)
            wait_s = 0.0
            if not deliveries:
                return
            self._start(deliveries[0])

    def _start(self, delivery: Delivery) -> None:
        task: TaskAssigned = delivery.event
        taskset = self.tasksets.get(task.environment)
        if taskset is None:
            self.consumer.dead_letter(delivery, f"no environment {task.environment!r} in this worker "
                                                f"(it runs {', '.join(sorted(self.tasksets))})")
            return
        with self.consumer.process_span(delivery):
            parent = telemetry.context_from_headers(delivery.record.headers)
        record = delivery.record
        job = _Task(delivery, taskset, parent, unpublished=task.group_size)
        self._runner(task.environment, taskset)  # made here, in order, not by the rollout threads at once
        deadline = time.monotonic() + self.settings.rollout_timeout_s + self._grace[task.environment]
        with self._lock:
            self._open.setdefault((record.topic, record.partition), {})[record.offset] = job
            slots = [_Slot(job, i, deadline) for i in range(task.group_size)]
            self._slots.update(slots)
        for slot in slots:
            threading.Thread(target=self._run_slot, args=(slot,), name=f"rollout-{task.group_id}-{slot.index}",
                             daemon=True).start()

    # -- one rollout ------------------------------------------------------------------------------

    def _run_slot(self, slot: _Slot) -> None:
        try:
            rollout, trace = self._traced_rollout(slot.task.parent, slot.task.delivery.event, slot.task.taskset,
                                                  slot.index, on_first_request=lambda: self._report_sampling(slot))
        except Exception as exc:  # a bug of ours, not the harness's: still account for the rollout
            logger.exception("rollout %d of group %s failed in the worker", slot.index, slot.task.delivery.event.group_id)
            rollout, trace = self._errored(slot.task.delivery.event, slot.index, "harness_crash",
                                           f"{type(exc).__name__}: {exc}")
        self._publish(slot, rollout, trace)

    def _publish(self, slot: _Slot, rollout: RolloutCompleted, trace: TraceRecorded) -> None:
        """Sends the rollout and its trace unless the slot was published already (timed out or
        abandoned meanwhile). Under the lock, so a commit sees a task complete only after its sends."""
        with self._lock:
            if slot.published:
                return
            slot.published = True
            key = rollout.group_id
            if not slot.sampling_reported:  # it never sampled: reported with its result, before it
                self._send_sampling(slot, sampled=False)
            with telemetry.continued(rollout.traceparent):  # sends are children of the rollout span
                self.producer.send(self.topics.rollouts, rollout, key=key)
                self._send_trace(trace, key)
            slot.task.unpublished -= 1
            self._slots.discard(slot)
            self._published += 1
            self.published_total += 1
        self._rollouts.add(1, {"rollwire.environment": rollout.environment,
                               "outcome": "errored" if rollout.error is not None else "completed"})
        self._freed.set()
        self.inference_gate.notify()

    def _report_sampling(self, slot: _Slot) -> None:
        """The rollout's first generation request is going out: from now on it counts against the
        dispatcher's off-policy budget."""
        with self._lock:
            if not slot.sampling_reported and not slot.published:
                self._send_sampling(slot, sampled=True)

    def _send_sampling(self, slot: _Slot, *, sampled: bool) -> None:
        """Under the worker's lock."""
        slot.sampling_reported = True
        task = slot.task.delivery.event
        self.producer.send(self.topics.sampling, SamplingStarted(group_id=task.group_id, sample_index=slot.index,
                                                                 worker=self.settings.name, sampled=sampled),
                           key=task.group_id)

    def _send_trace(self, trace: TraceRecorded, key: str) -> None:
        try:
            self.producer.send(self.topics.traces, trace, key=key)
            return
        except EventTooLargeError as exc:
            too_large = exc
        if self.store is not None:
            self.producer.send(self.topics.traces, trace_blobs.offload(trace, self.store, prefix=self.topics.prefix),
                               key=key)
            return
        logger.warning("the trace of %s was sent without its graph: %s. Give the env worker an object store "
                       "(the run's [store], or --store on `rollwire env-worker`) to keep such traces",
                       trace.rollout_id, too_large)
        self.producer.send(self.topics.traces, trace.model_copy(update={"nodes": []}), key=key)

    def _traced_rollout(self, parent: Context, task: TaskAssigned, taskset: Taskset, index: int, *,
                        on_first_request: Callable[[], None] | None = None) -> tuple[RolloutCompleted, TraceRecorded]:
        attributes: dict[str, str | int] = {"rollwire.group_id": task.group_id, "rollwire.environment": task.environment,
                      "rollwire.sample_index": index}
        with telemetry.tracer().start_as_current_span("rollout", context=parent, attributes=attributes) as span:
            rollout, trace = self._rollout(task, taskset, index, on_first_request=on_first_request)
            span.set_attribute("rollwire.rollout_id", rollout.rollout_id)
            if rollout.error is not None:
                span.set_status(Status(StatusCode.ERROR, f"{rollout.error.kind}: {rollout.error.message}"))
            return rollout.model_copy(update={"traceparent": telemetry.current_traceparent()}), trace

    def _rollout(self, task: TaskAssigned, taskset: Taskset, index: int, *,
                 on_first_request: Callable[[], None] | None = None) -> tuple[RolloutCompleted, TraceRecorded]:
        interceptor = Interceptor(self.router.route(), task.sampling, model=self.model, gate=self.inference_gate,
                                  max_sequence_tokens=self.settings.max_rollout_tokens,
                                  tool_call_format=None if self.settings.tool_call_format == "auto"
                                  else self.settings.tool_call_format, on_first_request=on_first_request)
        started = time.perf_counter()
        if self._delay is not None:
            with self._lock:
                delay = self._delay()
            time.sleep(delay)
        try:
            answer = self._runner(task.environment, taskset)(task.task, interceptor, self.settings.rollout_timeout_s)
        except Exception as exc:  # harness code is user code: report it on the rollout
            kind: ErrorKind = ("too_long" if interceptor.too_long else "inference" if isinstance(exc, VllmError) else
                    "timeout" if isinstance(exc, HarnessTimeout) else
                    "resource_limit" if isinstance(exc, ResourceLimit) else "harness_crash")
            return self._errored(task, index, kind, f"{type(exc).__name__}: {exc}")
        if interceptor.too_long:  # the harness caught the refusal and went on: still over the limit
            return self._errored(task, index, "too_long", interceptor.too_long)
        ran = time.perf_counter() - started
        record = assemble(interceptor.calls)
        all_lines = self.setups.get(task.environment, EnvironmentSetup()).trains_branches
        judged_at = time.perf_counter()
        judgement = taskset.judge(RolloutView(task=task.task, completion=answer, messages=interceptor.conversation,
                                              sandbox=interceptor.grading,
                                              completion_tokens=sum(record.loss_mask),
                                              finish_reason=interceptor.finish_reason))
        inference = sum(c.latency_s for c in interceptor.calls)
        rollout = RolloutCompleted(
            rollout_id=rollout_id(task.group_id, index),
            group_id=task.group_id, task_id=task.task_id, environment=task.environment, algorithm=task.algorithm,
            group_size=task.group_size, sample_index=index, prompt_token_ids=record.prompt_token_ids,
            completion_token_ids=record.completion_token_ids, completion_logprobs=record.completion_logprobs,
            loss_mask=record.loss_mask, weight_versions=record.weight_versions, rewards=judgement.rewards,
            reward=judgement.reward, metrics={**judgement.metrics, **record.metrics(branches_trained=all_lines)},
            error=judgement.error, question=task_text(taskset, task.task), answer=answer,
            branches=record.branch_sequences() if all_lines else [],
            timings=RolloutTimings(queued_s=max(0.0, (now_ms() - task.issued_at_ms) / 1000 - ran),
                                   inference_s=inference, environment_s=max(0.0, ran - inference),
                                   scoring_s=time.perf_counter() - judged_at))
        return rollout, TraceRecorded(rollout_id=rollout.rollout_id, group_id=task.group_id, completion=answer,
                                      finish_reason=interceptor.finish_reason,
                                      nodes=trace_nodes(interceptor, record.branches))

    @staticmethod
    def _errored(task: TaskAssigned, index: int, kind: ErrorKind, message: str) -> tuple[RolloutCompleted, TraceRecorded]:
        rollout = RolloutCompleted(rollout_id=rollout_id(task.group_id, index), group_id=task.group_id,
                                   task_id=task.task_id, environment=task.environment, algorithm=task.algorithm,
                                   group_size=task.group_size, sample_index=index,
                                   error=RolloutError(kind=kind, message=message))
        logger.warning("rollout %d of group %s errored: %s", index, task.group_id, message)
        return rollout, TraceRecorded(rollout_id=rollout.rollout_id, group_id=task.group_id)

    # -- deadlines, commits, stop -----------------------------------------------------------------

    def _next_deadline(self) -> float:
        with self._lock:
            return min((slot.deadline for slot in self._slots), default=math.inf)

    def _expire_overdue(self) -> None:
        """Publishes rollouts past `rollout_timeout_s` as errored; an in-process harness still
        running keeps its thread until it returns, and its late result is discarded."""
        now = time.monotonic()
        with self._lock:
            overdue = [slot for slot in self._slots if slot.deadline <= now]
        for slot in overdue:
            message = f"the harness ran past rollout_timeout_s = {self.settings.rollout_timeout_s:g}"
            self._publish(slot, *self._errored(slot.task.delivery.event, slot.index, "timeout", message))

    def _commit_published(self) -> None:
        """Commits, per partition, up to the oldest task with an unpublished rollout (or everything
        read, when none is open), after flushing what was sent for the tasks before it."""
        assigned = set(self.consumer.assignment())
        with self._lock:
            offsets = self.consumer.read_offsets()
            for tp, tasks in list(self._open.items()):
                for offset in [o for o, job in tasks.items() if job.unpublished == 0]:
                    del tasks[offset]
                if tasks:
                    offsets[tp] = min(tasks)
                else:
                    del self._open[tp]
        offsets = {tp: o for tp, o in offsets.items() if tp in assigned and self._committed.get(tp) != o}
        if not offsets:
            return
        self.producer.flush()  # every send made for the completed tasks is durable before their commit
        try:
            self.consumer.commit_offsets(offsets)
        except CommitFailedError as exc:  # the group moved a partition: its new owner runs those tasks again
            logger.warning("commit refused, tasks will be redelivered to another worker: %s", exc)
            return
        self._committed.update(offsets)

    def _runner(self, environment: str, taskset: Taskset) -> RolloutRunner:
        """How a rollout of `environment` runs: the worker's own harness if it was given one (an agent
        program for every rollout), else the environment's setup over the worker's defaults."""
        if environment not in self._runners:
            if self.harness is not None:
                fixed = self.harness
                self._runners[environment] = lambda row, interceptor, timeout_s: fixed(row, interceptor)
                self._grace[environment] = 0.0
            else:
                self._runners[environment], self._grace[environment] = self.runners.runner(
                    taskset, self.setups.get(environment))
        return self._runners[environment]

    def close(self, drain_s: float | None = None) -> None:
        """Stops taking tasks, lets in-flight rollouts finish for `drain_s` (default: the setting),
        publishes the rest errored (`abandoned`), commits, and releases everything."""
        if self._closed:
            return
        self._closed = True
        drain_s = self.settings.drain_s if drain_s is None else drain_s
        try:
            deadline = time.monotonic() + drain_s
            while self.in_flight and time.monotonic() < deadline:
                self._freed.wait(min(0.1, max(0.0, deadline - time.monotonic())))
                self._freed.clear()
                self._expire_overdue()
            with self._lock:
                left = list(self._slots)
            if left:
                logger.warning("stopping with %d rollouts in flight: published as abandoned", len(left))
            for slot in left:
                self._publish(slot, *self._errored(slot.task.delivery.event, slot.index, "abandoned",
                                                   f"the env worker {self.settings.name} stopped before the rollout "
                                                   f"finished (in-flight rollouts get drain_s = {drain_s:g} s)"))
            self._commit_published()
        finally:
            self.runners.close()
            self.consumer.close()
            self.producer.close()
