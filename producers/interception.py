"""The interception layer between a harness and the inference fleet: every call is recorded in
tokens, with the sampler's logprobs and the weight version that sampled each token.

    harness ── complete(text) / chat(messages) ──▶ Interceptor ──▶ vLLM /inference/v1/generate
                                                       │            (token ids in, token ids out)
                                                       └─ calls: [InferenceCall …] ─▶ assemble()

Text is turned into token ids once, by the server's own tokenizer (`/tokenize`), and what the
model sampled comes back as token ids; the text a harness sees is decoded from those ids. The
sampling settings of the task are enforced on every call; a harness cannot change them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind

from rollwire.consumers.vllm_control import VllmControl
from rollwire.core import telemetry
from rollwire.producers.tool_calls import ToolCallFormat
from rollwire.schemas.rollout import InferenceCall, SamplingParams, WeightVersionSpan

if TYPE_CHECKING:
    from rollwire.producers.routing import RolloutRoute


class InferenceGate:
    """How an env worker's rollouts reach the fleet: at most `limit` generation requests in flight,
    and, with `window_s` > 0, requests sent together in waves.

    A request that finds no wave open opens one and waits up to `window_s` for others to join; the
    wave leaves at its deadline, as soon as it is as large as the free capacity, or when no other
    request can join it (`rollouts()`, the rollouts in flight in the worker, are all in the wave or
    at the server). A small model on a CPU costs the engine about as much per step for one sequence
    as for dozens, so requests that trickle in (slow, long-tailed environments) cost it several
    times the CPU of the same requests arriving together; a window of a few hundred milliseconds
    buys that back, and the last rule keeps a synchronous batch from waiting out the window."""

    def __init__(self, limit: int, window_s: float = 0.0, *, rollouts: Callable[[], int] | None = None) -> None:
        self.limit, self.window_s, self._rollouts = limit, window_s, rollouts
        self._cond = threading.Condition()
        self._in_flight = 0
        self._wave: list[int] | None = None  # [members] of the open wave; a new list per wave
        self._deadline = 0.0

    def __enter__(self) -> None:
        with self._cond:
            if self.window_s > 0:
                self._join_wave()
            while self._in_flight >= self.limit:
                self._cond.wait()
            self._in_flight += 1

    def _join_wave(self) -> None:
        if self._wave is None:
            self._wave, self._deadline = [], time.monotonic() + self.window_s
        wave = self._wave
        wave.append(1)
        while self._wave is wave:
            remaining = self._deadline - time.monotonic()
            full = len(wave) >= max(1, self.limit - self._in_flight)
            nobody_else = self._rollouts is not None and len(wave) + self._in_flight >= self._rollouts()
            if remaining <= 0 or full or nobody_else:
                self._wave = None
                self._cond.notify_all()
                break
            self._cond.wait(remaining)

    def notify(self) -> None:
        """Tells waiting requests that a rollout ended: the wave may be all that is left."""
        with self._cond:
            self._cond.notify_all()

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()


class RolloutTooLong(RuntimeError):
    """A call's prompt alone fills the rollout's token budget (`max_sequence_tokens`)."""


class Interceptor:
    """Records one rollout's calls; give each rollout its own."""

    def __init__(self, control: VllmControl | RolloutRoute, sampling: SamplingParams, *, model: str | None = None,
                 gate: InferenceGate | None = None, max_sequence_tokens: int | None = None,
                 tool_call_format: ToolCallFormat | None = None,
                 on_first_request: Callable[[], None] | None = None) -> None:
        self.control, self.sampling, self.model = control, sampling, model
        self.on_first_request = on_first_request
        """Called once, as the first generation request goes out: the rollout starts sampling
        (the env worker reports it to the dispatcher's budget)."""
        self._tool_call_format = tool_call_format
        self.gate = gate or contextlib.nullcontext()
        """Held around each generation request: the worker's limit on requests in flight to the fleet."""
        self.max_sequence_tokens = max_sequence_tokens
        """Most tokens a call's prompt and completion may hold together (each sequence the rollout
        trains on): `max_tokens` is cut to fit, and a prompt that fills it is refused."""
        self.too_long: str | None = None
        """Why a call was refused for length: the rollout is then errored (`too_long`), even when
        the harness caught the error and went on."""
        self.calls: list[InferenceCall] = []
        self.finish_reason: str | None = None
        self.events: list[tuple[str, dict | int]] = []
        """The rollout as it happened, for its trace: `("message", {"role", "content"})` for each chat
        message the model was shown for the first time and each reply, `("call", i)` for `calls[i]`."""
        self.grading: dict | None = None
        """What a grading command in the rollout's sandbox reported (`ContainerSettings.grade_command`):
        `returncode`, `stdout`, `stderr`, `timed_out`; rewards see it as `RolloutView.sandbox`."""
        self.conversation: list[dict] = []
        """The last chat call's messages and the reply to it: what rewards see as `RolloutView.messages`."""
        self._shown: list[dict] = []
        self._lock = threading.Lock()

    @property
    def usage(self) -> dict[str, int]:
        """The last call's token counts, as an OpenAI response reports them."""
        last = self.calls[-1]
        prompt, completion = len(last.prompt_token_ids), len(last.completion_token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def complete(self, prompt: str) -> str:
        """Samples a continuation of `prompt` (raw text, special tokens allowed) and returns its text."""
        return self.complete_ids(self.control.tokenize(prompt))

    def chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """Samples the assistant's next message: the server renders the chat template (with `tools`,
        OpenAI function schemas, where the template renders them) into token ids, generation stops at
        the end-of-turn token (kept in the record), the text comes back."""
        rendered = (self.control.render_chat(messages, model=self.model or "policy", tools=tools) if tools
                    else self.control.render_chat(messages, model=self.model or "policy"))
        given, messages = list(messages), [{"role": m.get("role"), "content": m.get("content") or ""} for m in messages]
        with self._lock:  # messages not shown before (all of them when the history was edited)
            shown = self._shown
            new = messages[len(shown):] if messages[: len(shown)] == shown else messages
            self.events += [("message", m) for m in new]
        text = self.complete_ids(rendered, stop_token_ids=self._end_of_turn())
        reply = {"role": "assistant", "content": text}
        with self._lock:
            self.events.append(("message", reply))
            self._shown = messages + [reply]
            self.conversation = given + [reply]
        return text

    @property
    def tool_call_format(self) -> ToolCallFormat:
        """The format the policy writes tool calls in: as set, else as the served chat template writes
        them (`VllmControl.tool_call_format`), else Hermes's."""
        if self._tool_call_format is None:
            self._tool_call_format = self.control.tool_call_format(self.model or "policy") or "hermes"
        return self._tool_call_format

    def _end_of_turn(self) -> list[int]:
        """Where a chat reply ends: the served template's end-of-turn token (`VllmControl.end_of_turn_ids`)."""
        return self.control.end_of_turn_ids(self.model or "policy")

    def complete_ids(self, prompt_ids: list[int], *, stop_token_ids: list[int] | None = None) -> str:
        """Samples a continuation of `prompt_ids`; records the call; returns the decoded text."""
        max_tokens = self.sampling.max_tokens
        if self.max_sequence_tokens is not None:
            room = self.max_sequence_tokens - len(prompt_ids)
            if room <= 0:
                self.too_long = (f"a prompt of {len(prompt_ids)} tokens leaves no room under the rollout's "
                                 f"limit of {self.max_sequence_tokens} tokens (env_workers.max_rollout_tokens)")
                raise RolloutTooLong(self.too_long)
            max_tokens = min(max_tokens, room)
        started = time.perf_counter()
        with telemetry.tracer().start_as_current_span("inference generate", kind=SpanKind.CLIENT) as span:
            with self.gate:
                with self._lock:  # an agent's calls may run on several threads
                    first, self.on_first_request = self.on_first_request, None
                if first is not None:
                    first()
                answer = self.control.generate(prompt_ids, max_tokens=max_tokens,
                                               temperature=self.sampling.temperature, model=self.model,
                                               stop_token_ids=stop_token_ids)
            choice = answer["choices"][0]
            versions = [s["version"] for s in choice.get("weight_versions") or []]
            span.set_attributes({"gen_ai.request.model": self.model or "policy",
                                 "gen_ai.request.temperature": self.sampling.temperature,
                                 "gen_ai.usage.input_tokens": len(prompt_ids),
                                 "gen_ai.usage.output_tokens": len(choice["token_ids"]),
                                 "rollwire.weight_versions": ",".join(map(str, versions))})
        call = recorded_call(prompt_ids, choice, time.perf_counter() - started)
        with self._lock:
            self.calls.append(call)
            self.events.append(("call", len(self.calls) - 1))
            self.finish_reason = call.finish_reason
        completion = shown_ids(choice, stop_token_ids)
        if not completion:
            return ""
        return self.control.detokenize(completion)


def recorded_call(prompt_ids: list[int], choice: dict, latency_s: float) -> InferenceCall:
    """The record of one generation: a `/inference/v1/generate` choice (or the chunks of a stream,
    joined into one) with the prompt ids it was given."""
    return InferenceCall(
        prompt_token_ids=list(prompt_ids), completion_token_ids=list(choice["token_ids"]),
        completion_logprobs=[c["logprob"] for c in choice["logprobs"]["content"]],
        weight_versions=[WeightVersionSpan(version=version_number(s["version"]), start=s["start"], end=s["end"])
                         for s in choice.get("weight_versions") or []],
        finish_reason=choice.get("finish_reason"), latency_s=latency_s)


def shown_ids(choice: dict, stop_token_ids: list[int] | None) -> list[int]:
    """The sampled ids a caller sees: all of them, less the end-of-sequence or end-of-turn token
    generation stopped on (trained, never shown)."""
    completion = list(choice["token_ids"])
    if choice.get("finish_reason") == "stop" and (choice.get("stop_reason") is None
                                                 or choice.get("stop_reason") in (stop_token_ids or [])):
        return completion[:-1]
    return completion


def version_number(label: str) -> int:
    """The integer version of a server label; the base model (`default`) is version 0."""
    return int(label) if label.isdigit() else 0
