"""A real MLflow tracking server on this machine, for `report_to = ["mlflow"]` — tests and local use.

    python deploy/mlflow/server.py start [--dir D]   # install (cached), start on a free port, print the URL
    python deploy/mlflow/server.py stop  [--dir D]   # stop the server this script started, by PID

The server is `mlflow` itself, installed into its own virtual environment (`.cache/mlflow/venv`):
it brings a web app, a database layer and scikit-learn that no rollwire process needs, and its
pins would fight the trainer's; rollwire's processes hold only the client (`mlflow-skinny`, the
`mlflow` extra). Runs are kept in SQLite under the run directory. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # deploy/: the shared helpers
from pids import stop_pid  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO / ".cache" / "mlflow"
VERSION = "3.17.2"
"""The server's version; a client (`mlflow-skinny`) of the same major version talks to it."""
STARTUP_TIMEOUT_S = 120.0


class ServerError(RuntimeError):
    """The server could not be installed, started or stopped; the message says why."""


@dataclass(frozen=True)
class ServerInfo:
    pid: int
    url: str
    run_dir: str


def install(cache: Path = DEFAULT_CACHE, version: str = VERSION) -> Path:
    """The `mlflow` executable of a virtual environment holding `mlflow==version` (installed once)."""
    venv = cache / "venv"
    executable = venv / "bin" / "mlflow"
    stamp = venv / f".installed-{version}"
    if stamp.exists() and executable.exists():
        return executable
    started = time.monotonic()
    print(f"installing mlflow {version} into {venv} (once) ...", file=sys.stderr, flush=True)
    # uv beside this interpreter (the Makefile installs it) takes ~15 s where pip took ~2 min
    uv = Path(sys.executable).parent / "uv"
    installer = ([str(uv), "pip", "install", "-q", "--python", str(venv / "bin" / "python")] if uv.exists()
                 else [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"])
    for command in ([sys.executable, "-m", "venv", str(venv)], [*installer, f"mlflow=={version}"]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ServerError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    stamp.touch()
    print(f"installed mlflow in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return executable


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(run_dir: Path, cache: Path = DEFAULT_CACHE) -> ServerInfo:
    """Starts a server on a free loopback port with its store in `run_dir`; returns when it answers."""
    executable = install(cache)
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(run_dir / "mlflow.log", "w")
    process = subprocess.Popen(
        [str(executable), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{run_dir / 'mlflow.db'}", "--default-artifact-root",
         (run_dir / "artifacts").as_uri()], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    info = ServerInfo(process.pid, url, str(run_dir))
    (run_dir / "server.json").write_text(json.dumps(asdict(info)))
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"mlflow server exited with {process.returncode}; see {run_dir / 'mlflow.log'}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return info
        except OSError:
            time.sleep(0.5)
    stop(info)
    raise ServerError(f"mlflow server did not answer on {url} within {STARTUP_TIMEOUT_S:.0f} s; "
                      f"see {run_dir / 'mlflow.log'}")


def stop(info: ServerInfo) -> None:
    """Stops the server (its gunicorn/uvicorn workers are in its session and go with it)."""
    import os
    import signal
    try:
        os.killpg(info.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    stop_pid(info.pid, timeout_s=15)
    try:
        os.killpg(info.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", type=Path, default=REPO / ".cache" / "mlflow" / "server",
                        help="where the server keeps its runs and its server.json (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            print(start(args.dir).url)
        else:
            stop(ServerInfo(**json.loads((args.dir / "server.json").read_text())))
    except (ServerError, FileNotFoundError) as exc:
        print(f"mlflow server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
