"""Production feedback through a whole `rollwire run`: a simulated production app chats through the
run's serving gateway with the real `openai` client, posts a rating, a correction and a preference
on the receipts it got, and the trainer trains them beside the environment's rollouts: each by its
own objective, each traced from the feedback's POST to the trainer step, linked to the response's
request. The run holds known secrets (bearer tokens; on Kafka, the S3 store's keys), and none of
them reaches any of its outputs. Its policy is a tied Qwen2 (trained full weight), and garbage lands
on every topic the roles read while it runs: each record is dead-lettered and the run goes on."""

from __future__ import annotations

import json
import secrets as secrets_module
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from user_runs import TIED_QWEN2, finish, metrics_rows, processes_of, served_logprob_gaps, short_recipe, start_run

from rollwire.core.bus import Beginning, EmbeddedBusSettings, KafkaBusSettings, open_log
from rollwire.schemas import Codec, Topics

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

FEEDBACK = """
[feedback]
enabled = true
[feedback.gateway]
port = 0
[feedback.ingest]
port = 0

[trainer.feedback]
share = 0.25
"""

S3 = """
[store]
type = "s3"
endpoint = "{endpoint}"
bucket = "{bucket}"
region = "us-east-1"
"""


GARBAGE_ON = ("tasks", "rollouts", "scorer-ticks", "scored", "weights", "fleet", "train", "drops", "served", "feedback")
"""The topics the run's roles read, each given one record that is no event, on every partition
(`scorer-ticks` is read by the faust scorer only: on Kafka)."""
GARBAGE = b"\xc1 not an event"


def _throw_garbage(bus, name: str) -> None:
    with open_log(bus) as log, log.producer() as producer:  # on every partition: a reader that stops early still meets one
        for short in GARBAGE_ON:
            for partition in range(log.partitions(f"{name}.{short}")):
                producer.send(f"{name}.{short}", GARBAGE, key=b"garbage", partition=partition)
        producer.flush()


def _recipe_json(run_dir: Path, process, timeout_s: float = 300) -> dict:
    """The resolved recipe, once the run wrote it (the gateway's and the API's ports are chosen then)."""
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "recipe.json").exists():
        assert process.poll() is None and time.monotonic() < deadline, "rollwire run wrote no recipe.json"
        time.sleep(0.5)
    return json.loads((run_dir / "recipe.json").read_text())


def _wait_healthy(url: str, process, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, "rollwire run exited before its gateway answered"
        assert time.monotonic() < deadline, f"{url} did not answer within {timeout_s} s"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)


def _events(run: dict, topic: str) -> list:
    """Every event on the run's `topic` (its short name)."""
    bus = run["bus"] or EmbeddedBusSettings(path=run["run_dir"] / "log")
    with open_log(bus) as log, log.reader([f"{run['name']}.{topic}"], Beginning()) as reader:
        out = []
        while batch := reader.poll_batch(1000, 1.0):
            out += [Codec().decode(r.value).event for r in batch if r.value and r.value != GARBAGE]
        return out


@pytest.fixture(scope="module", params=[pytest.param("kafka", marks=pytest.mark.kafka)])
def feedback_run(request, tmp_path_factory) -> dict:
    """One run with production feedback, on Kafka (the joiner the faust worker, the weights in S3).
    The embedded log's run is not repeated here, to keep CI in its budget: the embedded joiner is
    tested killed and restarted (`tests/integration/test_feedback_joiner.py`), and the embedded
    run's loop by the demo and `test_run.py`. `params` keeps the mode in the test's id; add
    "embedded" to run both."""
    from openai import OpenAI
    folder = tmp_path_factory.mktemp("feedback-run")
    name = f"prod{uuid.uuid4().hex[:8]}"
    run_dir = folder / name
    recipe = folder / "prod.toml"
    recipe.write_text(short_recipe(name, 60, tiny=TIED_QWEN2) + FEEDBACK)  # stopped once the feedback is trained
    secrets = {"ROLLWIRE_SERVE_TOKENS": f"shop=serve-{secrets_module.token_urlsafe(24)}",
               "ROLLWIRE_FEEDBACK_TOKENS": f"shop=feedback-{secrets_module.token_urlsafe(24)}"}
    bus, bus_args = None, []
    if request.param == "kafka":  # and the weights in an S3 store, its keys known secrets too
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        bus, bus_args = KafkaBusSettings(bootstrap_servers=bootstrap), ["--bus", "kafka", "--bootstrap", bootstrap]
        secrets |= {"AWS_ACCESS_KEY_ID": f"AKIA{secrets_module.token_hex(8).upper()}",
                    "AWS_SECRET_ACCESS_KEY": secrets_module.token_urlsafe(30)}
        recipe.write_text(recipe.read_text() + S3.format(endpoint=request.getfixturevalue("s3_endpoint"), bucket=name))
    serve_token, feedback_token = (secrets[v].split("=", 1)[1] for v in ("ROLLWIRE_SERVE_TOKENS", "ROLLWIRE_FEEDBACK_TOKENS"))
    process = start_run(str(recipe), "--run-dir", str(run_dir), *bus_args, env=secrets)
    try:
        resolved = _recipe_json(run_dir, process)
        gateway, ingest = resolved["feedback"]["gateway"], resolved["feedback"]["ingest"]
        _wait_healthy(f"http://127.0.0.1:{gateway['port']}/healthz", process)
        _wait_healthy(f"http://127.0.0.1:{ingest['port']}/healthz", process)
        # the feedback is trained after this lands: later steps read past it on every partition
        _throw_garbage(bus or EmbeddedBusSettings(path=run_dir / "log"), name)
        client = OpenAI(base_url=f"http://127.0.0.1:{gateway['port']}/v1", api_key=serve_token)
        conversation = [{"role": "user", "content": "R:4821>"}]
        receipts = []
        for i in range(4):  # 0: rated, 1 and 2: compared (one prompt), 3: corrected
            raw = client.chat.completions.with_raw_response.create(
                model=gateway["model"], messages=conversation, max_tokens=8, temperature=1.0,
                extra_headers={"x-rollwire-conversation-id": f"conv-{i}"})
            response = raw.parse()
            assert raw.headers["x-rollwire-response-id"] == response.id
            receipts.append(response.id)
        items = [
            {"feedback_id": "fb-rating", "source": "shop", "kind": "rating", "rating": 1.0, "response_id": receipts[0]},
            {"feedback_id": "fb-preference", "source": "shop", "kind": "preference", "preferred_index": 1,
             "response_ids": [receipts[1], receipts[2]]},
            {"feedback_id": "fb-correction", "source": "shop", "kind": "correction", "correction": "1284",
             "response_id": receipts[3]},
        ]
        posted = httpx.post(f"http://127.0.0.1:{ingest['port']}/v1/feedback/batch", json=items, timeout=30,
                            headers={"Authorization": f"Bearer {feedback_token}"})
        assert posted.status_code == 200, posted.text
        so_far = {"run_dir": run_dir, "name": name, "bus": bus}
        deadline = time.monotonic() + 600
        while not {i["feedback_id"] for i in items} <= {r for s in _events(so_far, "train") for r in s.rollout_ids}:
            assert process.poll() is None and time.monotonic() < deadline, "the feedback was not trained"
            time.sleep(2)
        process.send_signal(signal.SIGINT)  # Ctrl-C: the run stops cleanly after the feedback is trained
        output = finish(process, 300)
    finally:
        if process.poll() is None:
            finish(process, 5)
    (folder / "run.out").write_text(output)
    return {"run_dir": run_dir, "name": name, "bus": bus, "code": process.returncode, "output": output,
            "leftovers": processes_of(run_dir),
            "receipts": receipts, "posted": posted.json(), "secrets": secrets,
            "s3": request.getfixturevalue("s3_endpoint") if request.param == "kafka" else None}


def test_feedback_from_the_gateways_receipts_is_trained_by_its_own_objective(feedback_run):
    run_dir = feedback_run["run_dir"]
    assert feedback_run["code"] == 130 and "interrupted at step" in feedback_run["output"], feedback_run["output"][-3000:]
    assert "production: OpenAI API at http://127.0.0.1:" in feedback_run["output"]
    assert [r["status"] for r in feedback_run["posted"]["results"]] == ["stored"] * 3
    served = {e.response_id: e for e in _events(feedback_run, "served")}
    assert set(feedback_run["receipts"]) <= set(served)  # every response recorded behind its receipt
    steps = _events(feedback_run, "train")
    trained = {rid: step for step in steps for rid in step.rollout_ids}
    assert {"fb-rating", "fb-preference", "fb-correction"} <= set(trained), [s.samples for s in steps]
    assert all(step.samples.get("production", 0) <= 4 for step in steps)  # a quarter of 16, at most
    assert all(sum(v for k, v in step.samples.items() if k != "production") == 16 for step in steps)
    assert trained["fb-correction"].samples["sft"] >= 1 and trained["fb-preference"].samples["preference"] >= 1
    assert "dpo_margin" in trained["fb-preference"].loss_metrics and "sft_nll" in trained["fb-correction"].loss_metrics
    samples = {e.rollout.rollout_id: e for e in _events(feedback_run, "scored") if e.production is not None}
    rating = samples["fb-rating"]
    assert rating.rollout.completion_token_ids == served[feedback_run["receipts"][0]].call.completion_token_ids
    assert rating.rollout.completion_logprobs == served[feedback_run["receipts"][0]].call.completion_logprobs
    pair = samples["fb-preference"]
    assert (pair.rollout.task_id, pair.rejected.task_id) == (feedback_run["receipts"][2], feedback_run["receipts"][1])
    rows = metrics_rows(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, len(steps) + 1))


def test_garbage_on_every_topic_is_dead_lettered_and_the_run_goes_on(feedback_run):
    letters = [e for e in _events(feedback_run, "deadletter") if e.raw == GARBAGE]
    read = [t for t in GARBAGE_ON if feedback_run["bus"] is not None or t != "scorer-ticks"]  # faust's ticks
    assert {e.source_topic for e in letters} == {f"{feedback_run['name']}.{t}" for t in read}
    steps = _events(feedback_run, "train")
    assert [s.step for s in steps] == list(range(1, len(steps) + 1)) and len(steps) >= 3
    published = [e.version for e in _events(feedback_run, "weights") if e.type == "weights.published"]
    assert published[:len(steps)] == list(range(1, len(steps) + 1))
    assert feedback_run["leftovers"] == []  # Ctrl-C stopped every component
    if feedback_run["bus"] is not None:
        assert not (feedback_run["run_dir"] / "log").exists()  # on Kafka nothing went to the embedded log


def test_the_tied_models_replica_served_each_versions_own_weights(feedback_run):
    """The reload kept the output layer tied: what the replica sampled on version v is what v's
    weights give. The Kafka run's weights are in S3: there, every version is in the store."""
    if feedback_run["bus"] is not None:
        from rollwire.core.objectstore import S3Store
        keys = feedback_run["secrets"]
        store = S3Store(feedback_run["s3"], feedback_run["name"], access_key=keys["AWS_ACCESS_KEY_ID"],
                        secret_key=keys["AWS_SECRET_ACCESS_KEY"], secure=False, region="us-east-1")
        assert sum(key.endswith("manifest.json") for key in store.list("policy/")) >= 3
        return
    with open_log(EmbeddedBusSettings(path=feedback_run["run_dir"] / "log")) as log:
        gaps = served_logprob_gaps(log, f"{feedback_run['name']}.rollouts", feedback_run["run_dir"] / "weights")
    assert len(gaps) >= 3 and max(gaps.values()) < 1e-3, gaps


def test_a_feedback_item_is_traced_from_its_post_to_the_trainer_step_and_linked_to_the_served_request(feedback_run):
    spans = [json.loads(line) for line in (feedback_run["run_dir"] / "spans.jsonl").read_text().splitlines()]
    by_id = {s["span_id"]: s for s in spans}
    ingest = next(s for s in spans if s["name"] == "ingest feedback"
                  and s["attributes"]["rollwire.feedback_id"] == "fb-rating")
    assert ingest["service"] == "rollwire-feedback-api"
    join = next(s for s in spans if s["name"] == "join feedback" and s["attributes"]["rollwire.feedback_id"] == "fb-rating")
    assert join["trace_id"] == ingest["trace_id"] and join["service"] == "rollwire-joiner"
    served = {e.response_id: e for e in _events(feedback_run, "served")}
    request_trace = served[feedback_run["receipts"][0]].traceparent.split("-")[1]
    assert [link["trace_id"] for link in join["links"]] == [request_trace]  # the gateway's request
    assert any(s["trace_id"] == request_trace and s["service"] == "rollwire-gateway" for s in spans)
    send = next(s for s in spans if s["name"] == f"send {feedback_run['name']}.scored"
                and s["parent_span_id"] == join["span_id"])
    step = next(s for s in spans if s["name"] == "trainer step"
                and any(link["span_id"] == send["span_id"] for link in s["links"]))
    assert step["service"] == "rollwire-trainer" and by_id[send["span_id"]]["trace_id"] == ingest["trace_id"]


def test_no_secret_reaches_any_output_of_the_run(feedback_run):
    """Every file the run wrote (recipe.json, logs, spans, metrics, checkpoints), its console output
    and every record of every topic are searched for each secret the run was given."""
    secrets = [v.split("=", 1)[-1].encode() for v in feedback_run["secrets"].values()]
    assert len(secrets) == (4 if feedback_run["s3"] else 2)
    searched, leaks = 0, []
    for path in (p for p in feedback_run["run_dir"].rglob("*") if p.is_file()):
        data = path.read_bytes()
        searched += len(data)
        leaks += [f"{path}" for s in secrets if s in data]
    leaks += ["console output" for s in secrets if s in feedback_run["output"].encode()]
    bus = feedback_run["bus"] or EmbeddedBusSettings(path=feedback_run["run_dir"] / "log")
    with open_log(bus) as log:
        topics = [t for t, _ in Topics(feedback_run["name"]).specs()]
        with log.reader(topics, Beginning()) as reader:
            records = 0
            while batch := reader.poll_batch(1000, 1.0):
                for r in batch:
                    blob = (r.key or b"") + (r.value or b"") + b"".join(v for _, v in r.headers)
                    records += 1
                    leaks += [f"{r.topic}@{r.offset}" for s in secrets if s in blob]
    assert leaks == []
    assert records > 500 and searched > 1_000_000  # the search read a whole run
    if feedback_run["s3"]:  # the weights went to the S3 store, with the keys from the environment
        from rollwire.core.objectstore import S3Store
        keys = feedback_run["secrets"]
        store = S3Store(feedback_run["s3"], feedback_run["name"], access_key=keys["AWS_ACCESS_KEY_ID"],
                        secret_key=keys["AWS_SECRET_ACCESS_KEY"], secure=False, region="us-east-1")
        published = sum(key.endswith("manifest.json") for key in store.list("policy/"))
        steps = len(_events(feedback_run, "train"))  # a version is in the store before its step's event is sent
        assert steps <= published <= steps + 1
