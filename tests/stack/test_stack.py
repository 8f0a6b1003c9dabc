"""The compose stack, for real: images built here with no registry, every role in its container,
the demo recipe trained for a few steps, checked from outside the stack.

Uses the Docker engine that runs here, or starts one as root (`deploy/stack/engine.py`); without
either it fails with the command that installs one. Builds what is missing
(`deploy/stack/images.py`; rollwire's own image always, from its layer cache), brings the stack up
under its own project name with its own host ports, and takes down what it brought up: its
containers, network and volumes, and the engine if it started it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker_engine import STACK_IMAGES, engine_with_images

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
ROLES = ("inference", "env-worker", "scorer", "trainer", "dispatcher", "gateway", "feedback-api", "joiner")
SERVE_TOKEN = "stack-app-" + uuid.uuid4().hex
FEEDBACK_TOKEN = "stack-feedback-" + uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """One compose project of the stack: `compose(...)` runs docker-compose on it."""

    def __init__(self) -> None:
        self.project = f"rollwire-test-{uuid.uuid4().hex[:8]}"
        self.ports = {name: _free_port() for name in ("KAFKA", "S3", "JAEGER", "OTLP", "SERVE", "FEEDBACK")}
        self.env = {**os.environ, **{f"ROLLWIRE_{name}_PORT": str(port) for name, port in self.ports.items()},
                    "ROLLWIRE_STEPS": str(STEPS), "ROLLWIRE_WARM_START_STEPS": "100",
                    "ROLLWIRE_SERVE_TOKENS": f"stack-app={SERVE_TOKEN}",
                    "ROLLWIRE_FEEDBACK_TOKENS": f"stack-app={FEEDBACK_TOKEN}"}

    def compose(self, *args: str, timeout_s: float = 600, check: bool = True) -> str:
        command = ["docker-compose", "-p", self.project, "-f", "docker-compose.yml", "-f", "deploy/compose.offline.yml",
                   "--profile", "cpu", "--profile", "feedback", *args]
        proc = subprocess.run(command, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(command[5:])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n"
                                 f"{self.logs()}")
        return proc.stdout

    def logs(self, tail: int = 40) -> str:
        proc = subprocess.run(["docker-compose", "-p", self.project, "-f", "docker-compose.yml", "-f",
                               "deploy/compose.offline.yml", "logs", "--no-color", f"--tail={tail}"],
                              cwd=REPO, env=self.env, capture_output=True, text=True)
        return proc.stdout[-20000:]

    def container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).split()
        assert ids, f"no container for {service}"
        return ids[0]

    def inspect(self, service: str) -> dict:
        out = subprocess.run(["docker", "inspect", self.container(service)], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)[0]

    def events(self, topic: str) -> list[dict]:
        """Every event of `topic` on the stack's Kafka, read from the host with `rollwire tail`."""
        proc = subprocess.run([sys.executable, "-m", "rollwire", "tail", topic, "--bus", "kafka", "--bootstrap",
                               f"127.0.0.1:{self.ports['KAFKA']}", "--prefix", "demo", "--json"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    def jaeger(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['JAEGER']}{path}", timeout=10) as response:
            return json.loads(response.read())

    def post(self, port: str, path: str, body: dict, token: str) -> tuple[dict, dict]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.ports[port]}{path}", data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read()), dict(response.headers)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # what is missing, and rollwire's from this checkout (layer cache)
    with engine_with_images(STACK_IMAGES, "the stack test"):
        stack = Stack()
        try:
            stack.compose("up", "-d", "--no-build", timeout_s=900)
            yield stack
        finally:
            stack.compose("down", "-v", "--remove-orphans", "--timeout", "20", check=False)


def _wait_for(what: str, check, stack: Stack, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(3)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{stack.logs()}")


def test_the_stack_trains_recovers_a_killed_role_and_traces_a_rollout_end_to_end(stack: Stack):
    # the trainer's first step, then it is killed like a crash (SIGKILL from outside) and restarted by its policy
    _wait_for("the first trainer step", lambda: stack.events("train"), stack, 600)
    trainer = stack.inspect("trainer")
    subprocess.run(["kill", "-9", str(trainer["State"]["Pid"])], check=True)
    _wait_for("the trainer's restart", lambda: stack.inspect("trainer")["RestartCount"] >= 1, stack, 120)

    # the run reaches its last step: every step once, in order, and a weight version per step
    steps = _wait_for(f"step {STEPS}", lambda: (s := [e["event"] for e in stack.events("train")])
                      and s[-1]["step"] >= STEPS and s, stack, 600)
    # a kill between a step's commit point and the mark that its outbox was sent re-sends that outbox
    # on restart (at least once, `trainer/loop.py`): the same step again, identical, right after itself
    by_step: dict[int, dict] = {}
    for s in steps:
        assert by_step.setdefault(s["step"], s) == s, f"step {s['step']} was sent twice with different contents"
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps), "the steps went out of order"
    assert sorted(by_step) == list(range(1, STEPS + 1)), "a step went missing across the kill"
    trained = [rollout for s in by_step.values() for rollout in s["rollout_ids"]]
    assert len(trained) == len(set(trained)), "a rollout was trained twice across the trainer's restart"
    published = [e["event"] for e in stack.events("weights") if e.get("type") == "weights.published"]
    assert {p["version"] for p in published} >= {STEPS}
    assert all(p["uri"].startswith("s3://rollwire/") for p in published)
    # a replica reports serving the newest version on `fleet`
    _wait_for(f"a replica serving version {STEPS}", lambda: any(
        e["event"]["state"] == "serving" and e["event"]["serving_version"] == STEPS for e in stack.events("fleet")),
        stack, 120)

    # the stack guide's view from the host: one step's story from the stack's events
    story = subprocess.run([sys.executable, "-m", "rollwire", "inspect", "step", "2", "--bus", "kafka", "--bootstrap",
                            f"127.0.0.1:{stack.ports['KAFKA']}", "--prefix", "demo"], capture_output=True, text=True,
                           timeout=120)
    assert story.returncode == 0 and "2" in story.stdout, story.stdout + story.stderr

    # the weights are objects in the stack's S3 bucket, the trainer's checkpoints on its volume
    from minio import Minio
    s3 = Minio(f"127.0.0.1:{stack.ports['S3']}", access_key="rollwire", secret_key="rollwire-secret", secure=False)
    newest = next(p for p in published if p["version"] == STEPS)
    prefix = newest["uri"].removeprefix("s3://rollwire/")
    keys = [o.object_name for o in s3.list_objects("rollwire", prefix=prefix, recursive=True)]
    assert any(k.endswith(".safetensors") for k in keys), keys
    volume = f"{stack.project}_run"
    listing = subprocess.run(["docker", "run", "--rm", "-v", f"{volume}:/run-volume:ro", "local/debian:bookworm",
                              "ls", "/run-volume/run/trainer"], capture_output=True, text=True)
    assert listing.returncode == 0 and listing.stdout.split(), listing.stderr

    # one rollout's story in Jaeger: the step's trace (trainer, and the replica's reload of its weights)
    # links to the scored rollout, whose trace holds the env worker and the scorer
    services = set(stack.jaeger("/api/services")["data"] or [])
    assert {"rollwire-trainer", "rollwire-replica", "rollwire-env-worker", "rollwire-scorer"} <= services, services

    def step_trace_with_reload():
        for trace in stack.jaeger("/api/traces?service=rollwire-trainer&operation=trainer%20step&limit=20")["data"]:
            names = {trace["processes"][s["processID"]]["serviceName"] for s in trace["spans"]}
            if "rollwire-replica" in names:
                return trace
        return None

    step_trace = _wait_for("a trainer step's trace with the replica's reload", step_trace_with_reload, stack, 60)
    step_span = next(s for s in step_trace["spans"] if s["operationName"] == "trainer step")
    linked = [r for r in step_span["references"] if r["traceID"] != step_trace["traceID"]]
    assert linked, "the trainer step links to no rollout"
    rollout_trace = stack.jaeger(f"/api/traces/{linked[0]['traceID']}")["data"][0]
    rollout_services = {rollout_trace["processes"][s["processID"]]["serviceName"] for s in rollout_trace["spans"]}
    assert {"rollwire-env-worker", "rollwire-scorer"} <= rollout_services, rollout_services

    # production traffic: a chat answer from the gateway, a rating of it through the feedback API, and
    # the joiner's training sample made of the two
    answer, headers = stack.post("SERVE", "/v1/chat/completions", {
        "model": "policy", "messages": [{"role": "user", "content": "r:4071>"}], "max_tokens": 8}, SERVE_TOKEN)
    receipt = headers["x-rollwire-response-id"]
    assert answer["id"] == receipt and answer["choices"][0]["message"]["content"] is not None
    stored, _ = stack.post("FEEDBACK", "/v1/feedback", {"feedback_id": "stack-fb-1", "kind": "rating", "rating": 1,
                                                        "response_id": receipt}, FEEDBACK_TOKEN)
    assert stored["status"] == "stored"
    _wait_for("the joined production sample on `scored`", lambda: any(
        (e["event"].get("production") or {}).get("feedback_id") == "stack-fb-1" for e in stack.events("scored")),
        stack, 120)

    # every role still runs (the trainer exited 0 after its last step), none restarted but the one killed
    for role in ROLES:
        state = stack.inspect(role)["State"]
        if role == "trainer":
            continue
        assert state["Running"], f"{role} is not running: {state}"
    assert stack.inspect("trainer")["State"]["ExitCode"] in (0, None) or stack.inspect("trainer")["State"]["Running"]
