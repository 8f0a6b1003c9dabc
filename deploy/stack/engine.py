"""The Docker engine the stack runs on: the one already running, or one this module starts.

    python deploy/stack/engine.py status     # which engine answers, or why none does
    python deploy/stack/engine.py start      # start dockerd (root, Debian's docker.io) unless one runs
    python deploy/stack/engine.py stop       # stop the dockerd `start` started (by its PID file), nothing else

A machine without an init system (CI here, containers) has Debian's `docker.io` installed but no
engine running: `start` runs `dockerd` in the background with its log in .cache/stack/dockerd.log
and its PID in .cache/stack/dockerd.pid; `stop` ends exactly that process. An engine this module
did not start is never stopped by it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # deploy/: the shared helpers
from pids import stop_pid  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STATE = REPO / ".cache" / "stack"
INSTALL = "apt-get install -y --no-install-recommends docker.io docker-compose debootstrap"


class EngineError(RuntimeError):
    pass


@dataclass
class Engine:
    version: str
    pid: int | None = None
    """The dockerd this module started, or None for an engine that was already running."""


def answering() -> str | None:
    """The running engine's version, or None."""
    if shutil.which("docker") is None:
        return None
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    return probe.stdout.strip() if probe.returncode == 0 and probe.stdout.strip() else None


def ensure(timeout_s: float = 60.0, *, nice: int = 0) -> Engine:
    """The running engine, or one started now (at niceness `nice`: its builds and containers yield
    the CPU to other work); raises EngineError naming what to install or run."""
    version = answering()
    if version:
        return Engine(version)
    missing = [tool for tool in ("docker", "dockerd", "docker-compose") if shutil.which(tool) is None]
    if missing:
        raise EngineError(f"no Docker engine runs here and {', '.join(missing)} is not installed: install one "
                          f"(Debian, as root: `{INSTALL}`; elsewhere https://docs.docker.com/engine/install/)")
    if os.geteuid() != 0:
        raise EngineError("no Docker engine runs here: start it (`sudo systemctl start docker`, or as root "
                          "`python deploy/stack/engine.py start`)")
    STATE.mkdir(parents=True, exist_ok=True)
    log = open(STATE / "dockerd.log", "ab")
    niced = ["nice", "-n", str(nice)] if nice else []
    proc = subprocess.Popen([*niced, "dockerd", "-p", str(STATE / "dockerd.pid")], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"dockerd exited with code {proc.returncode}; see {STATE / 'dockerd.log'}")
        version = answering()
        if version:
            return Engine(version, proc.pid)
        time.sleep(0.5)
    proc.kill()
    raise EngineError(f"dockerd did not answer within {timeout_s:.0f} s; see {STATE / 'dockerd.log'}")


def stop(engine: Engine, timeout_s: float = 30.0) -> None:
    """Stops the engine `ensure` started (SIGTERM, then SIGKILL); an engine found running is left alone."""
    if engine.pid is not None:
        stop_pid(engine.pid, timeout_s)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    if command == "status":
        version = answering()
        print(f"Docker engine {version} answers" if version else "no Docker engine answers (`docker info` failed)")
        return 0 if version else 1
    if command == "start":
        try:
            engine = ensure()
        except EngineError as exc:
            print(f"engine.py: {exc}", file=sys.stderr)
            return 1
        print(f"Docker engine {engine.version} " + (f"started (pid {engine.pid})" if engine.pid else "already running"))
        return 0
    if command == "stop":
        pid_file = STATE / "dockerd.pid"
        if not pid_file.exists():
            print("no engine started by engine.py is running (no .cache/stack/dockerd.pid)")
            return 0
        pid = int(pid_file.read_text().strip())
        stop(Engine(answering() or "?", pid))
        print(f"stopped dockerd (pid {pid})")
        return 0
    print("usage: engine.py [status|start|stop]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
