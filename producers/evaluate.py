"""`rollwire eval`: an environment as an evaluation, against any OpenAI-compatible endpoint.

Each row runs as a training rollout runs: the environment's harness (a completion, a chat with
the taskset's tools, `max_turns` and the other harness options) and the taskset's judge; only
the model's calls go to the endpoint instead of the rollout's interceptor. No logprobs or token
ids are asked for, so API models that return none work too: this path scores text, it never
produces training data.

An A/B compares published weight versions (a run's, and a `replay train` counterfactual's) on
the same rows: `evaluate_versions` loads each into one vLLM server in turn and evaluates it.
"""

from __future__ import annotations

import concurrent.futures
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
from rollwire.producers.environment import EnvironmentSetup
from rollwire.producers.runtimes import resolve_harness
from rollwire.producers.tasksets import RolloutView, Taskset
from rollwire.producers.tools import offered_tools
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

    def __init__(self, endpoint: OpenAIEndpoint, *, temperature: float, max_tokens: int) -> None:
        self.endpoint, self.params = endpoint, {"temperature": temperature, "max_tokens": max_tokens}
        self.finish_reason: str | None = None
        self.completion_tokens = 0
        self.conversation: list[dict] = []

    def complete(self, prompt: str) -> str:
        choice = self._choice(self.endpoint.post("/completions", {"prompt": prompt, **self.params}))
        return choice["text"]

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        body: dict[str, Any] = {"messages": messages, **self.params}
        if tools:
            body["tools"] = tools
        text = self._choice(self.endpoint.post("/chat/completions", body))["message"]["content"] or ""
        self.conversation = [*messages, {"role": "assistant", "content": text}]
        return text

    def _choice(self, reply: dict) -> dict:
        self.completion_tokens += int((reply.get("usage") or {}).get("completion_tokens") or 0)
        choice = reply["choices"][0]
        self.finish_reason = choice.get("finish_reason")
        return choice


def evaluate(taskset: Taskset, endpoint: OpenAIEndpoint, *, limit: int, samples: int = 1, temperature: float = 0.0,
             max_tokens: int = 256, concurrency: int = 4, on_result=None,
             setup: EnvironmentSetup | None = None) -> list[EvalResult]:
    """Scores `samples` answers for each of the first `limit` rows, each one a rollout as training
    runs it, in this process: the environment's harness (`setup`'s, else the taskset's) with its
    options and the taskset's tools, every call to `endpoint`, then the taskset's judge. An
    endpoint error or a harness that raises is recorded on its result."""
    setup = setup or EnvironmentSetup()
    harness = resolve_harness(setup.harness or taskset.harness)
    offered, options = type(taskset).tools, setup.options_for(type(taskset))
    rows = list(itertools.islice(taskset.rows(), limit))

    def one(row: dict, sample: int) -> EvalResult:
        client = EvalClient(endpoint, temperature=temperature, max_tokens=max_tokens)
        try:
            task = {**row, "tools": offered_tools(row, offered)} if offered else row
            text = harness(task, client, **options)  # type: ignore[arg-type]  # the Interceptor's calls
        except Exception as exc:  # the endpoint refused, or the harness (user code) failed: this result's error
            error = str(exc) if isinstance(exc, EndpointError) else f"{type(exc).__name__}: {exc}"
            return EvalResult(row["task_id"], sample, "", None, {}, 0.0, {}, error)
        judged = taskset.judge(RolloutView(task=row, completion=text, messages=client.conversation,
                                           finish_reason=client.finish_reason,
                                           completion_tokens=client.completion_tokens))
        return EvalResult(row["task_id"], sample, text, client.finish_reason, judged.rewards, judged.reward,
                          judged.metrics, judged.error.message if judged.error else None)

    results = []
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(one, row, s) for row in rows for s in range(samples)]
        for future in concurrent.futures.as_completed(futures):
            results.append(future.result())
            if on_result is not None:
                on_result(results[-1])
    return sorted(results, key=lambda r: (r.task_id, r.sample))


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
