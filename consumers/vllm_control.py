"""A client for one vLLM server's generation and control routes (`VLLM_SERVER_DEV_MODE=1`).

The hot-reload sequence it offers (`swap_full_weights`), as measured on these machines:

    # Step 0  POST /collective_rpc            rollwire_stage_weights(weights_path=DIR): each worker reads
    #                                         the files into host memory on a thread while serving goes on
    #                                         (polled with rollwire_staged), so the pause only copies;
    #                                         or rollwire_receive_weights: received from the trainer's
    #                                         memory over gloo (`swap_received_weights`), no file read
    # Step 1  POST /pause?mode=keep           in-flight requests freeze, none are dropped
    # Step 2  POST /collective_rpc            rollwire_reload_weights(weights_path=DIR): vLLM's layer-wise
    #                                         in-place reload from the staged tensors, then a tied output
    #                                         layer tied again (`rollwire.consumers.vllm_worker`, loaded
    #                                         into the workers)
    # Step 3  POST /update_weight_version     the label later tokens report in `weight_versions`
    # Step 4  POST /reset_prefix_cache?reset_running_requests=true
    #                                         cached KV was computed with the old weights
    # Step 5  POST /resume                    frozen requests continue on the new weights

A reload that fails midway leaves the engine broken, so callers verify the checkpoint completely
before Step 2 (`rollwire.core.weight_versions.fetch`). The routes are unauthenticated: keep the server on
loopback (`VllmServerSettings` insists) or behind an authenticated proxy.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rollwire.consumers.vllm_worker import EXTENSION, direct_key
from rollwire.core.errors import RollwireError
from rollwire.core.http import HttpError, JsonClient
from rollwire.producers.tool_calls import ToolCallFormat, format_written


@dataclass(frozen=True)
class SwapTimes:
    """Where a swap's pause went, in seconds."""

    drain_s: float
    """Step 1: until the engine stopped scheduling (the step it was running ends first)."""
    apply_s: float
    """Step 2: the reload."""
    paused_s: float
    """Steps 1-5: from the pause request until generation resumed."""
    stage_s: float = 0.0
    """Step 0, before the pause: the workers reading the files while serving went on."""
    staged: bool = False
    """Every worker reloaded from what it had staged (False: it read the files inside the pause)."""


class VllmError(RollwireError):
    """The vLLM server refused or failed a request; the message has its answer."""

    @property
    def unreachable(self) -> bool:
        """No server answered (refused, or cut off: it went away); nothing it did was returned."""
        return isinstance(self.__cause__, HttpError) and self.__cause__.unreachable


class VllmControl:
    """Talks to the vLLM server at `base_url` (e.g. `http://127.0.0.1:8000`) over one pool of
    kept-alive connections; safe to share between threads (an env worker's rollouts do)."""

    def __init__(self, base_url: str, *, timeout_s: float = 120.0, max_connections: int = 256) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = JsonClient(self.base_url, timeout_s=timeout_s, max_connections=max_connections)
        self._tokenized = functools.lru_cache(maxsize=4096)(self._tokenize)
        self._end_of_turn: list[int] | None = None
        self._tool_call_format: tuple[ToolCallFormat | None] | None = None

    def _request(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        try:
            return self._http.request(method, path, body, timeout_s=timeout_s)
        except HttpError as exc:
            raise VllmError(str(exc)) from exc

    def close(self) -> None:
        self._http.close()

    def healthy(self) -> bool:
        try:
            self._request("GET", "/health", timeout_s=5.0)
            return True
        except VllmError:
            return False

    def pause(self, mode: str = "keep") -> None:
        """Stops scheduling: `keep` freezes in-flight requests, `wait` drains them, `abort` drops them."""
        self._request("POST", f"/pause?mode={mode}")

    def resume(self) -> None:
        self._request("POST", "/resume")

    def swap_full_weights(self, weights_dir: str, version_label: str, *, stage: bool = True) -> SwapTimes:
        """Steps 0-5 above (`stage=False` leaves Step 0 out: the reload reads the files inside the
        pause); returns where the pause went, and the staging before it."""
        staging = time.perf_counter()
        if stage:
            self._stage("rollwire_stage_weights", {"weights_path": weights_dir}, weights_dir, required=False)
        return self._swap(weights_dir, version_label, staging if stage else None)

    def swap_received_weights(self, address: str, version: int, manifest_sha256: str, version_label: str, *,
                              who: str = "", check: Callable[[str], None] | None = None) -> SwapTimes:
        """Steps 0-5 with Step 0 receiving the version from the trainer's sender at `address` (gloo,
        `rollwire.core.weight_transfer`) instead of reading files: nothing is read from the store or
        a disk. `check` gets the verified manifest (JSON) before the pause and may refuse it by
        raising. A failed or refused transfer raises `VllmError` before the pause: the engine is untouched."""
        staging = time.perf_counter()
        key = direct_key(version, manifest_sha256)
        results = self._stage("rollwire_receive_weights", {"address": address, "version": version,
                                                           "manifest_sha256": manifest_sha256, "who": who},
                              key, required=True)
        if check is not None:
            for result in results:
                check(result["manifest"])
        return self._swap(key, version_label, staging)

    def _swap(self, weights_path: str, version_label: str, staging: float | None) -> SwapTimes:
        """Steps 1-5, reloading from what Step 0 staged under `weights_path` (or its files)."""
        started = time.perf_counter()
        # Step 1
        self.pause("keep")
        drained = time.perf_counter()
        try:
            # Step 2
            try:
                answer = self._request("POST", "/collective_rpc", {"method": "rollwire_reload_weights",
                                                                   "kwargs": {"weights_path": weights_path}})
                applied = time.perf_counter()
            except VllmError as exc:
                if "rollwire_reload_weights" in str(exc):
                    raise VllmError(f"the server at {self.base_url} was started without rollwire's worker extension "
                                    f"(vllm serve ... --worker-extension-cls {EXTENSION}; `rollwire inference` "
                                    f"adds it): {exc}") from exc
                raise
            # Step 3
            self._request("POST", "/update_weight_version", {"new_version": version_label})
            # Step 4
            self._reset_prefix_cache()
        finally:
            # Step 5
            self.resume()
        results = (answer or {}).get("results") or [{}]
        return SwapTimes(drain_s=drained - started, apply_s=applied - drained, paused_s=time.perf_counter() - started,
                         stage_s=started - staging if staging is not None else 0.0,
                         staged=all(isinstance(r, dict) and r.get("staged") for r in results))

    def _stage(self, method: str, kwargs: dict, key: str, *, required: bool, poll_s: float = 0.005) -> list[dict]:
        """Step 0: `method` stages a version under `key` in every worker; waits until all have, and
        returns what each said. A server without the method (an older extension) reloads from disk,
        unless it is `required`."""
        try:
            self._request("POST", "/collective_rpc", {"method": method, "kwargs": kwargs})
        except VllmError as exc:
            if method in str(exc) and not required:
                return []
            raise
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            results = self._request("POST", "/collective_rpc", {"method": "rollwire_staged",
                                                                "kwargs": {"weights_path": key}}).get("results", [])
            if all(r.get("done") for r in results):
                errors = [r["error"] for r in results if r.get("error")]
                if errors:
                    raise VllmError(f"staging {key} failed in {len(errors)} of {len(results)} workers: {errors[0]}")
                return results
            time.sleep(poll_s)
        raise VllmError(f"the server at {self.base_url} did not stage {key} within {self.timeout_s:g} s")

    def _reset_prefix_cache(self, attempts: int = 20) -> None:
        for _ in range(attempts):  # refused while KV transfers hold blocks; bounded retries
            if self._request("POST", "/reset_prefix_cache?reset_running_requests=true").get("success", True):
                return
            time.sleep(0.05)
        raise VllmError(f"the prefix cache could not be reset after {attempts} attempts")

    def load_lora(self, name: str, path: str) -> None:
        """Loads an adapter under a new name (requests name it as their model)."""
        self._request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_lora(self, name: str) -> None:
        self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def generate(self, token_ids: Sequence[int], *, max_tokens: int = 16, temperature: float = 1.0,
                 logprobs: bool = True, model: str | None = None, seed: int | None = None,
                 ignore_eos: bool = False, stop_token_ids: Sequence[int] | None = None) -> dict:
        """Token-in, token-out generation (`/inference/v1/generate`, needs `--enable-scale-out`)."""
        sampling = _sampling(max_tokens, temperature, logprobs, seed, ignore_eos)
        if stop_token_ids:
            sampling["stop_token_ids"] = list(stop_token_ids)
        body: dict[str, Any] = {"token_ids": list(token_ids), "sampling_params": sampling}
        if model:
            body["model"] = model
        return self._request("POST", "/inference/v1/generate", body)

    def generate_stream(self, token_ids: Sequence[int], *, max_tokens: int = 64, temperature: float = 1.0,
                        seed: int | None = None, ignore_eos: bool = False, model: str | None = None,
                        stop_token_ids: Sequence[int] | None = None) -> Iterator[dict]:
        """Like `generate`, streamed: yields each server-sent chunk as it arrives."""
        sampling = _sampling(max_tokens, temperature, True, seed, ignore_eos)
        if stop_token_ids:
            sampling["stop_token_ids"] = list(stop_token_ids)
        body: dict[str, Any] = {"token_ids": list(token_ids), "stream": True, "sampling_params": sampling}
        if model:
            body["model"] = model
        try:
            for line in self._http.stream_lines("POST", "/inference/v1/generate", body):
                line = line.strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    yield json.loads(line[5:])
        except HttpError as exc:
            raise VllmError(str(exc)) from exc

    def tokenize(self, text: str) -> list[int]:
        """The server's token ids of `text` (special tokens written in it are kept, none are added);
        remembered, since a group's rollouts share their prompt."""
        return list(self._tokenized(text))

    def _tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(self._request("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"])

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, as the server's tokenizer decodes them."""
        return self._request("POST", "/detokenize", {"tokens": list(token_ids)})["prompt"]

    def render_chat(self, messages: list[dict], *, model: str = "policy", tools: list[dict] | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
        """The prompt token ids of `messages` (and `tools`, OpenAI function schemas) under the served
        chat template, ready for the assistant (or, without `add_generation_prompt`, as they are)."""
        body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": add_generation_prompt}
        if tools:  # rendered by the template; the harness parses the calls itself, so vLLM's parser stays off
            body.update(tools=tools, tool_choice="none")
        return self._request("POST", "/v1/chat/completions/render", body)["token_ids"]

    def end_of_turn_ids(self, model: str = "policy") -> list[int]:
        """The token the served chat template closes an assistant turn with (`<|im_end|>` for ChatML,
        `<|eot_id|>` for Llama 3, `<end_of_turn>` for Gemma), read from the template itself; [] when
        it cannot be told. Remembered: a server's template does not change."""
        if self._end_of_turn is None:
            user = [{"role": "user", "content": "hi"}]
            self._end_of_turn = turn_end(self.render_chat(user, model=model),
                                         self.render_chat([*user, {"role": "assistant", "content": TURN_PROBE}],
                                                          model=model, add_generation_prompt=False),
                                         self.tokenize(TURN_PROBE))
        return list(self._end_of_turn)

    def tool_call_format(self, model: str = "policy") -> ToolCallFormat | None:
        """The format the served chat template writes tool calls in (`rollwire.producers.tool_calls`),
        read from the turn it renders for one call (`PROBE_CALL`, past what it renders before that
        turn: the tools' own description may look like a call); None when it writes none or refuses
        tools. Remembered: a server's template does not change."""
        if self._tool_call_format is None:
            try:
                before = self.render_chat(PROBE_CALL[:1], model=model, tools=[PROBE_TOOL])
                rendered = self.render_chat(PROBE_CALL, model=model, tools=[PROBE_TOOL], add_generation_prompt=False)
            except VllmError as exc:
                if exc.unreachable:
                    raise
                before = rendered = []  # a template that cannot render tools
            shared = next((i for i, (a, b) in enumerate(zip(before, rendered)) if a != b), min(len(before), len(rendered)))
            turn = rendered[shared:]
            self._tool_call_format = (format_written(self.detokenize(turn), PROBE_TOOL["function"]["name"])
                                      if turn else None,)
        return self._tool_call_format[0]


PROBE_TOOL: dict[str, Any] = {"type": "function", "function": {
    "name": "probe_tool", "description": "A tool.",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
PROBE_CALL: list[dict[str, Any]] = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "probe0001", "type": "function",  # nine letters and digits, as Mistral's templates insist
                   "function": {"name": "probe_tool", "arguments": '{"x": 1}'}}]}]
"""A conversation with one tool call, to read the format a template writes calls in."""


TURN_PROBE = "Sure."
"""An assistant reply whose tokens are found in a rendered turn, to read what the template writes after it."""


def turn_end(prefix: Sequence[int], full: Sequence[int], content: Sequence[int]) -> list[int]:
    """The end-of-turn token of a chat template, from `prefix` (a user turn rendered ready for the
    assistant), `full` (the same with the assistant's reply `content`, rendered as history) and the
    reply's own tokens: the token right after the reply. [] when the reply is not found."""
    rest = list(full[len(prefix):]) if list(full[: len(prefix)]) == list(prefix) else list(full)
    content = list(content)
    for start in range(len(rest) - len(content)):
        if rest[start: start + len(content)] == content:
            return [rest[start + len(content)]]
    return []


def _sampling(max_tokens: int, temperature: float, logprobs: bool, seed: int | None, ignore_eos: bool) -> dict:
    params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos}
    if logprobs:
        params["logprobs"] = 0
    if seed is not None:
        params["seed"] = seed
    return params
