"""The HTTP services under hostile requests (property-based, hypothesis): the feedback API, the
serving gateway and the per-rollout interception URL answer any body with a 4xx and its reason
(or a success for a valid item), never a 500, and keep serving; huge bodies are refused unread
and a stalled client is disconnected while others are served. In-process over a stand-in log and model server: this checks our own
request handling; tests/integration and tests/inference run them against the real services."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwire.consumers.vllm_control import VllmError
from rollwire.producers import feedback_api, gateway, interception_server
from rollwire.producers.interception_server import InterceptionServer
from rollwire.schemas import Topics

TOKEN = "f" * 24
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])

json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                           | st.text(max_size=30),
                           lambda children: st.lists(children, max_size=5)
                           | st.dictionaries(st.sampled_from(["kind", "rating", "response_id", "feedback_id", "source",
                                                              "messages", "model", "prompt", "max_tokens", "stream",
                                                              "temperature", "role", "content", "x"]),
                                             children, max_size=6), max_leaves=25)
bodies = (st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode())
          | st.builds(lambda b, n: b[:n], json_values.map(lambda v: json.dumps(v).encode()), st.integers(0, 50)))


class StandInProducer:
    def send(self, *args, **kwargs):
        pass

    def flush(self, timeout_s=30.0):
        pass

    def close(self):
        pass


class StandInLog:
    def producer(self):
        return StandInProducer()


class DownControl:
    """A model server that is down: every call fails as the real client does."""

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise VllmError("connection refused")
        return fail

    def healthy(self) -> bool:  # as VllmControl.healthy: False, not an error
        return False

    def close(self):
        pass


def post_all(app, requests: list[tuple[str, bytes, dict]]) -> list[int]:
    from aiohttp.test_utils import TestClient, TestServer

    async def run() -> list[int]:
        async with TestClient(TestServer(app)) as client:
            statuses = []
            for path, body, headers in requests:
                response = await client.post(path, data=body, headers=headers)
                if response.status >= 400:
                    assert "error" in await response.json(), "a refusal says why"
                statuses.append(response.status)
            health = await client.get("/healthz")
            statuses.append(health.status)
            return statuses
    return asyncio.run(run())


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["/v1/feedback", "/v1/feedback/batch"]), bodies,
                          st.sampled_from(["", f"Bearer {TOKEN}", "Bearer nope", "Basic x"])), min_size=1, max_size=4))
def test_the_feedback_api_answers_any_request_with_a_status_and_a_reason(requests):
    ingest = feedback_api.Ingest(StandInLog(), Topics("fz"), feedback_api.FeedbackApiSettings(max_body_bytes=2048))
    app = feedback_api.build_app(ingest, {TOKEN: "app"})
    statuses = post_all(app, [(p, b, {"Authorization": a} if a else {}) for p, b, a in requests])
    assert all(s in (200, 400, 401, 403, 413, 422) for s in statuses[:-1]), statuses
    assert statuses[-1] == 200  # still serving


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["/v1/chat/completions", "/v1/completions"]), bodies), min_size=1,
                max_size=4))
def test_the_gateway_answers_any_request_with_a_status_and_a_reason(requests):
    served = gateway.Gateway(StandInLog(), Topics("fz"), gateway.GatewaySettings(), control=DownControl())
    app = gateway.build_app(served, {TOKEN: "app"})
    try:
        statuses = post_all(app, [(p, b, {"Authorization": f"Bearer {TOKEN}"}) for p, b in requests])
    finally:
        served.recorder.close()
    # 502: a valid request reached the (down) model server; everything else is refused first.
    assert all(s in (400, 404, 413, 422, 502) for s in statuses[:-1]), statuses
    assert statuses[-1] == 503  # /healthz says the upstream is down, and the gateway still answers


class EchoInterceptor:
    """The model behind an interception URL: answers with the prompt's length."""

    finish_reason = "stop"
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    """What the interception server reports for each call."""
    tool_call_format = "hermes"

    def _reply(self, text: str) -> str:
        return text

    def chat(self, messages):
        return self._reply(str(len(messages)))

    def complete(self, prompt):
        return self._reply(str(len(prompt)))


@pytest.fixture(scope="module")
def interception():
    server = InterceptionServer()
    yield server, server.open(EchoInterceptor())
    server.shutdown()


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["/chat/completions", "/completions"]), bodies), min_size=1, max_size=4))
def test_the_interception_url_answers_any_request_with_a_status_and_a_reason(interception, requests):
    _, base_url = interception
    for path, body in requests:
        response = httpx.post(base_url + path, content=body, timeout=10)
        assert response.status_code in (200, 400), (response.status_code, response.text)
        if response.status_code == 400:
            assert "not a" in response.json()["error"]["message"]
    assert httpx.post(base_url + "/completions", json={"prompt": "abc"}, timeout=10).json()["choices"][0]["text"] == "3"


def test_the_interception_url_refuses_huge_bodies_and_drops_stalled_clients(monkeypatch):
    monkeypatch.setattr(interception_server, "READ_TIMEOUT_S", 1.0)
    server = InterceptionServer()
    base_url = server.open(EchoInterceptor())
    host, port, path = "127.0.0.1", server.port, base_url.split(str(server.port), 1)[1]
    try:
        def raw(request: bytes) -> bytes:
            """The whole answer: the server closes the connection after it."""
            with socket.create_connection((host, port), timeout=10) as s:
                s.sendall(request)
                answer = b""
                while chunk := s.recv(4096):
                    answer += chunk
                return answer
        huge = raw(f"POST {path}/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {10**12}\r\n\r\n{{}}".encode())
        assert huge.startswith(b"HTTP/1.0 413") and b"over 16777216 bytes" in huge  # answered without reading it
        negative = raw(f"POST {path}/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".encode())
        assert negative.startswith(b"HTTP/1.0 400")
        stalled = socket.create_connection((host, port), timeout=10)  # promises a body and never sends it
        stalled.sendall(f"POST {path}/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n".encode())
        ok = httpx.post(base_url + "/completions", json={"prompt": "abcd"}, timeout=5)  # others are served meanwhile
        assert ok.json()["choices"][0]["text"] == "4"
        started = time.monotonic()
        assert stalled.recv(4096) == b"" and time.monotonic() - started < 5  # disconnected after the read timeout
        stalled.close()
    finally:
        server.shutdown()
