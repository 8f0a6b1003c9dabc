"""`rollwire serve` as a production app meets it: the real `openai` client, chat and completions,
streamed and not, against the session's real vLLM server. Every response has a receipt; what is
recorded on `served` is what the model sampled, with logprobs the trainer's model agrees with."""

from __future__ import annotations

import os
import sys

import httpx
import pytest
from builders import listening
from reference import transformers_logprobs

from rollwire.core.bus import EmbeddedBusSettings, HeldDeadLetters, open_log, read_to_end
from rollwire.schemas import ResponseServed, Topics

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TOKEN = "t" * 24


def gateway(server, tmp_path, *extra: str):
    return listening([sys.executable, "-m", "rollwire", "serve", "--upstream", server.base_url, "--port", "0",
                      "--log-dir", str(tmp_path / "log"), "--prefix", "gw", *extra],
                     env={**os.environ, "ROLLWIRE_SERVE_TOKENS": f"chat-app={TOKEN}"})


def served(tmp_path) -> dict[str, ResponseServed]:
    with open_log(EmbeddedBusSettings(path=tmp_path / "log")) as log:
        return {d.event.response_id: d.event for d in read_to_end(log, [Topics("gw").served], HeldDeadLetters())}


def test_responses_carry_receipts_and_are_recorded_as_sampled(vllm_server, tiny_models, tmp_path, version_base):
    from openai import OpenAI
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    messages = [{"role": "user", "content": "r:4071>"}]
    with gateway(vllm_server, tmp_path) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=messages, max_tokens=8, temperature=0,
            extra_headers={"x-rollwire-conversation-id": "conv-1"})
        chat = raw.parse()
        receipt = raw.headers["x-rollwire-response-id"]
        assert chat.id == receipt and receipt.startswith("resp-")
        streamed = client.chat.completions.create(model="policy", messages=messages, max_tokens=8, temperature=0,
                                                  stream=True)
        pieces = [(c.id, c.choices[0].delta.content or "") for c in streamed]
        assert "".join(p for _, p in pieces) == chat.choices[0].message.content  # greedy: the same answer
        stream_receipt = pieces[0][0]
        plain = client.completions.create(model="policy", prompt="<|bos|>r:12>", max_tokens=6, temperature=0)
        plain_streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="policy", prompt="<|bos|>r:12>", max_tokens=6, temperature=0, stream=True))
        assert plain_streamed == plain.choices[0].text

        refused = httpx.post(f"{url}/v1/chat/completions", json={"model": "policy", "messages": messages})
        assert refused.status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        wrong = httpx.post(f"{url}/v1/chat/completions", json={"model": "gpt-x", "messages": messages}, headers=auth)
        assert wrong.status_code == 404 and "serves 'policy'" in wrong.json()["error"]["message"]
        too_long = httpx.post(f"{url}/v1/chat/completions", headers=auth,
                              json={"model": "policy", "messages": messages, "max_tokens": 10_000})
        assert too_long.status_code == 422 and "max_tokens" in too_long.json()["error"]["message"]
        assert httpx.get(f"{url}/healthz").json()["status"] == "ok"

    records = served(tmp_path)
    assert {receipt, stream_receipt, plain.id} <= set(records) and len(records) == 4
    first = records[receipt]
    assert (first.source, first.conversation_id, first.endpoint, first.messages) == ("chat-app", "conv-1", "chat",
                                                                                     messages)
    assert first.completion == chat.choices[0].message.content
    call = first.call
    assert [s.version for s in call.weight_versions] == [version_base]
    assert len(call.completion_logprobs) == len(call.completion_token_ids) > 0
    # What the record says the model sampled, the trainer's model scores the same way.
    assert call.completion_logprobs == pytest.approx(
        transformers_logprobs(tiny_models.base, call.prompt_token_ids, call.completion_token_ids), abs=1e-3)
    assert records[stream_receipt].call.completion_token_ids == call.completion_token_ids
    assert records[plain.id].endpoint == "completion" and records[plain.id].prompt == "<|bos|>r:12>"


def test_a_record_fraction_of_zero_still_gives_receipts_and_records_nothing(vllm_server, tmp_path):
    from openai import OpenAI
    with gateway(vllm_server, tmp_path, "--record-fraction", "0") as url:
        client = OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        answer = client.completions.create(model="policy", prompt="<|bos|>r:3>", max_tokens=3)
        assert answer.id.startswith("resp-")
    assert served(tmp_path) == {}
