"""`rollwire run` end to end: real processes, real vLLM servers, the embedded log. (On Kafka, a
run is the feedback run of `test_feedback_run.py` and the chaos run of `test_chaos.py`.)

A short recipe (a tiny Qwen3 with tied embeddings and a BPE tokenizer; two inference replicas, two
env workers, a trainer of two torchrun ranks) is run as
a user would run it (`rollwire run RECIPE`, a subprocess): interrupted
with Ctrl-C (SIGINT) after two steps, with one component `kill -9`ed on the way, then started
again to finish. The module's tests then check what that run left: resume, metrics, curve, and
one rollout's trace from the env worker through scoring to the trainer step and the reload that
served the next version. The bundled demo is `test_demo.py`'s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from user_runs import TIED_QWEN3, finish, metrics_rows, processes_of, recipe_file, served_logprob_gaps, start_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]  # whole runs, each its own vLLM


def _wait_for_steps(process: subprocess.Popen, metrics: Path, steps: int, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while len(metrics_rows(metrics)) < steps:
        assert process.poll() is None, f"rollwire run exited early:\n{process.stdout.read()}"
        assert time.monotonic() < deadline, f"no {steps} steps within {timeout_s} s"
        time.sleep(1.0)


def _role_process(parent: subprocess.Popen, role: str, missing_ok: bool = False) -> psutil.Process | None:
    for child in psutil.Process(parent.pid).children(recursive=True):
        try:
            if "rollwire.run.roles" in child.cmdline() and role in child.cmdline() and child.is_running():
                return child
        except psutil.NoSuchProcess:
            continue
    assert missing_ok, f"no {role} process under rollwire run"
    return None


USER_ENVIRONMENT = "adder-from-a-package"
"""An environment a user wrote as a package of their own (`rollwire env init`), which the run trains
beside the bundled reverse-digits."""


def _install_user_environment(folder: Path) -> dict[str, str]:
    """`rollwire env init`'s package, built and installed as a user would (pip), into a folder of its
    own on PYTHONPATH rather than into the shared test environment that other tests list tasksets of;
    returns the environment to run with. Checks the package's own test passes."""
    package, site = folder / USER_ENVIRONMENT, folder / "site-packages"
    subprocess.run([sys.executable, "-m", "rollwire", "env", "init", USER_ENVIRONMENT, "--dir", str(package)],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--target",
                    str(site), str(package)], check=True, capture_output=True)
    env = {"PYTHONPATH": str(site)}
    own_test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package / "tests")],
                              capture_output=True, text=True, cwd=package, env={**os.environ, **env})
    assert own_test.returncode == 0, own_test.stdout[-2000:]
    return env


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory) -> dict:
    """Runs 8 steps in two parts: SIGINT after step 3 (the scorer `kill -9`ed before), then a resume;
    two inference replicas and two env workers, routed by version, and a trainer of two ranks that
    sends each version to the replicas directly (gloo) as well as to the store. The
    run trains reverse-digits and an environment from a package a user made with `rollwire env init`."""
    folder = tmp_path_factory.mktemp("run")
    run_dir, metrics = folder / "short", folder / "short" / "metrics.jsonl"
    env = _install_user_environment(folder)
    user_environment = f'[[environments]]\nname = "{USER_ENVIRONMENT}"\ngroup_size = 4\noptions = {{ largest = 9 }}\n' \
                       'sampling = { temperature = 1.0, max_tokens = 4 }\n'
    recipe = recipe_file(folder, "short", steps=8, replicas=2, env_workers=2, trainer_processes=2, tiny=TIED_QWEN3,
                         environments=user_environment, direct=True)
    first = start_run(str(recipe), "--run-dir", str(run_dir), env=env)
    _wait_for_steps(first, metrics, 1)
    killed = _role_process(first, "scorer")
    killed.kill()  # the supervisor restarts it; its open groups come back from the scorer-state topic
    deadline = time.monotonic() + 60
    while _role_process(first, "scorer", missing_ok=True) in (None, killed):
        assert time.monotonic() < deadline, "the scorer was not restarted"
        time.sleep(0.5)
    _wait_for_steps(first, metrics, 3)
    first.send_signal(signal.SIGINT)
    first_output = finish(first, 120)
    (folder / "first.out").write_text(first_output)
    leftovers = processes_of(run_dir)
    steps_at_interrupt = len(metrics_rows(metrics))
    second = start_run(str(recipe), "--run-dir", str(run_dir), env=env)
    second_output = finish(second, 600)
    (folder / "second.out").write_text(second_output)
    return {"run_dir": run_dir, "metrics": metrics, "first_code": first.returncode, "first_output": first_output,
            "leftovers": leftovers, "steps_at_interrupt": steps_at_interrupt, "second_code": second.returncode,
            "second_output": second_output}


def test_ctrl_c_stops_every_component_and_the_same_command_resumes(interrupted_run):
    run = interrupted_run
    assert run["first_code"] == 130, run["first_output"]
    assert "scorer-0 exited with code -9; restarting it" in run["first_output"]
    assert "run the same command to resume" in run["first_output"]
    assert run["leftovers"] == []  # no component and no vLLM server outlived Ctrl-C
    assert 3 <= run["steps_at_interrupt"] < 8
    assert run["second_code"] == 0, run["second_output"]
    rows = metrics_rows(run["metrics"])
    assert [r["step"] for r in rows] == list(range(1, 9))  # rebuilt from the log: each step once
    assert all(r["rollouts"] == 16 and r["staleness_max"] <= 1 for r in rows)
    assert "metric/completion_tokens" in rows[-1] and "reward/exact_match" in rows[-1]
    assert "mean reward first 10 steps" in run["second_output"]
    assert (run["run_dir"] / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_environment_from_a_users_package_is_judged_by_its_own_reward_and_trained(interrupted_run):
    from rollwire.core.bus import Beginning, EmbeddedBusSettings, open_log
    from rollwire.schemas import Codec
    scored: dict[str, dict] = {}
    trained: set[str] = set()
    with open_log(EmbeddedBusSettings(path=interrupted_run["run_dir"] / "log")) as log:
        for topic in ("short.scored", "short.train"):
            with log.reader([topic], Beginning()) as reader:
                while batch := reader.poll_batch(500, 0.5):
                    for record in batch:
                        event = Codec().decode(record.value).event
                        if topic == "short.scored":
                            scored[event.rollout.rollout_id] = event
                        else:
                            trained |= set(event.rollout_ids)
    users = [s for s in scored.values() if s.rollout.environment == USER_ENVIRONMENT]
    assert users and {s.rollout.environment for s in scored.values()} == {"reverse-digits", USER_ENVIRONMENT}
    assert all(set(s.rollout.rewards) == {"exact_match"} and "completion_tokens" in s.rollout.metrics for s in users)
    assert all(s.rollout.task_id.startswith(f"{USER_ENVIRONMENT}-") for s in users)  # its own rows
    assert {s.rollout.rollout_id for s in users} & trained  # its rollouts are in the trainer's steps


def test_calls_are_routed_over_both_replicas_and_both_end_on_the_newest_version(interrupted_run):
    from rollwire.core.bus import Beginning, EmbeddedBusSettings, open_log
    from rollwire.schemas import Codec
    spans = _spans(interrupted_run["run_dir"])
    calls = [s for s in spans if s["name"] == "inference generate"]
    routes = [(s["attributes"]["rollwire.replica"], s["attributes"]["rollwire.route"]) for s in calls]
    assert {replica for replica, _ in routes} == {"replica-0", "replica-1"}, routes[:10]
    assert {route for _, route in routes} <= {"newest", "sticky", "failover"}
    # the replica a call went to never served an older version than the one that sampled it said
    by_replica: dict[str, int] = {}
    for s in calls:
        versions = [int(v) for v in s["attributes"]["rollwire.weight_versions"].split(",") if v.isdigit()]
        assert all(v >= s["attributes"]["rollwire.replica_version"] for v in versions), s["attributes"]
        by_replica[s["attributes"]["rollwire.replica"]] = by_replica.get(s["attributes"]["rollwire.replica"], 0) + 1
    assert min(by_replica.values()) >= len(calls) // 10, by_replica  # both carry real load
    with open_log(EmbeddedBusSettings(path=interrupted_run["run_dir"] / "log")) as log, \
            log.reader(["short.fleet"], Beginning()) as reader:
        statuses = []
        while batch := reader.poll_batch(500, 0.5):
            statuses += [Codec().decode(r.value).event for r in batch]
    newest: dict[str, int] = {}
    for s in statuses:
        if s.state == "serving":
            newest[s.replica_id] = max(newest.get(s.replica_id, 0), s.serving_version or 0)
    assert newest.keys() == {"replica-0", "replica-1"} and min(newest.values()) >= 7, newest  # both follow the trainer
    direct = {s.replica_id for s in statuses if s.state == "serving" and s.transfer == "direct"}
    assert direct == {"replica-0", "replica-1"}, [(s.replica_id, s.requested_version, s.transfer) for s in statuses]
    assert all(s.url and s.url.startswith("http://127.0.0.1:") for s in statuses)


def test_both_replicas_served_each_version_of_the_tied_qwen3_with_its_own_weights(interrupted_run):
    from rollwire.core.bus import EmbeddedBusSettings, open_log
    with open_log(EmbeddedBusSettings(path=interrupted_run["run_dir"] / "log")) as log:
        gaps = served_logprob_gaps(log, "short.rollouts", interrupted_run["run_dir"] / "weights")
    assert len(gaps) >= 5 and max(gaps.values()) < 1e-3, gaps


def test_the_trainer_ran_as_two_torchrun_ranks(interrupted_run):
    log = (interrupted_run["run_dir"] / "logs" / "trainer-0.log").read_text()
    assert "trainer rank 0 of 2 (gloo)" in log and "trainer rank 1 of 2 (gloo)" in log, log[-2000:]
    assert "rank 1: " in log and "rank 0 stopped" in log  # rank 1 followed rank 0 to the end


def test_every_rollout_is_trained_at_most_once_across_the_interruption(interrupted_run):
    from rollwire.core.bus import Beginning, EmbeddedBusSettings, open_log
    from rollwire.schemas import Codec
    trained = []
    with open_log(EmbeddedBusSettings(path=interrupted_run["run_dir"] / "log")) as log, \
            log.reader(["short.train"], Beginning()) as reader:
        while batch := reader.poll_batch(100, 0.5):
            trained += [i for r in batch for i in Codec().decode(r.value).event.rollout_ids]
    assert len(trained) == 8 * 16 and len(set(trained)) == len(trained)


def test_metrics_say_lag_staleness_reloads_and_in_flight_and_tensorboard_has_every_step(interrupted_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rollwire.core.metrics import GROUP, TOPIC, read_points
    run_dir = interrupted_run["run_dir"]
    otel = run_dir / "metrics-otel.jsonl"
    lag = read_points(otel, "rollwire.consumer.lag")
    groups = {(p["attributes"][GROUP], p["attributes"][TOPIC]): p["service"] for p in lag}
    assert groups == {("short-env-worker", "short.tasks"): "rollwire-dispatcher", ("short-scorer", "short.rollouts"):
                      "rollwire-dispatcher", ("trainer", "short.scored"): "rollwire-trainer"}, groups
    assert all(p["value"] >= 0 for p in lag) and any(p["value"] > 0 for p in lag)
    # staleness: one observation per trained rollout, cumulative per process: the last export of the
    # interrupted trainer and of the resumed one add up to every step's 16 rollouts
    staleness = read_points(otel, "rollwire.rollout.staleness")
    last = {p["instance"]: p for p in staleness}
    assert len(last) == 2 and sum(p["count"] for p in last.values()) == 8 * 16, last
    assert all(sum(p["counts"][3:]) == 0 for p in staleness), "max_off_policy is 1: nothing staler is trained"
    reloads = read_points(otel, "rollwire.weights.reload.duration")
    assert {p["attributes"]["rollwire.replica_id"] for p in reloads} == {"replica-0", "replica-1"}
    assert all(p["sum"] > 0 for p in reloads if p["count"])
    in_flight = read_points(otel, "rollwire.replica.in_flight")
    assert {p["attributes"]["rollwire.replica_id"] for p in in_flight} == {"replica-0", "replica-1"}
    rollouts = read_points(otel, "rollwire.rollouts")
    assert {p["attributes"]["outcome"] for p in rollouts} >= {"completed"}
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()
    trained = {e.step for e in events.Scalars("train/reward_mean")}
    assert trained == set(range(1, 9)), sorted(trained)


def _spans(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "spans.jsonl").read_text().splitlines()]


def test_one_rollout_is_traced_from_the_env_worker_to_the_trainer_step_and_the_next_reload(interrupted_run):
    spans = _spans(interrupted_run["run_dir"])
    by_id = {s["span_id"]: s for s in spans}

    def parent(span: dict) -> dict:
        assert span["parent_span_id"] in by_id, f"{span['name']} has no recorded parent"
        return by_id[span["parent_span_id"]]

    step = next(s for s in spans if s["name"] == "trainer step" and s["attributes"]["rollwire.step"] == 7)
    assert len(step["links"]) == 16  # one link per scored rollout trained
    # the trainer step links to the record the scorer sent for one rollout ...
    scored_send = by_id[step["links"][0]["span_id"]]
    assert scored_send["name"] == "send short.scored" and scored_send["service"] == "rollwire-scorer"
    score = parent(scored_send)
    assert score["name"] == "score rollout"
    rollout_id = score["attributes"]["rollwire.rollout_id"]
    # ... which continues the rollout's own span in the env worker
    rollout = parent(score)
    assert rollout["name"] == "rollout" and rollout["service"] == "rollwire-env-worker"
    assert rollout["attributes"]["rollwire.rollout_id"] == rollout_id
    assert rollout["trace_id"] == scored_send["trace_id"] == step["links"][0]["trace_id"]
    children = [s for s in spans if s["parent_span_id"] == rollout["span_id"]]
    assert {"inference generate", "send short.rollouts"} <= {s["name"] for s in children}
    rollout_send = next(s for s in children if s["name"] == "send short.rollouts")
    assert any(s["name"] == "process short.rollouts" and s["parent_span_id"] == rollout_send["span_id"]
               and s["service"] == "rollwire-scorer" for s in spans)
    task_send = parent(rollout)  # the rollout belongs to the trace of the task the dispatcher sent
    assert task_send["name"] == "send short.tasks" and task_send["service"] == "rollwire-dispatcher"
    # the step publishes its weights, and the replica's reload of them is part of the step's trace
    published = [s for s in spans if s["parent_span_id"] == step["span_id"]]
    assert {"publish weights", "send short.weights", "send short.train"} <= {s["name"] for s in published}
    weights_send = next(s for s in published if s["name"] == "send short.weights")
    process = next(s for s in spans if s["name"] == "process short.weights"
                   and s["parent_span_id"] == weights_send["span_id"])
    assert process["service"] == "rollwire-replica" and process["trace_id"] == step["trace_id"]
    reload = next(s for s in spans if s["name"] == "reload weights" and s["parent_span_id"] == process["span_id"])
    version = reload["attributes"]["rollwire.weight_version"]
    assert version == 7
    # and that version then sampled tokens (calls waiting on the swap start before it ends)
    assert any(s["name"] == "inference generate" and str(version) in s["attributes"]["rollwire.weight_versions"].split(",")
               and s["end_ns"] > reload["end_ns"] for s in spans)
