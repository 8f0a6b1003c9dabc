"""Routing model calls over many replicas: sticky per rollout, never back to an older version, new
rollouts to the newest version and the least loaded replica, failover before any token, membership
from the fleet topic (joins, leaves, heartbeats)."""

from __future__ import annotations

import random

import pytest
from builders import replica

from rollwire.consumers.vllm_control import VllmError
from rollwire.core.bus import EventProducer, catalog_topics
from rollwire.producers.routing import FleetView, NoReplica, Router


class FakeReplica:
    """A replica's client: answers `generate` with its version's label, or fails."""

    def __init__(self, url: str) -> None:
        self.base_url, self.version, self.calls, self.fail = url, "0", 0, False
        self.closed = False

    def generate(self, token_ids, **options) -> dict:
        self.calls += 1
        if self.fail:
            raise VllmError(f"POST {self.base_url}/inference/v1/generate failed: connection refused")
        return {"choices": [{"token_ids": [5], "weight_versions": [{"version": self.version, "start": 0, "end": 1}]}]}

    def tokenize(self, text: str) -> list[int]:
        self.calls += 1
        return [1, 2]

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fleet():
    clients: dict[str, FakeReplica] = {}

    def make(url: str) -> FakeReplica:
        clients[url] = FakeReplica(url)
        return clients[url]

    view = FleetView(clock=Clock(), make_control=make)
    view.clients = clients  # type: ignore[attr-defined]
    return view


def serve(fleet: FleetView, name: str, version: int | None, state: str = "serving") -> FakeReplica:
    url = f"http://{name}:8000"
    fleet.apply(replica(replica_id=name, state=state, serving_version=version, url=url))
    client = fleet.clients[url]  # type: ignore[attr-defined]
    client.version = str(version or "default")
    return client


def test_new_rollouts_go_to_the_newest_version_then_the_least_loaded(fleet):
    old, b, c = serve(fleet, "a", 1), serve(fleet, "b", 2), serve(fleet, "c", 2)
    router = Router(fleet, wait_s=0, rng=random.Random(0))
    for _ in range(20):
        router.route().generate([1])
    assert old.calls == 0 and b.calls > 0 and c.calls > 0 and b.calls + c.calls == 20
    next(m for m in fleet.members() if m.replica_id == "b").in_flight = 3  # b is busy: new rollouts go to c
    before_b, before_c = b.calls, c.calls
    for _ in range(5):
        router.route().generate([1])
    assert (b.calls, c.calls) == (before_b, before_c + 5)


def test_a_rollout_stays_on_its_replica_even_when_a_newer_version_appears(fleet):
    first = serve(fleet, "a", 1)
    router = Router(fleet, wait_s=0)
    route = router.route()
    route.generate([1])
    newer = serve(fleet, "b", 2)
    for _ in range(3):
        route.tokenize("x")
        route.generate([1])
    assert first.calls == 7 and newer.calls == 0 and route.replica == "a" and route.min_version == 1
    assert router.route().generate([1]) and newer.calls == 1  # a new rollout takes the newest


def test_a_rollout_never_moves_to_an_older_version_than_its_earlier_turns(fleet):
    serve(fleet, "a", 3)
    older = serve(fleet, "b", 2)
    router = Router(fleet, wait_s=0)
    route = router.route()
    route.generate([1])  # sampled on version 3
    fleet.apply(replica(replica_id="a", state="stopped", serving_version=3, url="http://a:8000"))
    with pytest.raises(NoReplica, match="version 3 or newer"):
        route.generate([1])
    assert older.calls == 0
    newest = serve(fleet, "c", 4)
    route.generate([1])
    assert newest.calls == 1 and route.replica == "c" and route.min_version == 4


def test_a_failed_call_moves_to_another_eligible_replica_before_any_token(fleet):
    broken, healthy = serve(fleet, "a", 2), serve(fleet, "b", 2)
    broken.fail = True
    router = Router(fleet, wait_s=0, rng=random.Random(1))
    answers = [router.route().generate([1]) for _ in range(6)]
    assert all(a["choices"][0]["token_ids"] == [5] for a in answers)
    assert healthy.calls == 6
    assert all(m.in_flight == 0 for m in fleet.members())
    healthy.fail = True
    with pytest.raises(VllmError):
        router.route().generate([1])  # both fail: the rollout errors with the reason


def test_membership_follows_status_events_and_silence(fleet):
    serve(fleet, "a", 1)
    serve(fleet, "b", None)  # started, serving the base model: version 0
    assert {(m.replica_id, m.version) for m in fleet.members()} == {("a", 1), ("b", 0)}
    fleet.apply(replica(replica_id="a", state="reloading", serving_version=1, url="http://a:8000"))
    assert [m.replica_id for m in fleet.members()] == ["b"]  # reloading: no new calls
    fleet.clock.now += 31  # type: ignore[attr-defined]
    serve(fleet, "a", 2)  # a heartbeat/serving report keeps a; b fell silent
    assert [m.replica_id for m in fleet.members()] == ["a"]
    fleet.apply(replica(replica_id="a", state="failed", serving_version=2, url="http://a:8000", reason="vLLM exited"))
    assert fleet.members() == []
    assert fleet.clients["http://a:8000"].closed  # type: ignore[attr-defined]


def test_the_route_is_recorded_on_the_callers_span(fleet, spans):
    from rollwire.core import telemetry
    serve(fleet, "a", 5)
    router = Router(fleet, wait_s=0)
    route = router.route()
    with telemetry.tracer().start_as_current_span("inference generate"):
        route.generate([1])
    with telemetry.tracer().start_as_current_span("inference generate"):
        route.generate([1])
    first, second = [s.attributes for s in spans.get_finished_spans()]
    assert (first["rollwire.replica"], first["rollwire.route"], first["rollwire.replica_version"]) == ("a", "newest", 5)
    assert second["rollwire.route"] == "sticky"


def test_the_router_follows_the_fleet_topic(log, topics):
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="replica/r1")
    producer.send(topics.fleet, replica(replica_id="r1", state="serving", serving_version=3,
                                        url="http://127.0.0.1:9"), key="r1")
    producer.send(topics.fleet, replica(replica_id="r2", state="serving", serving_version=1,
                                        url="http://127.0.0.1:10"), key="r2")
    producer.send(topics.fleet, replica(replica_id="r2", state="stopped", serving_version=1,
                                        url="http://127.0.0.1:10"), key="r2")
    producer.flush()
    router = Router(FleetView()).follow(log, topics)
    try:
        assert [(m.replica_id, m.version, m.url) for m in router.fleet.members()] == [("r1", 3, "http://127.0.0.1:9")]
    finally:
        router.close()
        producer.close()


def test_a_call_to_the_only_replica_waits_while_it_restarts_instead_of_failing():
    """Nothing listens on the replica's port for two seconds (its server restarting); then it
    answers. The call waits for it: nothing was sampled, so nothing is lost."""
    import json
    import socket
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rollwire.consumers.vllm_control import VllmControl

    class Tokenize(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"tokens": [1, 2, 3]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    servers = []

    def come_back():
        time.sleep(2.0)
        servers.append(ThreadingHTTPServer(("127.0.0.1", port), Tokenize))
        servers[0].serve_forever()

    threading.Thread(target=come_back, daemon=True).start()
    router = Router.single(VllmControl(f"http://127.0.0.1:{port}", timeout_s=5))
    started = time.monotonic()
    try:
        assert router.route().tokenize("abc") == [1, 2, 3]
        assert 1.5 < time.monotonic() - started < 10
        router.wait_s = 0.5  # and a replica that stays away fails the call, with the reason
        servers[0].shutdown()
        servers[0].server_close()
        with pytest.raises(VllmError, match="NewConnectionError|refused"):
            router.route().tokenize("abd")
    finally:
        router.close()
