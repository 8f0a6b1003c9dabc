"""What runs first inside a rollout's container (`rollwire.producers.sandbox`): standard library only,
mounted read-only as /rollwire/entry.py, so any image with a Python 3 can hold the agent.

    python3 /rollwire/entry.py COMMAND...

The rollout's own variables (its task, URL path, time limit, grading command) come as one JSON
line on stdin, so that a container can be started before its rollout is known and wait for it (the
runtime's warm pool); end of input before that line ends the container at once (the pool closed).

The container has no network at all (`--network none`): its one way out is the Unix socket of the
worker's interception server, mounted at $ROLLWIRE_SOCKET. This program listens on the container's
own loopback and relays each connection to that socket, runs COMMAND with the rollout's
URL on that loopback (OPENAI_BASE_URL, ANTHROPIC_BASE_URL without its /v1, and ROLLWIRE_MODEL_URL
for rollwire's own harness entry point) for at most $ROLLWIRE_TIMEOUT_S, then prints one JSON line: the command's exit
code and output (or that it timed out), and how often the container's memory and process limits
were hit (read from its cgroup, v1 or v2), and exits, ending whatever the command left running.

With $ROLLWIRE_GRADE_COMMAND (a JSON list), a command that finished well is graded in the same
container before it ends: the grading command runs with the files the agent left and its answer
($ROLLWIRE_ANSWER), for at most $ROLLWIRE_GRADE_TIMEOUT_S, and its exit code and output go into
the JSON line as `grade`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading

OUTPUT_LIMIT = 64 * 1024
"""Characters of the command's stdout and stderr (each, the end) that come back to the worker."""

COUNTERS = {
    # what: [(file, line name)], cgroup v2 first, then v1
    "oom_kills": [("/sys/fs/cgroup/memory.events", "oom_kill"), ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")],
    "pids_refused": [("/sys/fs/cgroup/pids.events", "max"), ("/sys/fs/cgroup/pids/pids.events", "max")],
}


def counter(what: str) -> int | None:
    """How often the container's cgroup hit a limit so far, or None where it cannot be read."""
    for path, name in COUNTERS[what]:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == name:
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _relay(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()


def answer_of(stdout: str) -> str:
    """The command's answer: its last line (rollwire's harness entry point writes {"answer": ...})."""
    lines = stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    try:
        reply = json.loads(last)
    except ValueError:
        return last
    return str(reply["answer"]) if isinstance(reply, dict) and "answer" in reply else last


def grade(command: list[str], env: dict[str, str], answer: str, timeout_s: float) -> dict:
    """Runs the grading command in this container, after the agent: its exit code and output."""
    try:
        done = subprocess.run(command, env={**env, "ROLLWIRE_ANSWER": answer}, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"returncode": None, "stdout": "", "stderr": "", "timed_out": True}
    except OSError as exc:
        return {"returncode": 127, "stdout": "", "stderr": f"{type(exc).__name__}: {exc}", "timed_out": False}
    return {"returncode": done.returncode, "stdout": done.stdout[-OUTPUT_LIMIT:], "stderr": done.stderr[-OUTPUT_LIMIT:],
            "timed_out": False}


def main(argv: list[str]) -> int:
    if not argv:
        print(json.dumps({"error": "no command given"}))
        return 2
    # PID 1 of its container: a stop (SIGTERM, `docker stop`, the worker's client dying) ends it and so the container
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    job = sys.stdin.readline()
    if not job.strip():  # the worker closed the pool: no rollout came
        return 0
    os.environ.update(json.loads(job))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    threading.Thread(target=_relay, args=(listener, os.environ["ROLLWIRE_SOCKET"]), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}{os.environ['ROLLWIRE_URL_PATH']}"
    env = {k: v for k, v in os.environ.items() if k not in ("ROLLWIRE_SOCKET", "ROLLWIRE_URL_PATH")}
    env.update(OPENAI_BASE_URL=url, OPENAI_API_KEY="rollwire", ROLLWIRE_MODEL_URL=url,  # as agent_api.agent_variables
               ANTHROPIC_BASE_URL=url.removesuffix("/v1"), ANTHROPIC_API_KEY="rollwire")
    timeout_s = float(os.environ.get("ROLLWIRE_TIMEOUT_S", "0")) or None
    try:
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 errors="replace")
    except OSError as exc:  # the command is not in the image, or the process limit refused it
        result: dict = {"returncode": 127, "stdout": "", "stderr": f"{type(exc).__name__}: {exc}"}
    else:
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
            result = {"returncode": child.returncode, "stdout": stdout[-OUTPUT_LIMIT:], "stderr": stderr[-OUTPUT_LIMIT:]}
        except subprocess.TimeoutExpired:  # what it started may hold its pipes: report, then end the container
            result = {"timed_out": True, "stdout": "", "stderr": ""}
    grade_command = json.loads(os.environ.get("ROLLWIRE_GRADE_COMMAND") or "null")
    if grade_command and result.get("returncode") == 0:
        result["grade"] = grade(grade_command, env, answer_of(result["stdout"]),
                                float(os.environ.get("ROLLWIRE_GRADE_TIMEOUT_S", "60")))
    result.update({what: counter(what) for what in COUNTERS})
    print(json.dumps(result), flush=True)
    os._exit(0)  # as PID 1: whatever the command left running ends with the container


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
