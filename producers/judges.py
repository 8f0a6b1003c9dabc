"""A reward that asks a model: an LLM judge.

    from rollwire.producers.judges import JudgeSettings, LlmJudge

    class Essays(Taskset):
        def __init__(self, *, judge: dict) -> None:
            self.grader = LlmJudge(JudgeSettings(**judge))     # options from the recipe, checked here
        @reward("judged")
        def judged(self, r: RolloutView) -> float:
            return self.grader.score(question=r.task["question"], answer=r.completion)

    [[environments]]
    name = "essays"
    options = { judge = { base_url = "http://127.0.0.1:8001/v1", model = "judge", rubric = "..." } }

The rubric is a prompt with `{question}`, `{answer}` (and any other field given to `score`); the
judge's reply must hold `Score: N` (or what `score_pattern` matches) with N from 0 to `scale`, and
the reward is N / scale. A judgement that fails (the endpoint errs or times out, or no score can be
read from the reply, after `retries` more tries) raises `JudgeError` with every try's reason: the
rollout is published errored (kind `reward`), never scored 0 in silence. Each rollout's judging
runs in its own rollout thread, so judge calls of different rollouts run at once and never hold
the loop; each call is a span (`judge call`) in the rollout's trace. (Name the attribute anything
but `judge`: that is `Taskset.judge`, which runs the rewards; `load_taskset` refuses it.)
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwire.core.endpoints import OpenAIEndpoint, replies
from rollwire.core.errors import RollwireError

DEFAULT_RUBRIC = """You grade answers. Question:
{question}

Answer:
{answer}

Is the answer correct and complete? Reply with one line: Score: N, where N is 0 (wrong) to 10 (perfect)."""


class JudgeError(RollwireError):
    """No score could be had from the judge; the message says why for every try."""


class JudgeSettings(BaseModel):
    """Where the judge is and how it is asked."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    base_url: str
    """Any OpenAI-compatible endpoint, ending in /v1 (a vLLM server, an API)."""
    model: str
    """The model name the endpoint serves."""
    rubric: str = DEFAULT_RUBRIC
    """The prompt, with `{answer}` and the fields `score` is given (e.g. `{question}`)."""
    api_key: str = "EMPTY"
    """Sent as the bearer token."""
    chat: bool = True
    """Ask through /chat/completions (the rubric as the user's message), else /completions."""
    scale: float = Field(default=10.0, gt=0)
    """The highest score the rubric allows; the reward is the score over this."""
    score_pattern: str = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
    """A regular expression whose first group is the score (the first match in the reply counts)."""
    max_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)
    """Per call."""
    retries: int = Field(default=2, ge=0)
    """More tries after a failed one (an endpoint error, a timeout, a reply without a score)."""

    @field_validator("score_pattern")
    @classmethod
    def _one_group(cls, pattern: str) -> str:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        if compiled.groups < 1:
            raise ValueError("needs a group around the number, e.g. 'Score: (\\d+)'")
        return pattern


class LlmJudge:
    """Scores answers by asking a model (thread-safe: one per taskset serves every rollout thread)."""

    def __init__(self, settings: JudgeSettings) -> None:
        self.settings = settings
        self._pattern = re.compile(settings.score_pattern)
        self._endpoint = OpenAIEndpoint(settings.base_url, settings.model, api_key=settings.api_key,
                                        timeout_s=settings.timeout_s)

    def score(self, **fields: object) -> float:
        """The judge's score for the answer in `fields`, over `scale` (0 to 1); `JudgeError` otherwise."""
        try:
            prompt = self.settings.rubric.format(**fields)
        except KeyError as exc:
            raise JudgeError(f"the rubric names {exc} but the reward gave only {', '.join(fields)}") from None
        reasons: list[str] = []
        for attempt, reply, span in replies(lambda: self._ask(prompt), retries=self.settings.retries, span="judge call",
                                            prefix="rollwire.judge", attributes={"rollwire.judge.model": self.settings.model},
                                            reasons=reasons):
            found = self._pattern.search(reply)
            if found is None:
                reasons.append(f"try {attempt + 1}: no score in the reply {reply[:200]!r}")
                continue
            value = float(found.group(1))
            if not 0 <= value <= self.settings.scale:
                reasons.append(f"try {attempt + 1}: score {value:g} is outside 0..{self.settings.scale:g}")
                continue
            span.set_attribute("rollwire.judge.score", value)
            return value / self.settings.scale
        raise JudgeError(f"the judge {self.settings.model} at {self.settings.base_url} gave no score: "
                         + "; ".join(reasons))

    def _ask(self, prompt: str) -> str:
        s = self.settings
        params = {"max_tokens": s.max_tokens, "temperature": s.temperature}
        if s.chat:
            return self._endpoint.chat([{"role": "user", "content": prompt}], **params)
        return self._endpoint.complete(prompt, **params)
