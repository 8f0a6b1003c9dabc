"""`rollwire eval`: an environment as an evaluation, against any OpenAI-compatible endpoint.

Rows with a `prompt` (raw text) go to `/v1/completions`; rows with `messages` go to
`/v1/chat/completions`. No logprobs or token ids are asked for, so API models that return none
work too: this path scores text, it never produces training data.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import statistics
from dataclasses import dataclass
from typing import Any

from rollwire.errors import RollwireError
from rollwire.http import HttpError, JsonClient
from rollwire.producers.tasksets import RolloutView, Taskset


class EndpointError(RollwireError):
    """The endpoint refused or failed a request; the message has its answer."""


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


class OpenAIEndpoint:
    """A minimal OpenAI-compatible client."""

    def __init__(self, base_url: str, model: str, *, api_key: str = "EMPTY", timeout_s: float = 120.0) -> None:
        self.base_url, self.model = base_url.rstrip("/"), model
        self._http = JsonClient(self.base_url, timeout_s=timeout_s, headers={"Authorization": f"Bearer {api_key}"})

    def _post(self, path: str, body: dict) -> dict:
        try:
            return self._http.request("POST", path, {"model": self.model, **body})
        except HttpError as exc:
            raise EndpointError(str(exc)) from exc

    def answer(self, row: dict[str, Any], *, temperature: float, max_tokens: int) -> tuple[str, str | None]:
        """The model's text for a row, and its finish reason."""
        params = {"temperature": temperature, "max_tokens": max_tokens}
        if "messages" in row:
            choice = self._post("/chat/completions", {"messages": row["messages"], **params})["choices"][0]
            return choice["message"]["content"] or "", choice.get("finish_reason")
        choice = self._post("/completions", {"prompt": row["prompt"], **params})["choices"][0]
        return choice["text"], choice.get("finish_reason")


def evaluate(taskset: Taskset, endpoint: OpenAIEndpoint, *, limit: int, samples: int = 1, temperature: float = 0.0,
             max_tokens: int = 256, concurrency: int = 4, on_result=None) -> list[EvalResult]:
    """Scores `samples` answers for each of the first `limit` rows; endpoint errors are recorded."""
    rows = list(itertools.islice(taskset.rows(), limit))

    def one(row: dict, sample: int) -> EvalResult:
        try:
            text, finish = endpoint.answer(row, temperature=temperature, max_tokens=max_tokens)
        except EndpointError as exc:
            return EvalResult(row["task_id"], sample, "", None, {}, 0.0, {}, str(exc))
        judged = taskset.judge(RolloutView(task=row, completion=text, finish_reason=finish))
        return EvalResult(row["task_id"], sample, text, finish, judged.rewards, judged.reward, judged.metrics,
                          judged.error.message if judged.error else None)

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
