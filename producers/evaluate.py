"""`rollwire eval`: an environment as an evaluation, against any OpenAI-compatible endpoint.

Each row runs as a training rollout runs (`rollwire.producers.environment.Runners`, what env
workers run rollouts through): the environment's harness (a completion, a chat with the taskset's
tools, a conversation with a simulated user, and their options) or its agent program, in its
runtime (in process, a subprocess, a container graded inside), then the taskset's judge; only the
model's calls go to the endpoint instead of the rollout's interceptor. With a seed, each call asks
the endpoint for a seed of its own (from the seed, the row, the sample and the call), so the same
command gives the same numbers where the endpoint honours seeds (vLLM does). No logprobs or token
ids are asked for, so API models that return none work too: this path scores text, it never
produces training data.

An A/B compares published weight versions (a run's, and a `replay train` counterfactual's) on
the same rows: `evaluate_versions` loads each into one vLLM server in turn and evaluates it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollwire.consumers.vllm_control import VllmControl
from rollwire.core.bus import EventLog, HeldDeadLetters, TopicError, read_to_end
from rollwire.core.endpoints import EndpointError, OpenAIEndpoint
from rollwire.core.errors import ConfigError
from rollwire.core.objectstore import ObjectStore
from rollwire.core.weight_versions import fetch
from rollwire.producers.environment import EnvironmentSetup, Runners
from rollwire.producers.tasksets import RolloutView, Taskset
from rollwire.producers.tool_calls import ToolCallFormat
from rollwire.schemas.topics import Topics
from rollwire.schemas.weights import WeightsPublished


@dataclass(frozen=True)
class EvalResult:
    task_id: str
    sample: int
    completion: str
    finish_reason: str | None
    rewards: dict[str, float]
    reward: float
    metrics: dict[str, float]
    error: str | None


class EvalClient:
    """What a harness holds in an evaluation instead of a rollout's `Interceptor`: the same two
    calls, `complete(prompt)` and `chat(messages, tools)`, against an OpenAI-compatible endpoint
    with the evaluation's sampling. It counts the tokens the model generated (when the endpoint
    reports usage) and keeps the last call's finish reason, as the Interceptor does."""

    def __init__(self, endpoint: OpenAIEndpoint, *, temperature: float, max_tokens: int,
                 seed: int | None = None, tool_call_format: ToolCallFormat = "hermes") -> None:
        self.endpoint, self.params = endpoint, {"temperature": temperature, "max_tokens": max_tokens}
        self.tool_call_format = tool_call_format
        """The format the model writes tool calls in, which the harness reads them in."""
        self.seed = seed
        """The first call's seed; each later call of the rollout asks for the next one."""
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.usage: dict[str, int] = {}
        self.conversation: list[dict] = []
        self.grading: dict | None = None
        """What the rollout's grading command reported, set by the container runtime (`RolloutView.sandbox`)."""
        self._calls = 0

    def complete(self, prompt: str) -> str:
        choice = self._choice(self.endpoint.post("/completions", {"prompt": prompt, **self._params()}))
        return choice["text"]

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        body: dict[str, Any] = {"messages": messages, **self._params()}
        if tools:
            body["tools"] = tools
        text = self._choice(self.endpoint.post("/chat/completions", body))["message"]["content"] or ""
        self.conversation = [*messages, {"role": "assistant", "content": text}]
        return text

    def _params(self) -> dict[str, Any]:
        self._calls += 1
        return self.params if self.seed is None else {**self.params, "seed": (self.seed + self._calls - 1) % 2**31}

    def _choice(self, reply: dict) -> dict:
        self.usage = {k: int(v) for k, v in (reply.get("usage") or {}).items() if isinstance(v, int)}
        self.completion_tokens += self.usage.get("completion_tokens", 0)
        choice = reply["choices"][0]
        self.finish_reason = choice.get("finish_reason")
        return choice


def evaluate(taskset: Taskset, endpoint: OpenAIEndpoint, *, limit: int, samples: int = 1, temperature: float = 0.0,
             max_tokens: int = 256, concurrency: int = 4, on_result=None, setup: EnvironmentSetup | None = None,
             seed: int | None = None, timeout_s: float = 600.0,
             tool_call_format: ToolCallFormat = "hermes") -> list[EvalResult]:
    """Scores `samples` answers for each of the first `limit` rows, each one a rollout as training
    runs it (`Runners`): the environment's harness or agent program as `setup` says (else the
    taskset's harness, in this process), every call to `endpoint`, then the taskset's judge (which
    sees what a grading command in the rollout's container found). An endpoint error, or a harness
    or agent that fails, is recorded on its result. `seed` makes sampled answers repeat; the harness
    reads the model's tool calls in `tool_call_format` (`rollwire.producers.tool_calls`)."""
    runners = Runners(timeout_s=timeout_s)
    try:
        runner, _ = runners.runner(taskset, setup)
        rows = list(itertools.islice(taskset.rows(), limit))

        def one(row: dict, sample: int) -> EvalResult:
            client = EvalClient(endpoint, temperature=temperature, max_tokens=max_tokens,
                                seed=None if seed is None else call_seed(seed, row["task_id"], sample),
                                tool_call_format=tool_call_format)
            try:
                text = runner(row, client, timeout_s)  # the client stands in for the rollout's Interceptor
            except Exception as exc:  # the endpoint refused, or the harness (user code) failed: this result's error
                error = str(exc) if isinstance(exc, EndpointError) else f"{type(exc).__name__}: {exc}"
                return EvalResult(row["task_id"], sample, "", None, {}, 0.0, {}, error)
            judged = taskset.judge(RolloutView(task=row, completion=text, messages=client.conversation,
                                               finish_reason=client.finish_reason,
                                               completion_tokens=client.completion_tokens, sandbox=client.grading))
            return EvalResult(row["task_id"], sample, text, client.finish_reason, judged.rewards, judged.reward,
                              judged.metrics, judged.error.message if judged.error else None)

        results = []
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            futures = [pool.submit(one, row, s) for row in rows for s in range(samples)]
            for future in concurrent.futures.as_completed(futures):
                results.append(future.result())
                if on_result is not None:
                    on_result(results[-1])
    finally:
        runners.close()
    return sorted(results, key=lambda r: (r.task_id, r.sample))


def call_seed(seed: int, task_id: str, sample: int) -> int:
    """The first sampling seed of one answer: from the evaluation's seed, its row and its sample
    (stable across processes and Python versions, unlike `hash`)."""
    digest = hashlib.blake2b(f"{seed}/{task_id}/{sample}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % 2**31


def summary(results: list[EvalResult]) -> dict[str, float]:
    """Mean of every reward and metric over the scored results, plus the error rate."""
    scored = [r for r in results if r.error is None]
    names = sorted({k for r in scored for k in (*r.rewards, *r.metrics)})
    out = {"reward": statistics.fmean(r.reward for r in scored) if scored else 0.0}
    for name in names:
        values = [r.rewards.get(name, r.metrics.get(name)) for r in scored]
        out[name] = statistics.fmean(v for v in values if v is not None)
    out["error_rate"] = 1 - len(scored) / len(results) if results else 0.0
    return out


@dataclass(frozen=True)
class Contender:
    """One row of an A/B evaluation: a published weight version, under a label."""

    label: str
    weights: WeightsPublished


def published_version(log: EventLog, topics: Sequence[Topics], policy: str, version: int) -> WeightsPublished:
    """The `WeightsPublished` event of `policy` version `version`, looked up on each of `topics`'
    weights topic (a run's own, or a `replay train` shadow's); `ConfigError` lists what exists."""
    found: dict[tuple[str, int], WeightsPublished] = {}
    for t in topics:
        try:
            deliveries = list(read_to_end(log, [t.weights], HeldDeadLetters("eval")))
        except TopicError:
            continue
        for d in deliveries:
            if isinstance(d.event, WeightsPublished):
                found.setdefault((d.event.policy, d.event.version), d.event)
    if (policy, version) not in found:
        versions = sorted(v for p, v in found if p == policy)
        known = (f"{policy} has versions {versions[0]}..{versions[-1]}" if versions
                 else f"known policies: {', '.join(sorted({p for p, _ in found})) or 'none'}")
        raise ConfigError(f"no weights of {policy}@{version} were published under "
                          f"{', '.join(repr(t.prefix) for t in topics)}: {known}")
    return found[(policy, version)]


def evaluate_versions(taskset: Taskset, contenders: Sequence[Contender], *, store: ObjectStore,
                      control: VllmControl, base_url: str, served_model: str, work_dir: Path,
                      **kwargs: Any) -> list[tuple[str, list[EvalResult]]]:
    """Each contender's weights fetched (verified), loaded into one running vLLM server (a full
    version hot-swapped in, an adapter loaded beside the base), then `evaluate`d: the same rows,
    sampling and judge for every row of the comparison. `kwargs` go to `evaluate`."""
    rows = []
    for index, contender in enumerate(contenders):
        folder = work_dir / f"contender-{index}"
        fetch(store, contender.weights.uri, contender.weights.manifest_sha256, folder)
        if contender.weights.format == "full":
            control.swap_full_weights(str(folder.resolve()), contender.label)
            model = served_model
        else:
            model = "eval-" + re.sub(r"[^A-Za-z0-9_.-]", "-", contender.label)
            control.load_lora(model, str(folder.resolve()))
        rows.append((contender.label, evaluate(taskset, OpenAIEndpoint(base_url, model), **kwargs)))
    return rows
