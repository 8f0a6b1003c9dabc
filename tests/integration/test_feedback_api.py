"""The feedback ingestion API as apps meet it: `rollwire feedback serve` in its own process, real
HTTP clients (httpx, curl), the embedded log and a real Kafka broker. Acknowledged means on the
log; a resend is harmless; tokens bind sources; bad input gets the status and the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
from builders import listening

from rollwire.core.bus import HeldDeadLetters, read_to_end
from rollwire.schemas import FeedbackReceived, Topics

TOKEN_A, TOKEN_B = "a" * 24, "b" * 24
TOKENS = f"chat-app={TOKEN_A},search-app={TOKEN_B}"


def bus_args(bus_settings) -> list[str]:
    if bus_settings.type == "kafka":
        return ["--bus", "kafka", "--bootstrap", bus_settings.bootstrap_servers]
    return ["--log-dir", str(bus_settings.path)]


def feedback_server(bus_settings, prefix: str, *extra: str, tokens: str | None = TOKENS):
    env = {k: v for k, v in os.environ.items() if k != "ROLLWIRE_FEEDBACK_TOKENS"}
    if tokens:
        env["ROLLWIRE_FEEDBACK_TOKENS"] = tokens
    return listening([sys.executable, "-m", "rollwire", "feedback", "serve", "--port", "0", "--prefix", prefix,
                      *bus_args(bus_settings), *extra], env=env)


def stored(log, topics: Topics) -> list[FeedbackReceived]:
    return [d.event for d in read_to_end(log, [topics.feedback], HeldDeadLetters())]


def rating(feedback_id: str, value: float = 0.5, **extra) -> dict:
    return {"feedback_id": feedback_id, "kind": "rating", "rating": value, "response_id": f"resp-{feedback_id}", **extra}


def test_feedback_is_on_the_log_when_acknowledged_and_a_resend_stores_nothing(bus_settings, log, topics):
    auth = {"Authorization": f"Bearer {TOKEN_A}"}
    with feedback_server(bus_settings, topics.prefix) as url, httpx.Client(base_url=url, headers=auth) as http:
        first = http.post("/v1/feedback", json=rating("fb-1"))
        assert first.status_code == 200 and first.json() == {"feedback_id": "fb-1", "status": "stored"}
        assert [e.feedback_id for e in stored(log, topics)] == ["fb-1"]  # on the log once answered
        again = http.post("/v1/feedback", json=rating("fb-1", value=-1.0))
        assert again.status_code == 200 and again.json() == {"feedback_id": "fb-1", "status": "duplicate"}

        items = [rating("fb-2"), {"kind": "rating", "rating": 7, "response_id": "r"}, rating("fb-1"),
                 {"feedback_id": "fb-3", "kind": "correction", "correction": "21",
                  "messages": [{"role": "user", "content": "R:12>"}]},
                 {"feedback_id": "fb-4", "kind": "preference", "preferred_index": 1, "response_ids": ["x", "y"]}]
        batch = http.post("/v1/feedback/batch", json=items)
        assert batch.status_code == 200
        results = batch.json()["results"]
        assert [(r["index"], r["status"]) for r in results] == [
            (0, "stored"), (1, "invalid"), (2, "duplicate"), (3, "stored"), (4, "stored")]
        assert results[1]["errors"][0]["loc"] == "" and "rating 7.0 must lie in [-1, 1]" in results[1]["errors"][0]["msg"]
        ndjson = "\n".join(json.dumps(rating(f"fb-n{i}")) for i in range(3)) + "\n"
        lines = http.post("/v1/feedback/batch", content=ndjson, headers={"Content-Type": "application/x-ndjson"})
        assert batch.json()["counts"]["stored"] == 3 and lines.json()["counts"] == {
            "stored": 3, "duplicate": 0, "invalid": 0, "forbidden": 0, "retry": 0}
        if shutil.which("curl"):
            curl = subprocess.run(["curl", "-s", "-X", "POST", f"{url}/v1/feedback",
                                   "-H", f"Authorization: Bearer {TOKEN_A}", "-H", "Content-Type: application/json",
                                   "-d", json.dumps(rating("fb-curl"))], capture_output=True, text=True, timeout=30)
            assert json.loads(curl.stdout) == {"feedback_id": "fb-curl", "status": "stored"}

    # A restarted server remembers every id from the log itself.
    with feedback_server(bus_settings, topics.prefix) as url:
        resent = httpx.post(f"{url}/v1/feedback", json=rating("fb-2"), headers=auth)
        assert resent.json() == {"feedback_id": "fb-2", "status": "duplicate"}
    events = stored(log, topics)
    ids = [e.feedback_id for e in events]
    assert sorted(ids) == sorted(set(ids)) == sorted(["fb-1", "fb-2", "fb-3", "fb-4", "fb-n0", "fb-n1", "fb-n2"]
                                                      + (["fb-curl"] if shutil.which("curl") else []))
    assert {e.source for e in events} == {"chat-app"}  # from the token
    assert next(e for e in events if e.feedback_id == "fb-4").response_ids == ["x", "y"]


def test_tokens_bind_sources_and_bad_requests_get_their_status_and_reason(tmp_path):
    from rollwire.core.bus import EmbeddedBusSettings
    settings = EmbeddedBusSettings(path=tmp_path / "log")
    with feedback_server(settings, "fb") as url, httpx.Client(base_url=url) as http:
        a = {"Authorization": f"Bearer {TOKEN_A}"}
        missing = http.post("/v1/feedback", json=rating("x"))
        assert missing.status_code == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert http.post("/v1/feedback", json=rating("x"), headers={"Authorization": "Bearer " + "c" * 24}
                         ).status_code == 401
        other = http.post("/v1/feedback", json=rating("x", source="search-app"), headers=a)
        assert other.status_code == 403 and "chat-app" in other.json()["error"]
        assert http.post("/v1/feedback", json=rating("x", source="search-app"),
                         headers={"Authorization": f"Bearer {TOKEN_B}"}).status_code == 200
        assert http.post("/v1/feedback", content=b"{not json", headers=a).status_code == 400
        invalid = http.post("/v1/feedback", json={"feedback_id": "y", "kind": "rating", "rating": "high",
                                                  "response_id": "r"}, headers=a)
        assert invalid.status_code == 422 and invalid.json()["errors"][0]["loc"] == "rating"
        server_set = http.post("/v1/feedback", json=rating("z", received_at_ms=1), headers=a)
        assert server_set.status_code == 422 and server_set.json()["errors"] == [
            {"loc": "received_at_ms", "msg": "set by the server; leave it out"}]
        nothing_judged = http.post("/v1/feedback", json={"kind": "rating", "rating": 1}, headers=a)
        assert nothing_judged.status_code == 422 and "response_id (a receipt)" in nothing_judged.text
        huge = http.post("/v1/feedback", content=b"x" * (5 * 1024 * 1024), headers=a)
        assert huge.status_code == 413
        many = http.post("/v1/feedback/batch", json=[rating(f"m{i}") for i in range(1001)], headers=a)
        assert many.status_code == 413 and "limit is 1000" in many.json()["error"]
        assert http.get("/healthz").json()["status"] == "ok"
        assert http.post("/v1/feedback", json=rating("after"), headers=a).status_code == 200  # still serving


def test_listening_beyond_loopback_without_tokens_is_refused(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rollwire", "feedback", "serve", "--host", "0.0.0.0",
                           "--log-dir", str(tmp_path / "log")], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "ROLLWIRE_FEEDBACK_TOKENS"})
    assert done.returncode == 2 and "refusing to listen on 0.0.0.0 without bearer tokens" in done.stderr
    assert "could use training data" in done.stderr


def test_an_import_stores_each_line_once_even_when_run_again(tmp_path):
    from rollwire.core.bus import EmbeddedBusSettings, open_log
    path = tmp_path / "ratings.jsonl"
    lines = [json.dumps({"kind": "rating", "rating": i / 10, "response_id": f"resp-{i}"}) for i in range(7)]
    lines += ["{broken", json.dumps({"kind": "rating", "rating": 3, "response_id": "r"}), ""]
    path.write_text("\n".join(lines) + "\n")
    command = [sys.executable, "-m", "rollwire", "feedback", "import", str(path), "--source", "batch-app",
               "--log-dir", str(tmp_path / "log"), "--prefix", "imp"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert first.returncode == 1  # some lines were rejected
    assert json.loads(first.stdout.strip().splitlines()[-1]) == {"file": str(path), "stored": 7, "duplicate": 0,
                                                                "invalid": 2}
    assert f"{path}:8: item: not JSON" in first.stdout and f"{path}:9:" in first.stdout
    rejected = [json.loads(r) for r in (tmp_path / "ratings.jsonl.rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejected] == [8, 9]
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert json.loads(again.stdout.strip().splitlines()[-1])["duplicate"] == 7
    with open_log(EmbeddedBusSettings(path=tmp_path / "log")) as log:
        events = stored(log, Topics("imp"))
    assert len(events) == 7 and {e.source for e in events} == {"batch-app"}
    assert len({e.feedback_id for e in events}) == 7 and all(e.feedback_id.startswith("import-") for e in events)
