"""Teacher log-probabilities for on-policy distillation, from an OpenAI-compatible vLLM server.

One prefill request per rollout: the prompt is the rollout's exact token ids (prompt followed by
completion), `max_tokens=1`, and vLLM's `prompt_logprobs=0` returns the log-probability of each
prompt token under the teacher. The completion's slice of that list is what the estimator needs.
Nothing is re-tokenized.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwire.core.errors import RollwireError
from rollwire.core.http import HttpError, JsonClient


class TeacherError(RollwireError):
    """The teacher endpoint failed or answered something unusable; the message says which."""


class TeacherSettings(BaseModel):
    """Where the teacher model is served."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    base_url: str = "http://127.0.0.1:8001/v1"
    """OpenAI-compatible base URL of a vLLM server running the teacher."""
    model: str
    """Model name the server serves the teacher under."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Seconds per request."""
    retries: int = Field(default=3, ge=0)
    """Retries after a failed request (exponential backoff from 0.5 s)."""


class TeacherClient:
    """`client(prompt_ids, completion_ids)` -> teacher logprob of each completion token."""

    def __init__(self, settings: TeacherSettings) -> None:
        self.settings = settings
        self._http = JsonClient(settings.base_url, timeout_s=settings.timeout_s)

    def __call__(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        tokens = [*prompt_ids, *completion_ids]
        body = {"model": self.settings.model, "prompt": tokens, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0}
        answer = self._post("/completions", body)
        try:
            per_position = answer["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError) as exc:
            raise TeacherError("the teacher's answer has no choices[0].prompt_logprobs: is it a vLLM "
                               "server (prompt_logprobs is a vLLM extension)?") from exc
        if not isinstance(per_position, list) or len(per_position) != len(tokens):
            raise TeacherError(f"the teacher returned {len(per_position or [])} prompt logprobs for "
                               f"{len(tokens)} tokens")
        out = []
        for position in range(len(prompt_ids), len(tokens)):
            entry = per_position[position] or {}
            logprob = entry.get(str(tokens[position]), entry.get(tokens[position]))
            if logprob is None:
                raise TeacherError(f"the teacher gave no logprob for token {tokens[position]} at position {position}")
            out.append(float(logprob["logprob"] if isinstance(logprob, dict) else logprob))
        return out

    def _post(self, path: str, body: dict) -> dict:
        delay, last = 0.5, None
        for attempt in range(self.settings.retries + 1):
            try:
                return self._http.request("POST", path, body)
            except HttpError as exc:
                if exc.status is not None and exc.status < 500:  # the request itself is wrong: retrying cannot help
                    raise TeacherError(f"teacher {self.settings.base_url} refused the request: {exc}") from exc
                last = exc
            if attempt < self.settings.retries:
                time.sleep(delay)
                delay *= 2
        raise TeacherError(f"teacher {self.settings.base_url} failed {self.settings.retries + 1} times: {last}")
