"""`rollwire inference` supervises its vLLM server: a killed server comes back serving the version
it had, and every step is reported on the fleet topic."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from reference import transformers_logprobs

from rollwire.consumers.vllm_control import VllmControl
from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.core.objectstore import LocalStore
from rollwire.core.weight_versions import publish
from rollwire.schemas import Codec, Topics, WeightsPublished

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_crashed_server_is_restarted_with_the_version_it_served(tiny_models, tmp_path):
    port, topics = free_port(), Topics("replica")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    store = LocalStore(tmp_path / "store")
    weights = tiny_models.version(seed=31)
    published = publish(store, weights, "run/v1", policy="policy", version=1, step=1)
    producer = EventProducer(log.producer(), topics, name="trainer")
    producer.send(topics.weights, WeightsPublished(version=1, step=1, uri=published.uri,
                                                   manifest_sha256=published.manifest_sha256), key="policy")
    producer.flush()
    replica = subprocess.Popen(
        [sys.executable, "-m", "rollwire.cli", "inference", "--model", str(tiny_models.base), "--port", str(port),
         "--dtype", "float32", "--max-model-len", "512", "--log-dir", str(tmp_path / "log"), "--prefix", "replica",
         "--store-dir", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache"),
         "--vllm-log", str(tmp_path / "vllm.log")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def states():
        with log.reader([topics.fleet]) as reader:
            return [(e.state, e.serving_version, e.reason) if e.requested_version is not None or e.state != "serving"
                    else ("heartbeat", e.serving_version, e.url)
                    for e in (Codec().decode(r.value).event for r in reader.poll_batch(1000, 0.5))]

    def wait_for(condition, what, timeout_s=240):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition(states()):
                return
            if replica.poll() is not None:
                pytest.fail(f"the replica exited ({replica.returncode}): {replica.stdout.read()[-3000:]!r}")
            time.sleep(1)
        pytest.fail(f"timed out waiting for {what}: {states()}")

    try:
        wait_for(lambda s: ("serving", 1, None) in s, "version 1 to serve")
        server = next(p for p in psutil.Process(replica.pid).children() if "vllm" in " ".join(p.cmdline()))
        os.killpg(os.getpgid(server.pid), signal.SIGKILL)
        wait_for(lambda s: s.count(("serving", 1, None)) == 2, "the restarted server to serve version 1 again")

        restart = [r for st, _, r in states() if st == "failed"]
        assert len(restart) == 1 and "restarting it" in restart[0]
        choice = VllmControl(f"http://127.0.0.1:{port}").generate([1, 47, 26, 20], max_tokens=5, seed=2)["choices"][0]
        assert choice["weight_versions"][0]["version"] == "1"
        assert [c["logprob"] for c in choice["logprobs"]["content"]] == pytest.approx(
            transformers_logprobs(weights, [1, 47, 26, 20], choice["token_ids"]), abs=1e-3)
    finally:
        replica.send_signal(signal.SIGTERM)
        replica.wait(timeout=60)
    assert states()[0][0] == "starting" and states()[-1][0] == "stopped"
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(port) in " ".join(p.info["cmdline"] or [])]
