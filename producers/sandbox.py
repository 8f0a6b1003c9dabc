"""The container runtime: each rollout's agent or harness runs in a container of its own.

    [env_workers]
    runtime = "container"
    [env_workers.container]
    image = "local/python:3.11"          # any image with a python3 (deploy/stack/images.py builds this one)
    command = ["python3", "/agents/agent.py"]   # an agent program; omit it to run the taskset's harness
    mounts = ["/srv/agents:/agents"]     # read-only
    memory_mb = 512
    cpus = 1.0
    pids = 64
    grade_command = ["python3", "/agents/grade.py"]   # optional: graded in the same container, after the agent

One container per rollout, used once. A warm pool (`warm`, 2 by default) keeps containers started
ahead, each waiting for its rollout's task on stdin; a rollout takes one and another is started at
once. Measured here (`bench/container.py`): a container started at its rollout costs 0.21 s more
than a bare process, a waiting one 0.06 s. Each container has:

    no network      `--network none`: the container's only interface is its own loopback. The
                    worker's interception server also listens on a Unix socket, mounted into the
                    container; `sandbox_entry.py` (mounted read-only, standard library only) relays
                    the container's loopback to it and hands the command the rollout's URL
                    (OPENAI_BASE_URL). An agent that reaches for anything else finds no route.
    limits          memory (no swap), CPUs, processes (`--pids-limit`), the rollout's time limit
                    (the entry ends the container past it), a 64 MiB /tmp, an unprivileged user, no
                    capabilities, no privilege gain, a read-only root filesystem
    nothing of ours the container's environment holds only the task and its URL

Whatever the agent does, the rollout ends: a timeout, the memory or process limit hit (the
container's cgroup counts it: kind `resource_limit`), a crash with its stderr (a refused network
call names the cause). The worker goes on with its next rollout. A worker killed outright leaves
containers behind; the next runtime started on the same host removes those of dead workers.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollwire.core.errors import ConfigError
from rollwire.core.processes import die_with_parent
from rollwire.producers.harnesses import HarnessError, HarnessTimeout, ResourceLimit
from rollwire.producers.interception import Interceptor
from rollwire.producers.interception_server import InterceptionServer
from rollwire.producers.runtimes import Runtime

logger = logging.getLogger(__name__)

ENTRY = Path(__file__).with_name("sandbox_entry.py")
OWNER_LABEL = "rollwire.sandbox.owner"
RETIRE_TIMEOUT_S = 30.0  # a waiting pool container's client, given end of input at close, ends within it
"""Label on every rollout container: `<host>:<worker pid>`, so a later worker can remove a dead one's."""
NO_ROUTE = re.compile(r"Network is unreachable|Temporary failure in name resolution|Name or service not known|"
                      r"No address associated|Connection refused|Cannot assign requested address")
START_GRACE_S = 30.0
"""Added to the rollout's time limit for `docker run` to start the container (a loaded engine is slow)."""


class ContainerSettings(BaseModel):
    """How the container runtime runs each rollout (`[env_workers.container]`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    image: str = "local/python:3.11"
    """Any image with `python3` on its PATH. `python deploy/stack/images.py --only debian --only python`
    builds this one with no registry; the agent's own code may be in the image or mounted."""
    command: list[str] | None = None
    """The agent program run for every rollout (it gets OPENAI_BASE_URL and ROLLWIRE_TASK; the last
    line it prints is its answer). None runs the taskset's harness with `python3 -m
    rollwire.producers.runtimes`, which needs rollwire installed in the image."""
    mounts: list[str] = Field(default_factory=list)
    """`HOST_PATH:CONTAINER_PATH` folders mounted read-only (the agent's code, its data); a relative
    host path is taken from the current folder."""
    memory_mb: int = Field(default=512, ge=16)
    """Memory of the whole container, without swap; past it the kernel kills a process in it."""
    cpus: float = Field(default=1.0, gt=0)
    """CPUs the container may use (fractions allowed)."""
    pids: int = Field(default=64, ge=4)
    """Processes and threads the container may hold at once (a fork bomb stops here)."""
    tmp_mb: int = Field(default=64, ge=1)
    """Size of the writable /tmp (the rest of the filesystem is read-only)."""
    user: str = "65534:65534"
    """Who the container runs as (`nobody` by default; never root)."""
    docker: str = "docker"
    """The Docker client to call; DOCKER_HOST in the worker's environment picks the engine."""
    grade_command: list[str] | None = None
    """Run in the rollout's container after its agent or harness finished well, before the
    container is removed: it sees the files the agent left and gets its answer (ROLLWIRE_ANSWER)
    and task (ROLLWIRE_TASK). Its exit code and output reach the rewards as `RolloutView.sandbox`
    (e.g. run the tests of the repository the agent edited)."""
    grade_timeout_s: float = Field(default=60.0, gt=0)
    """Most seconds the grading command may take; past it, `sandbox["timed_out"]` is true."""
    @field_validator("mounts")
    @classmethod
    def _host_paths_absolute(cls, mounts: list[str]) -> list[str]:
        resolved = []
        for mount in mounts:
            host, sep, inside = mount.partition(":")
            if not sep or not host or not inside.startswith("/"):
                raise ValueError(f"container mount {mount!r}: write it as host/path:/container/path")
            if not Path(host).exists():
                raise ValueError(f"container mount {mount!r}: {Path(host).resolve()} does not exist here")
            resolved.append(f"{Path(host).resolve()}:{inside}")
        return resolved

    warm: int = Field(default=2, ge=0)
    """Containers started ahead of their rollouts, each waiting for one (and used for that one only):
    their start-up leaves the rollouts' time (`bench/container.py`). Each waiting container holds
    its Docker client and an idle Python; 0 starts every container when its rollout does."""


class _Started(NamedTuple):
    """A rollout container started and waiting for its job on stdin."""

    name: str
    process: subprocess.Popen


class Container(Runtime):
    """Runs each rollout in a fresh container with no network but its interception URL."""

    name = "container"
    watchdog_grace_s = START_GRACE_S + 5.0

    def __init__(self, settings: ContainerSettings | None = None, server: InterceptionServer | None = None) -> None:
        self.settings = settings or ContainerSettings()
        docker = shutil.which(self.settings.docker)
        if docker is None:
            raise ConfigError(f"the container runtime needs a Docker client: {self.settings.docker!r} is not on PATH "
                              "(install Docker, or set [env_workers.container] docker)")
        self._docker = docker
        probe = self._call("image", "inspect", "--format", "{{.Id}}", self.settings.image)
        if probe.returncode != 0:
            raise ConfigError(f"the container runtime cannot use image {self.settings.image!r}: "
                              f"{(probe.stderr or probe.stdout).strip()[-300:]} (build it, e.g. `python "
                              "deploy/stack/images.py --only debian --only python` for local/python:3.11, or set "
                              "[env_workers.container] image)")
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._closing = False
        self._remove_orphans()
        self.server = server or InterceptionServer()
        self._own_server = server is None
        self._io = Path(tempfile.mkdtemp(prefix="rollwire-sandbox-"))
        self._io.chmod(0o755)  # the container's user must reach the socket inside
        self.server.listen_unix(self._io / "model.sock")
        self._lock = threading.Lock()
        self._clients: dict[str, subprocess.Popen] = {}  # every container started and not yet removed, by name
        self._remover = ThreadPoolExecutor(1, thread_name_prefix="container-remover")
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="container-starter")
        self._pool: deque[Future[_Started]] = deque(self._starter.submit(self._start) for _ in range(self.settings.warm))

    def run(self, harness: str, row: dict, interceptor: Interceptor, *, timeout_s: float,
            options: dict[str, Any] | None = None) -> str:
        base_url = self.server.open(interceptor)
        job = {"ROLLWIRE_TASK": json.dumps(row), "ROLLWIRE_URL_PATH": InterceptionServer.route(base_url),
               "ROLLWIRE_TIMEOUT_S": f"{timeout_s:g}"}
        if self.settings.command is None:
            job["ROLLWIRE_HARNESS"] = harness
            job["ROLLWIRE_HARNESS_OPTIONS"] = json.dumps(options or {})
            job["ROLLWIRE_TOOL_CALL_FORMAT"] = interceptor.tool_call_format
        if self.settings.grade_command:
            job["ROLLWIRE_GRADE_COMMAND"] = json.dumps(self.settings.grade_command)
            job["ROLLWIRE_GRADE_TIMEOUT_S"] = f"{self.settings.grade_timeout_s:g}"
        try:
            done = self._run_job(job, timeout_s)
        finally:
            self.server.close(base_url)
        if self._closing:
            raise HarnessError("the worker stopped and removed the rollout's container")
        return self._answer(done, timeout_s, interceptor)

    def _start(self) -> _Started:
        """A container started now, waiting on stdin for its rollout (`sandbox_entry.py`)."""
        s = self.settings
        name = f"rollwire-rollout-{secrets.token_hex(6)}"
        command = s.command or ["python3", "-m", "rollwire.producers.runtimes"]
        argv = [self._docker, "run", "-i", "--name", name, "--label", f"{OWNER_LABEL}={self.owner}",
                "--network", "none", "--read-only", "--tmpfs", f"/tmp:rw,nosuid,nodev,size={s.tmp_mb}m,mode=1777",
                "--memory", f"{s.memory_mb}m", "--memory-swap", f"{s.memory_mb}m", "--cpus", f"{s.cpus:g}",
                "--pids-limit", str(s.pids), "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--user", s.user, "--workdir", "/tmp", "-v", f"{self._io}:/rollwire/io",
                "-v", f"{ENTRY}:/rollwire/entry.py:ro", *[arg for mount in s.mounts for arg in ("-v", f"{mount}:ro")],
                "-e", "ROLLWIRE_SOCKET=/rollwire/io/model.sock", s.image, "python3", "/rollwire/entry.py", *command]
        with self._lock:  # close() sets _closing under it: every container started before is in _clients
            if self._closing:
                raise HarnessError("the worker is stopping: no container is started for the rollout")
            process = subprocess.Popen(argv, env={"PATH": os.environ.get("PATH", ""), **_docker_client_env()},
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, errors="replace", preexec_fn=die_with_parent)
            self._clients[name] = process
        return _Started(name, process)

    def _remove(self, name: str) -> None:
        self._call("rm", "-f", "-v", name)
        with self._lock:
            self._clients.pop(name, None)

    def _take(self) -> _Started:
        """A waiting container of the warm pool, topped up again at once; a fresh one without a pool.
        The pool's containers are started by one long-lived thread: their Docker clients get
        SIGTERM when the thread that started them ends (`die_with_parent`), and a rollout's may."""
        with self._lock:
            waiting = self._pool.popleft() if self._pool else None
            if self.settings.warm and not self._closing:
                self._pool.append(self._starter.submit(self._start))
        started = waiting.result() if waiting is not None else None
        if started is not None and started.process.poll() is not None:
            self._discard(started)  # it ended while waiting (the engine stopped it): never used
            started = None
        return started or self._start()

    def _run_job(self, job: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
        started = self._take()
        s = self.settings
        limit = timeout_s + START_GRACE_S + (s.grade_timeout_s if s.grade_command else 0.0)
        try:
            stdout, stderr = started.process.communicate(json.dumps(job) + "\n", timeout=limit)
        except subprocess.TimeoutExpired as exc:  # the engine never started it, or the entry hung: a backstop
            self._discard(started)
            raise HarnessTimeout(f"the container did not finish within {limit:g} s (the rollout's limit, the "
                                 "grading's and the start-up grace) and was removed") from exc
        try:
            self._remover.submit(self._remove, started.name)  # off the rollout's time
        except RuntimeError:  # close() has shut the remover down
            self._remove(started.name)
        return subprocess.CompletedProcess(started.process.args, started.process.returncode, stdout, stderr)

    def _discard(self, started: _Started) -> None:
        started.process.kill()
        started.process.communicate()
        self._remove(started.name)

    def _retire(self, started: _Started) -> None:
        """Ends a pool container that got no rollout. Its client is given end of input rather than
        killed: killed while its create request is in flight, it would leave a container that the
        engine makes only after the listing in `close` (one was found left in CI)."""
        try:
            started.process.communicate("", timeout=RETIRE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            started.process.kill()
            started.process.communicate()
        self._remove(started.name)

    def _answer(self, done: subprocess.CompletedProcess, timeout_s: float, interceptor: Interceptor) -> str:
        lines = done.stdout.strip().splitlines()
        try:
            result = json.loads(lines[-1]) if lines else None
        except ValueError:
            result = None
        if not isinstance(result, dict) or not ("returncode" in result or result.get("timed_out")):
            # the entry itself did not finish: the engine refused the container, or the kernel killed it
            why = done.stderr.strip()[-500:] or f"exit code {done.returncode}"
            if done.returncode == 137:
                raise ResourceLimit(f"the container was killed (exit 137), most likely at its memory limit of "
                                    f"{self.settings.memory_mb} MiB: {why}")
            raise HarnessError(f"the container failed: {why}")
        s = self.settings
        if result.get("oom_kills"):
            raise ResourceLimit(f"the agent ran out of memory: the container's limit is {s.memory_mb} MiB "
                                "([env_workers.container] memory_mb)")
        if result.get("pids_refused"):
            raise ResourceLimit(f"the agent hit the container's limit of {s.pids} processes "
                                "([env_workers.container] pids)" + (" and then its time limit" if result.get("timed_out")
                                                                      else ""))
        if result.get("timed_out"):
            raise HarnessTimeout(f"the agent in its container ran past {timeout_s:g} s and was killed")
        interceptor.grading = result.get("grade")
        if result["returncode"] != 0:
            stderr = result.get("stderr", "").strip()
            hint = (" (the container has no network: only the rollout's model URL answers)"
                    if NO_ROUTE.search(stderr) else "")
            raise HarnessError(f"the agent exited with code {result['returncode']}{hint}: {stderr[-500:]}")
        if s.command is None:  # rollwire's harness entry point: its last line is {"answer"} or {"error"}
            out = result.get("stdout", "").strip().splitlines()
            try:
                reply = json.loads(out[-1]) if out else {}
            except ValueError:
                reply = {}
            if "answer" not in reply:
                raise HarnessError(f"the harness failed in its container: {reply.get('error') or result.get('stderr')}")
            return reply["answer"]
        out = result.get("stdout", "").strip().splitlines()
        return out[-1] if out else ""

    def _remove_orphans(self) -> None:
        """Removes rollout containers left by workers on this host that no longer run (killed outright)."""
        listed = self._call("ps", "-a", "--filter", f"label={OWNER_LABEL}",
                            "--format", f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}')
        host = socket.gethostname()
        for line in listed.stdout.splitlines():
            cid, _, owner = line.partition(" ")
            owner_host, _, pid = owner.rpartition(":")
            if owner_host == host and pid.isdigit() and not _alive(int(pid)):
                logger.info("removing container %s left by worker %s", cid, owner)
                self._call("rm", "-f", "-v", cid)

    def _call(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self._docker, *args], capture_output=True, text=True, timeout=120,
                              env={"PATH": os.environ.get("PATH", ""), **_docker_client_env()})

    def close(self) -> None:
        """Removes every container this runtime started. Pool containers that got no rollout are
        retired; those of rollouts still running (abandoned by the worker's drain) are removed, and
        their rollouts fail. No container starts once this has begun."""
        with self._lock:
            self._closing = True
            waiting, self._pool = list(self._pool), deque()
        for future in waiting:
            if future.exception() is None:  # a pool start not yet begun refuses (HarnessError)
                self._retire(future.result())
        self._starter.shutdown(wait=True)
        self._remover.shutdown(wait=True)
        with self._lock:
            running = dict(self._clients)
        for name, process in running.items():
            self._call("rm", "-f", "-v", name)
            try:  # its rollout's thread sees the container go, and _closing
                process.wait(timeout=RETIRE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            self._remove(name)  # again: a client stopped in its create request leaves the container after it
        listed = self._call("ps", "-aq", "--filter", f"label={OWNER_LABEL}={self.owner}")
        for cid in listed.stdout.split():
            self._call("rm", "-f", "-v", cid)
        if self._own_server:
            self.server.shutdown()
        shutil.rmtree(self._io, ignore_errors=True)


def _docker_client_env() -> dict[str, str]:
    """What the Docker client needs from the worker's environment (which engine, its TLS files), and nothing else."""
    return {k: v for k, v in os.environ.items() if k.startswith("DOCKER_") or k in ("HOME", "XDG_RUNTIME_DIR")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
