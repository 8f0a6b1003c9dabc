"""A client for one vLLM server's generation and control routes (`VLLM_SERVER_DEV_MODE=1`).

The hot-reload sequence it offers (`swap_full_weights`), as measured on these machines:

    # Step 1  POST /pause?mode=keep           in-flight requests freeze, none are dropped
    # Step 2  POST /collective_rpc            reload_weights(weights_path=DIR): layer-wise, in place
    # Step 3  POST /update_weight_version     the label later tokens report in `weight_versions`
    # Step 4  POST /reset_prefix_cache?reset_running_requests=true
    #                                         cached KV was computed with the old weights
    # Step 5  POST /resume                    frozen requests continue on the new weights

A reload that fails midway leaves the engine broken, so callers verify the checkpoint completely
before Step 2 (`rollwire.checkpoints.fetch`). The routes are unauthenticated: keep the server on
loopback (`VllmServerSettings` insists) or behind an authenticated proxy.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from rollwire.errors import RollwireError


class VllmError(RollwireError):
    """The vLLM server refused or failed a request; the message has its answer."""


class VllmControl:
    """Talks to the vLLM server at `base_url` (e.g. `http://127.0.0.1:8000`)."""

    def __init__(self, base_url: str, *, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise VllmError(f"{method} {path} answered HTTP {exc.code}: {exc.read()[:1000]!r}") from exc
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise VllmError(f"{method} {path} failed: {exc}") from exc
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # some routes answer plain text, e.g. "Success: LoRA adapter … added"
            return raw.decode(errors="replace")

    def healthy(self) -> bool:
        try:
            self._request("GET", "/health", timeout_s=5.0)
            return True
        except VllmError:
            return False

    def weight_version(self) -> str:
        """The label the server gives tokens sampled now (`default` before any update)."""
        return self._request("GET", "/weight_info")["weight_version"]

    def pause(self, mode: str = "keep") -> None:
        """Stops scheduling: `keep` freezes in-flight requests, `wait` drains them, `abort` drops them."""
        self._request("POST", f"/pause?mode={mode}")

    def resume(self) -> None:
        self._request("POST", "/resume")

    def swap_full_weights(self, weights_dir: str, version_label: str) -> float:
        """Steps 1-5 above; returns the seconds generation was paused."""
        # Step 1
        self.pause("keep")
        started = time.perf_counter()
        try:
            # Step 2
            self._request("POST", "/collective_rpc", {"method": "reload_weights",
                                                      "kwargs": {"weights_path": weights_dir}})
            # Step 3
            self._request("POST", "/update_weight_version", {"new_version": version_label})
            # Step 4
            self._reset_prefix_cache()
        finally:
            # Step 5
            self.resume()
        return time.perf_counter() - started

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
        body = {"token_ids": list(token_ids), "sampling_params": _sampling(max_tokens, temperature, logprobs, seed,
                                                                            ignore_eos)}
        if stop_token_ids:
            body["sampling_params"]["stop_token_ids"] = list(stop_token_ids)
        if model:
            body["model"] = model
        return self._request("POST", "/inference/v1/generate", body)

    def generate_stream(self, token_ids: Sequence[int], *, max_tokens: int = 64, temperature: float = 1.0,
                        seed: int | None = None, ignore_eos: bool = False) -> Iterator[dict]:
        """Like `generate`, streamed: yields each server-sent chunk as it arrives."""
        body = {"token_ids": list(token_ids), "stream": True,
                "sampling_params": _sampling(max_tokens, temperature, True, seed, ignore_eos)}
        request = urllib.request.Request(self.base_url + "/inference/v1/generate", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            for line in response:
                line = line.strip()
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    yield json.loads(line[5:])


def _sampling(max_tokens: int, temperature: float, logprobs: bool, seed: int | None, ignore_eos: bool) -> dict:
    params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos}
    if logprobs:
        params["logprobs"] = 0
    if seed is not None:
        params["seed"] = seed
    return params
