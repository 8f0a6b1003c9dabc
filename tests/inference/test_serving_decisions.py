"""Production serves what was decided: a serving replica on the session's real vLLM server follows
`rollwire promote` and `rollwire rollback` (an older version swapped back in, nothing restarted),
and `rollwire serve --fleet` routes each request by the decisions; the recorded responses say which
version answered, with the logprobs of that version's weights."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from builders import listening
from reference import transformers_logprobs

from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
from rollwire.core.bus import EmbeddedBusSettings, HeldDeadLetters, catalog_topics, open_log, read_to_end
from rollwire.core.objectstore import LocalStore
from rollwire.core.weight_versions import publish, version_prefix
from rollwire.producers.releases import history, promote
from rollwire.schemas import ResponseServed, Topics

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def ask(url: str) -> str:
    """One greedy chat request through the gateway; its receipt."""
    import httpx
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": "policy", "messages": [{"role": "user", "content": "r:4071>"}], "max_tokens": 6, "temperature": 0})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-rollwire-response-id"]


def recorded(log, topics: Topics, receipt: str, timeout_s: float = 20) -> ResponseServed:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = {d.event.response_id: d.event for d in read_to_end(log, [topics.served], HeldDeadLetters())}
        if receipt in found:
            return found[receipt]
        time.sleep(0.2)
    raise AssertionError(f"response {receipt} was never recorded")


def test_a_rollback_swaps_an_older_version_back_in_and_the_gateway_serves_it(vllm_server, tiny_models, tmp_path,
                                                                             version_base):
    prefix = f"sd{version_base}"
    topics = Topics(prefix)
    store = LocalStore(tmp_path / "store")
    old, new = version_base + 1, version_base + 2
    weights = {old: tiny_models.version(seed=31), new: tiny_models.version(seed=32)}
    for version, folder in weights.items():
        publish(store, folder, version_prefix("policy", version), policy="policy", version=version, step=version,
                base_model="tiny")
    common = ["--log-dir", str(tmp_path / "log"), "--prefix", prefix]
    with open_log(EmbeddedBusSettings(path=tmp_path / "log")) as log:
        log.create_topics(catalog_topics(topics))
        replica = WeightSubscriber(log, topics, store, vllm_server.control, WeightSubscriberSettings(
            replica_id="serving-0", cache_dir=tmp_path / "cache", follow="serving", url=vllm_server.base_url,
            heartbeat_s=1.0), base_model_dir=tiny_models.base)
        promote(log, topics, store, policy="policy", version=old)
        promote(log, topics, store, policy="policy", version=new)
        assert replica.catch_up().serving_version == new  # the latest decision, on start
        with listening([sys.executable, "-m", "rollwire", "serve", "--fleet", "--port", "0", *common]) as url:
            first = recorded(log, topics, ask(url))
            assert [s.version for s in first.call.weight_versions] == [new]

            refused = subprocess.run([sys.executable, "-m", "rollwire", "rollback", str(new + 5), *common,
                                      "--store-dir", str(tmp_path / "store")], capture_output=True, text=True)
            assert refused.returncode == 2 and "was never stable" in refused.stderr and "--force" in refused.stderr
            done = subprocess.run([sys.executable, "-m", "rollwire", "rollback", str(old), "--note", "v2 repeats",
                                   *common, "--store-dir", str(tmp_path / "store")], capture_output=True, text=True,
                                  env={**os.environ})
            assert done.returncode == 0, done.stderr
            assert f"rollback: v{old} serves every request" in done.stdout
            (status,) = replica.poll(timeout_s=10)  # the decision reaches the replica: swapped back, no restart
            assert (status.state, status.serving_version, status.requested_version) == ("serving", old, old)
            replica.heartbeat()
            time.sleep(1.5)  # the gateway's fleet view hears the replica's new version
            after = recorded(log, topics, ask(url))
        assert [s.version for s in after.call.weight_versions] == [old]
        assert after.call.completion_logprobs == pytest.approx(transformers_logprobs(
            weights[old], after.call.prompt_token_ids, after.call.completion_token_ids), abs=1e-3)
        decisions = history(log, topics, "policy")
        assert [(d.reason, d.stable.version, d.note) for d in decisions] == [
            ("promote", old, ""), ("promote", new, ""), ("rollback", old, "v2 repeats")]
        replica.close()
